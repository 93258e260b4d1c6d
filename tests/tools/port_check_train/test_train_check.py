"""The port check through training takes what it can check: a factory mapping that does not
fit is named in one line before any training; the user's objects are never stepped; the float64
runs leave JAX's 64-bit setting as the process had it."""

import jax
import numpy as np
import optax
import pytest
import torch
from flax import linen

from mhsa.port_check.training.check import check_setup, check_training
from tests.tools.port_check_train import models


def _halving(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)


def _linen_pair():
    """A Linen (module, variables) pair, its variables written out (no initializer to compile)."""
    return linen.Dense(models.C), {"params": {"kernel": np.zeros((models.W, models.C), np.float32), "bias": np.zeros(models.C, np.float32)}}


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
        ("port", lambda side: side | {"loss": 3}, "the port factory's 'loss' must be a callable (output, *batch) -> scalar"),
        ("reference", lambda side: side | {"scheduler": object()}, "'scheduler' must be a torch LR scheduler stepped once per step (not object)"),
        (
            "reference",
            lambda side: side | {"scheduler": _halving(torch.optim.SGD(side["model"].parameters(), lr=0.1))},
            "must schedule its 'optimizer'",
        ),
        (
            "port",
            lambda side: side | {"model": _linen_pair()},
            "the training check takes an NNX port (a Linen (module, variables) pair",
        ),
    ],
)
def test_a_factory_mapping_that_does_not_fit_is_named_in_one_line(which, change, message):
    side = change(_torch() if which == "reference" else _flax())
    with pytest.raises(ValueError) as raised:
        check_setup(side, which)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_the_batches_steps_and_dtype_are_checked_before_any_training():
    port = _flax() | {"inputs": models.batches()[:3]}
    with pytest.raises(ValueError, match="the factories give 4 and 3 batches"):
        check_training(_torch(), port, 2)
    with pytest.raises(ValueError, match="steps must be a positive integer; got 0"):
        check_training(_torch(), _flax(), 0)
    with pytest.raises(ValueError, match="dtype must be one of float32, float64; got 'float16'"):
        check_training(_torch(), _flax(), 2, dtype="float16")


def test_a_torch_loss_that_is_not_a_scalar_is_named():
    with pytest.raises(ValueError, match="the torch factory's 'loss' must return a scalar tensor; got a tensor of shape \\(3,\\)"):
        check_training(_torch() | {"loss": lambda logits, x, labels: logits.sum(-1)}, _flax(), 1)


def test_the_float64_runs_leave_jaxs_64_bit_setting_as_the_process_had_it():
    # a float32 port trains with the process's setting: turned on for good by the float64 run,
    # optax's bias correction would then compute in float64 and hide what the user's run does
    jax.config.update("jax_enable_x64", False)
    try:
        report = check_training(_torch(), _flax(), 1, probes=False)
        assert jax.config.values["jax_enable_x64"] is False
        assert report.rows and all(row.port_error is not None for row in report.rows)
    finally:
        jax.config.update("jax_enable_x64", True)  # the tests' setting (tests/conftest.py)


def test_the_users_objects_are_never_stepped():
    reference, port = _torch(), _flax()
    before = {name: value.detach().clone() for name, value in reference["model"].state_dict().items()}
    kernel = np.asarray(port["model"].fc1.kernel[...]).copy()
    check_training(reference, port, 2, probes=False)
    assert all(torch.equal(before[name], value) for name, value in reference["model"].state_dict().items())
    assert not reference["optimizer"].state  # the user's optimizer took no step
    assert np.array_equal(np.asarray(port["model"].fc1.kernel[...]), kernel)  # the port kept its own weights
