"""The port check through training on planted differences: each classic optimizer difference,
planted one at a time, is named by the optimizer lint and the trainings part at the step and the
row where it first acts; the report keeps its step table short; a torch optimizer the lint does not
read is compared by trajectory only."""

import optax
import pytest
import torch
from flax import nnx

from mhsa.port_check.core.findings import OptimizerDifference, OptimizerNote
from mhsa.port_check.report.training import format_train_report
from mhsa.port_check.training.check import check_training
from tests.tiers import first_fast
from tests.tools.port_check_train import models


def _halving(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)


# (torch side, optax transformation, the lint's finding (or its setting), the first step and row that part)
PLANTED = {
    "weight-decay-default": (
        lambda: models.torch_side("adamw"),
        lambda: optax.adamw(1e-2),
        OptimizerDifference("adamw default", 0.01, 1e-4, extra=0.01),
        (1, "param", "ln.weight", ""),
    ),
    "l2-against-decoupled": (
        lambda: models.torch_side("adam", weight_decay=1e-2),
        lambda: optax.adamw(1e-2, weight_decay=1e-2),
        OptimizerDifference("l2 against decoupled", 0.01, 0.01, "Adam"),
        (1, "moment", "ln.weight", "exp_avg"),
    ),
    "b2": (
        lambda: models.torch_side("adam"),
        lambda: optax.adam(1e-2, b2=0.99),
        OptimizerDifference("b2", 0.999, 0.99),
        (1, "moment", "ln.weight", "exp_avg_sq"),
    ),
    "eps-against-eps-root": (
        lambda: models.torch_side("adam"),
        lambda: optax.adam(1e-2, eps=0.0, eps_root=1e-8),
        OptimizerDifference("eps_root", 1e-8, 1e-8, extra=0.0),
        (1, "param", None, ""),
    ),
    "schedule-off-by-one": (
        lambda: models.torch_side("adam", scheduler=_halving),
        lambda: optax.adam(lambda count: 1e-2 * 0.5 ** (count + 1)),
        "ahead",
        (1, "param", "ln.weight", ""),
    ),
    "dampening": (
        lambda: models.torch_side("sgd", lr=0.1, momentum=0.9, dampening=0.1),
        lambda: optax.sgd(0.1, momentum=0.9),
        OptimizerDifference("dampening", 0.1, 0.0, extra=0.9),
        (2, "moment", "ln.weight", "momentum_buffer"),
    ),
}


@pytest.mark.parametrize("planted", first_fast(list(PLANTED)))
def test_each_planted_optimizer_difference_is_named_with_the_step_and_row_where_it_acts(planted):
    torch_side, tx, found, (step, kind, name, moment) = PLANTED[planted]
    report = check_training(torch_side(), models.flax_side(tx()), 4)
    text = format_train_report(report)
    assert report.lint == [found] or [finding.setting for finding in report.lint] == [found], text  # nothing made up beside it
    first = report.first_failure
    assert first is not None and (first.step, first.kind, first.moment) == (step, kind, moment), text
    assert name is None or first.name == name, text
    # at that step the forward pass and every gradient agree: the update parts
    assert report.forward is not None and report.forward.first_failure is None, text
    assert "the forward pass and every gradient agree; the update parts first" in text
    assert f"FAIL: the trainings part at step {step}, at {first.label}" in text


def test_the_report_keeps_the_step_table_to_the_steps_around_the_first_failure():
    report = check_training(models.torch_side("adamw"), models.flax_side(optax.adamw(1e-2)), 8, probes=False)
    table = [line for line in format_train_report(report).splitlines() if line.startswith("| ") and line[2:6].strip().isdigit()]
    assert [int(line[2:6]) for line in table] == [1, 2, 3]
    assert "steps 4-8: 5 failing" in format_train_report(report)


def test_a_torch_optimizer_the_lint_does_not_read_is_compared_by_trajectory_only():
    torch.manual_seed(0)
    model = models.TorchMLP()
    reference = {
        "model": model,
        "optimizer": torch.optim.RMSprop(model.parameters(), lr=1e-2),
        "loss": models.torch_loss,
        "inputs": models.batches(),
        "model_inputs": 1,
    }
    report = check_training(reference, models.flax_side(optax.rmsprop(1e-2, decay=0.99, eps=1e-8)), 3)
    assert report.lint_notes == [OptimizerNote("unread", "RMSprop")]
    assert report.rows  # still compared step by step
    assert "note: torch RMSprop is not one the lint reads" in format_train_report(report)


class TorchBatchNormMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(models.D, models.W)
        self.bn = torch.nn.BatchNorm1d(models.W)  # train mode: it updates its running statistics

    def forward(self, x):
        return self.bn(self.fc(x))


class FlaxBatchNormMLP(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.fc = nnx.Linear(models.D, models.W, rngs=rngs)
        self.bn = nnx.BatchNorm(models.W, momentum=0.9, epsilon=1e-5, use_running_average=False, rngs=rngs)  # torch's momentum 0.1

    def __call__(self, x):
        return self.bn(self.fc(x))


def test_batchnorm_statistics_train_with_the_model_and_the_unbiased_running_variance_is_named():
    torch.manual_seed(0)
    model = TorchBatchNormMLP()

    def mean_square(out, x, labels):
        return (out**2).mean()

    reference = {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "loss": mean_square,
        "inputs": models.batches(),
        "model_inputs": 1,
    }
    port = {
        "model": FlaxBatchNormMLP(rngs=nnx.Rngs(0)),
        "optimizer": optax.sgd(0.1),
        "loss": mean_square,
        "inputs": models.batches(),
        "model_inputs": 1,
    }
    report = check_training(reference, port, 2, probes=False)
    text = format_train_report(report)
    first = report.first_failure
    assert first is not None and (first.step, first.label) == (1, "bn.running_var"), text
    assert [row.passed for row in report.rows if row.step == 1 and row.name == "bn.running_mean"] == [True]  # the mean agrees
    assert "a statistic the forward pass keeps in train mode parts first, at 'bn.running_var'" in text
    assert "torch's BatchNorm keeps the unbiased batch variance" in text
