"""numpy_ref as a trainer: its Adam against torch's and optax's, runs that move between numpy_ref
and every other trainer mid-way, its optimizer state in the exchange format, and glibc's malloc
keeping freed memory. What every trainer shares (the default run, trajectories, refusals):
tests/implementations/test_train.py."""

import sys

import numpy as np
import pytest

from mhsa import registry
from numpy_ref.adam import Adam
from shared import adam_state, weights
from shared.config import TrainConfig
from shared.tolerances import assert_close, tolerance
from tests.backends import SMALL, names
from tests.tiers import first_fast

OTHERS = [name for name in names("train") if name != "numpy"]
NUMPY = registry.get("numpy")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_adam_is_torchs_and_optax_formula(dtype):
    import jax.numpy as jnp
    import optax
    import torch

    rng = np.random.default_rng(0)
    start = rng.standard_normal((7, 5)).astype(dtype)
    grads = [rng.standard_normal((7, 5)).astype(dtype) for _ in range(30)]
    params = {"w": start.copy()}
    ours = Adam(params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8)
    theirs = torch.nn.Parameter(torch.from_numpy(start.copy()))
    torch_adam = torch.optim.Adam([theirs], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, fused=True)
    tx = optax.adam(1e-2, 0.9, 0.999, eps=1e-8)
    jax_params = jnp.asarray(start)
    jax_state = tx.init(jax_params)
    for g in grads:
        ours.step({"w": g})
        theirs.grad = torch.from_numpy(g.copy())
        torch_adam.step()
        updates, jax_state = tx.update(jnp.asarray(g), jax_state, jax_params)
        jax_params = optax.apply_updates(jax_params, updates)
    tol = 1e-12 if dtype == "float64" else 1e-6
    assert params["w"].dtype == dtype and ours.step_count == 30
    assert_close("Adam numpy vs torch", params["w"], theirs.detach().numpy(), tol)
    assert_close("Adam numpy vs optax", params["w"], np.asarray(jax_params), tol)
    assert_close("exp_avg_sq numpy vs torch", ours.exp_avg_sq["w"], torch_adam.state[theirs]["exp_avg_sq"].numpy(), tol)


def small_run(dtype="float64"):
    return TrainConfig(epochs=3, n_sequences=96, batch_size=32, dtype=dtype)


def stop_after_one_epoch(name, train_config):
    """A run of `name` cut after its first epoch: (weights file contents, AdamState)."""
    one = TrainConfig(**{**train_config.to_dict(), "epochs": 1, "betas": train_config.betas})
    history = registry.get(name).train.train(SMALL, one)
    arrays = registry.get(name).model.to_exchange(history.model)
    return arrays, registry.get(name).train.optimizer_to_exchange(history.optimizer, history.model, one)


@pytest.mark.parametrize("dtype", first_fast(["float32", "float64"]))
@pytest.mark.parametrize("first, then", [(first, then) for other in OTHERS for first, then in (("numpy", other), (other, "numpy"))])
def test_a_run_moves_between_backends_and_continues_exactly(first, then, dtype, tmp_path):
    train_config = small_run(dtype)
    whole = registry.get(then).train.train(SMALL, train_config)
    arrays, state = stop_after_one_epoch(first, train_config)
    assert state.step == 3 and state.epochs_done == 1
    weights.save(tmp_path / "w.safetensors", arrays, SMALL)  # through the files, as --save and --resume do
    adam_state.save(tmp_path / "w.adam.safetensors", state, SMALL)
    resumed = registry.get(then).train.train(
        SMALL, train_config, init=tmp_path / "w.safetensors", resume=adam_state.load(tmp_path / "w.adam.safetensors", SMALL)
    )
    assert resumed.first_step == 3 and len(resumed.losses) == 6
    assert_close(f"{dtype} {first} 1 epoch then {then} vs {then} throughout", resumed.losses, whole.losses[3:], tolerance("trajectory", dtype))


def test_optimizer_state_round_trips_through_the_exchange():
    history = NUMPY.train.train(SMALL, TrainConfig(epochs=1, n_sequences=64))
    state = NUMPY.train.optimizer_to_exchange(history.optimizer, history.model, history.train_config)
    fresh = Adam({name: value.copy() for name, value in history.model.params.items()})
    NUMPY.train.optimizer_from_exchange(state, fresh, history.model)
    assert fresh.step_count == history.optimizer.step_count == 2
    for name in history.model.params:
        np.testing.assert_array_equal(fresh.exp_avg[name], history.optimizer.exp_avg[name])
        np.testing.assert_array_equal(fresh.exp_avg_sq[name], history.optimizer.exp_avg_sq[name])
        assert state.exp_avg[name] is not history.optimizer.exp_avg[name]  # copies, not the live state


def test_native_init_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="numpy_ref has none"):
        NUMPY.train.train(SMALL, TrainConfig(epochs=1, n_sequences=32), init="native")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_glibc_takes_the_numpy_trainers_malloc_policy():
    from shared import malloc

    assert malloc.use("settled") is True
