"""The port check through training: matched optimizer pairs agree at every step in float32 and
float64; each classic difference, planted one at a time, is named by the optimizer lint and the
trainings part at the step and the row where it first acts; a LayerNorm eps the lints cannot
read parts at its forward row in float32, where a fixed tolerance would let it pass."""

import numpy as np
import optax
import pytest
import torch

from mhsa.port_check.train_check import check_setup, check_training
from mhsa.port_check.train_report import format_train_report
from shared.tolerances import tolerance
from tests.tools.port_check_train import models

PAIRS = {
    "adam": (lambda: models.torch_side("adam"), lambda: optax.adam(1e-2)),
    "adamw": (lambda: models.torch_side("adamw"), lambda: optax.adamw(1e-2, weight_decay=1e-2)),
    "sgd-momentum": (lambda: models.torch_side("sgd", lr=0.1, momentum=0.9), lambda: optax.sgd(0.1, momentum=0.9)),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("pair", list(PAIRS))
def test_matched_optimizer_pairs_agree_at_every_step_loss_gradient_moment_and_parameter(pair, dtype):
    torch_side, tx = PAIRS[pair]
    report = check_training(torch_side(), models.flax_side(tx()), 20, dtype=dtype)
    assert report.passed, format_train_report(report)
    steps = {row.step for row in report.rows}
    assert steps == set(range(1, 21))
    step1 = [row for row in report.rows if row.step == 1]
    names = ["ln.weight", "ln.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert [row.name for row in step1 if row.kind == "grad"] == names
    assert [row.name for row in step1 if row.kind == "param"] == names
    moments = {"sgd-momentum": ["momentum_buffer"]}.get(pair, ["exp_avg", "exp_avg_sq"])
    assert [(row.name, row.moment) for row in step1 if row.kind == "moment"] == [(name, moment) for name in names for moment in moments]
    assert any(row.abs_diff > 0 for row in report.rows)  # two frameworks, not one twice
    if dtype == "float32":  # derived: every row says the reference's own error
        assert all(row.ref_err is not None and row.tol >= 4 * row.ref_err for row in report.rows)
    else:
        assert all(row.ref_err is None and row.tol == tolerance("trajectory", "float64") for row in report.rows)
    assert f"PASS: all 20 steps agree: the loss, 6 gradients, {len(moments) * 6} moments and 6 parameters" in format_train_report(report)


def _halving(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)


# (torch side, optax transformation, the lint's words, the first step and row that part)
PLANTED = {
    "weight-decay-default": (
        lambda: models.torch_side("adamw"),
        lambda: optax.adamw(1e-2),
        "optax.adamw's default weight_decay is 0.0001, torch AdamW's 0.01",
        (1, "param", "ln.weight", ""),
    ),
    "l2-against-decoupled": (
        lambda: models.torch_side("adam", weight_decay=1e-2),
        lambda: optax.adamw(1e-2, weight_decay=1e-2),
        "torch Adam(weight_decay=0.01) adds 0.01 * p to the gradient (L2: it goes through the moments); optax decays the weights directly",
        (1, "moment", "ln.weight", "exp_avg"),
    ),
    "b2": (
        lambda: models.torch_side("adam"),
        lambda: optax.adam(1e-2, b2=0.99),
        "b2: torch betas[1]=0.999, optax b2=0.99",
        (1, "moment", "ln.weight", "exp_avg_sq"),
    ),
    "eps-against-eps-root": (
        lambda: models.torch_side("adam"),
        lambda: optax.adam(1e-2, eps=0.0, eps_root=1e-8),
        "eps: torch adds eps=1e-08 outside the square root; optax adds eps_root=1e-08 inside it, and eps=0 outside",
        (1, "param", None, ""),
    ),
    "schedule-off-by-one": (
        lambda: models.torch_side("adam", scheduler=_halving),
        lambda: optax.adam(lambda count: 1e-2 * 0.5 ** (count + 1)),
        "learning-rate schedule one step ahead in optax: its step t has torch's step t+1 rate",
        (1, "param", "ln.weight", ""),
    ),
    "dampening": (
        lambda: models.torch_side("sgd", lr=0.1, momentum=0.9, dampening=0.1),
        lambda: optax.sgd(0.1, momentum=0.9),
        "dampening: torch dampening=0.1 scales every gradient after the first by 0.9 in the momentum buffer; optax's trace has no dampening",
        (2, "moment", "ln.weight", "momentum_buffer"),
    ),
}


@pytest.mark.parametrize("planted", list(PLANTED))
def test_each_planted_optimizer_difference_is_named_with_the_step_and_row_where_it_acts(planted):
    torch_side, tx, words, (step, kind, name, moment) = PLANTED[planted]
    report = check_training(torch_side(), models.flax_side(tx()), 4)
    text = format_train_report(report)
    assert [finding for finding in report.lint if words in finding], text
    assert len(report.lint) == 1, report.lint  # that difference, and nothing made up beside it
    first = report.first_failure
    assert first is not None and (first.step, first.kind, first.moment) == (step, kind, moment), text
    assert name is None or first.name == name, text
    # at that step the forward pass and every gradient agree: the update parts
    assert report.forward is not None and report.forward.first_failure is None, text
    assert "the forward pass and every gradient agree; the update parts first" in text
    assert f"FAIL: the trainings part at step {step}, at {first.label}" in text


def test_a_layernorm_eps_of_1e6_parts_at_its_forward_row_in_float32_where_a_fixed_tolerance_passes_it():
    # issue 31's example: a hand-written LayerNorm with eps 1e-6 where torch's is 1e-5, inputs of
    # standard deviation 3; the lints cannot read a hand-written eps
    report = check_training(models.torch_side("adam"), models.flax_side(optax.adam(1e-2), eps=1e-6), 6)
    text = format_train_report(report)
    assert not report.config_lint and not report.lint, text
    assert report.first_failure is not None and report.first_failure.step == 1, text
    ln = report.forward.first_failure
    assert ln is not None and ln.name == "ln", text
    reference_error = float(ln.note.split("reference's own error ")[1])
    assert 1e-7 < reference_error < 5e-7  # float32 rounding at the norm's output
    assert 10 * reference_error < ln.abs_diff < tolerance("stage", "float32")  # ten times the rounding, yet under the fixed 1e-5
    assert "the forward pass parts first: at 'ln'" in text
    faithful = check_training(models.torch_side("adam"), models.flax_side(optax.adam(1e-2), eps=1e-5), 6)
    assert faithful.passed, format_train_report(faithful)


def test_the_report_keeps_the_step_table_to_the_steps_around_the_first_failure():
    report = check_training(models.torch_side("adamw"), models.flax_side(optax.adamw(1e-2)), 8)
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
    assert report.lint_notes == ["torch RMSprop is not one the lint reads (SGD, Adam, AdamW): the optimizers are compared by trajectory only"]
    assert report.rows  # still compared step by step
    assert "note: torch RMSprop is not one the lint reads" in format_train_report(report)


def _torch():
    return models.torch_side("adam")


def _flax():
    return models.flax_side(optax.adam(1e-2))


@pytest.mark.parametrize(
    ("which", "change", "message"),
    [
        (
            "reference",
            lambda side: side["model"],
            "the reference factory returned TorchMLP; with --train it must return a mapping with the keys model, optimizer, loss, inputs",
        ),
        ("reference", lambda side: {k: v for k, v in side.items() if k != "loss"}, "the reference factory's mapping lacks loss"),
        ("port", lambda side: side | {"schedular": None}, "the port factory's mapping has unknown key(s) schedular"),
        (
            "reference",
            lambda side: side | {"optimizer": optax.adam(1e-2)},
            "the reference factory's 'optimizer' must be a torch.optim.Optimizer; got GradientTransformationExtraArgs",
        ),
        (
            "port",
            lambda side: side | {"model": models.TorchMLP()},
            "the port factory's model is a torch model; the training check takes a torch reference and a Flax NNX port",
        ),
        (
            "reference",
            lambda side: side | {"optimizer": torch.optim.SGD(models.TorchMLP().parameters(), lr=0.1)},
            "must be built over its model's parameters",
        ),
        ("reference", lambda side: side | {"clip": -1.0}, "'clip' must be a positive number"),
        ("port", lambda side: side | {"clip": 1.0}, "the Flax factory's 'clip' belongs inside its optax transformation"),
        ("port", lambda side: side | {"inputs": []}, "the port factory's 'inputs' must be a non-empty list of batches"),
        ("port", lambda side: side | {"inputs": [("text",)]}, "the port factory's batch 0 must be a tuple of numeric arrays"),
        ("reference", lambda side: side | {"model_inputs": 3}, "'model_inputs' must be an integer from 1 to the arrays in a batch; got 3"),
    ],
)
def test_a_factory_mapping_that_does_not_fit_is_named_in_one_line(which, change, message):
    side = change(_torch() if which == "reference" else _flax())
    with pytest.raises(ValueError) as raised:
        check_setup(side, which)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_the_batches_of_the_two_factories_pair_one_to_one():
    port = _flax() | {"inputs": models.batches()[:3]}
    with pytest.raises(ValueError, match="the factories give 4 and 3 batches"):
        check_training(_torch(), port, 2)


def test_the_users_objects_are_never_stepped():
    reference, port = _torch(), _flax()
    before = {name: value.detach().clone() for name, value in reference["model"].state_dict().items()}
    kernel = np.asarray(port["model"].fc1.kernel[...]).copy()
    check_training(reference, port, 2)
    assert all(torch.equal(before[name], value) for name, value in reference["model"].state_dict().items())
    assert not reference["optimizer"].state  # the user's optimizer took no step
    assert np.array_equal(np.asarray(port["model"].fc1.kernel[...]), kernel)  # the port kept its own weights
