"""The port check through training on matched pairs: Adam, AdamW and SGD with momentum, ported
faithfully, agree at every step's loss, gradients, moments and parameters for 20 steps in float32
(held to tolerances derived from both sides' own float32 errors) and in float64; a LayerNorm eps
the lints cannot read parts at its forward row in float32, where a fixed tolerance would pass it."""

import optax
import pytest
import torch

from mhsa.port_check.core.findings import LintDifference
from mhsa.port_check.report.training import format_train_report
from mhsa.port_check.training.check import check_training
from shared.tolerances import tolerance
from tests.tiers import first_fast
from tests.tools.port_check_train import models

PAIRS = {
    "adam": (lambda: models.torch_side("adam"), lambda: optax.adam(1e-2)),
    "adamw": (lambda: models.torch_side("adamw"), lambda: optax.adamw(1e-2, weight_decay=1e-2)),
    "sgd-momentum": (lambda: models.torch_side("sgd", lr=0.1, momentum=0.9), lambda: optax.sgd(0.1, momentum=0.9)),
}


@pytest.mark.parametrize("dtype", first_fast(["float32", "float64"]))
@pytest.mark.parametrize("pair", first_fast(list(PAIRS)))
def test_matched_optimizer_pairs_agree_at_every_step_loss_gradient_moment_and_parameter(pair, dtype):
    torch_side, tx = PAIRS[pair]
    # the optimizer lint, the same in both dtypes, runs with the float32 pair
    report = check_training(torch_side(), models.flax_side(tx()), 20, dtype=dtype, probes=dtype == "float32")
    assert report.passed, format_train_report(report)
    step1 = [row for row in report.rows if row.step == 1]
    assert [summary.step for summary in report.summaries] == list(range(1, 21))
    assert all(summary.compared == len(step1) and summary.failing == 0 for summary in report.summaries)
    names = ["ln.weight", "ln.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert [row.name for row in step1 if row.kind == "grad"] == names
    assert [row.name for row in step1 if row.kind == "param"] == names
    moments = {"sgd-momentum": ["momentum_buffer"]}.get(pair, ["exp_avg", "exp_avg_sq"])
    assert [(row.name, row.moment) for row in step1 if row.kind == "moment"] == [(name, moment) for name in names for moment in moments]
    closest = step1 + [summary.worst for summary in report.summaries]  # each step's row nearest its tolerance
    assert any(row.abs_diff > 0 for row in closest)  # two frameworks, not one twice
    if dtype == "float32":  # derived: every row says the reference's own error
        assert all(row.reference_error is not None and row.tol >= 4 * row.reference_error for row in closest)
    else:
        assert all(row.reference_error is None and row.tol == tolerance("trajectory", "float64") for row in closest)
    assert f"PASS: all 20 steps agree: the loss, 6 gradients, {len(moments) * 6} moments and 6 parameters" in format_train_report(report)


def test_a_layernorm_eps_of_1e6_parts_at_its_forward_row_in_float32_where_a_fixed_tolerance_passes_it():
    # the example: a hand-written LayerNorm with eps 1e-6 where torch's is 1e-5, inputs of
    # standard deviation 3; the configuration lint reads the hand-written module's eps, and the
    # numbers name it on their own: the forward row at the norm fails
    report = check_training(models.torch_side("adam"), models.flax_side(optax.adam(1e-2), eps=1e-6), 2, probes=False)
    text = format_train_report(report)
    assert report.config_lint == [LintDifference("ln", "LayerNorm", "eps", 1e-5, 1e-6)], text
    assert "  ln: LayerNorm eps 1e-05 in torch, 1e-06 in jax (torch's default is 1e-5, Flax's 1e-6)" in text.splitlines()  # its sentence
    assert not report.lint, text
    assert report.first_failure is not None and report.first_failure.step == 1, text
    ln = report.forward.first_failure
    assert ln is not None and ln.name == "ln", text
    reference_error = ln.reference_error
    assert reference_error is not None and 1e-7 < reference_error < 5e-7  # float32 rounding at the norm's output
    assert 10 * reference_error < ln.abs_diff < tolerance("stage", "float32")  # ten times the rounding, yet under the fixed 1e-5
    assert "the forward pass parts first: at 'ln'" in text
    # the faithful LayerNorm (eps 1e-5) is the matched pairs' port: it passes 20 steps there


class HandRolledAdam:
    """An optimizer that is no torch.optim.Optimizer: torch.optim.Adam's step behind another class."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        self.inner = torch.optim.Adam(params, lr=lr, betas=betas, eps=eps)
        self.param_groups, self.state = self.inner.param_groups, self.inner.state

    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none)

    def step(self):
        self.inner.step()


class SaysItIsAdam(HandRolledAdam):
    behaves_as = torch.optim.Adam


def test_a_hand_rolled_optimizer_is_read_as_the_torch_class_it_says_it_steps_as_and_refused_without_it():
    setup = models.torch_side("adam", lr=1e-2)
    setup["optimizer"] = SaysItIsAdam(setup["model"].parameters(), lr=1e-2)
    report = check_training(setup, models.flax_side(optax.adam(1e-2)), 3, probes=True)
    assert report.passed and not report.lint and not report.lint_notes, format_train_report(report)
    setup["optimizer"] = HandRolledAdam(setup["model"].parameters(), lr=1e-2)
    with pytest.raises(ValueError, match="'optimizer' must be a torch.optim.Optimizer; got HandRolledAdam"):
        check_training(setup, models.flax_side(optax.adam(1e-2)), 3)
