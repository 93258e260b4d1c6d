"""numpy_ref as a trainer: Adam against torch's and optax's, the default 3-epoch trajectory
against every other trainer at every step, runs that move between backends mid-way, and the
command line."""

import json
import sys

import numpy as np
import pytest

from mhsa import registry
from numpy_ref.adam import Adam
from shared import adam_state, weights
from shared.config import TrainConfig
from shared.history import History
from shared.tolerances import assert_close, tolerance
from shared.training import NonFiniteLossError
from tests.backends import SMALL, names
from tests.commands import run_cli

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


def test_the_default_run_learns_the_copy_task(default_run):
    history = default_run("numpy", "float32")
    assert history.backend == "numpy" and len(history.losses) == 3 * 64
    assert abs(history.losses[0] - np.log(64)) < 0.1 and history.epoch_losses[-1] < 0.1
    assert all(value.dtype == np.float32 for value in history.model.params.values())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("other", OTHERS)
def test_default_trajectory_matches_every_other_trainer_at_every_step(default_run, other, dtype):
    ours, theirs = default_run("numpy", dtype), default_run(other, dtype)
    assert len(ours.losses) == len(theirs.losses) == 192
    assert_close(f"{dtype} loss trajectory numpy vs {other}", ours.losses, theirs.losses, tolerance("trajectory", dtype))
    if dtype == "float64":
        final = registry.get(other).model.to_exchange(theirs.model)
        for name, value in NUMPY.model.to_exchange(ours.model).items():
            assert_close(f"final {name} numpy vs {other}", value, final[name], 1e-9)


def small_run(dtype="float64"):
    return TrainConfig(epochs=3, n_sequences=96, batch_size=32, dtype=dtype)


def stop_after_one_epoch(name, train_config):
    """A run of `name` cut after its first epoch: (weights file contents, AdamState)."""
    one = TrainConfig(**{**train_config.to_dict(), "epochs": 1, "betas": train_config.betas})
    history = registry.get(name).train.train(SMALL, one)
    arrays = registry.get(name).model.to_exchange(history.model)
    return arrays, registry.get(name).train.optimizer_to_exchange(history.optimizer, history.model, one)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
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


def test_a_smaller_last_batch_is_trained_too():
    steps = []
    history = NUMPY.train.train(SMALL, TrainConfig(epochs=2, n_sequences=70, batch_size=32), on_step=lambda step, loss: steps.append(step))
    assert steps == list(range(6)) and len(history.losses) == 6  # 32 + 32 + 6 per epoch


def test_a_non_finite_loss_stops_training_and_names_the_step():
    with pytest.raises(NonFiniteLossError, match=r"loss became non-finite at step 1 \(epoch 1\): (nan|inf)"):
        NUMPY.train.train(SMALL, TrainConfig(epochs=2, n_sequences=256, lr=1e30))


def test_native_init_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="numpy_ref has none"):
        NUMPY.train.train(SMALL, TrainConfig(epochs=1, n_sequences=32), init="native")


def test_cli_trains_saves_and_another_backend_resumes(tmp_path):
    first = run_cli(
        NUMPY.name,
        "--epochs",
        "1",
        "--n-sequences",
        "96",
        "--seq-len",
        "6",
        "--vocab-size",
        "9",
        "--heatmap-head",
        "2",
        "--save",
        "w.safetensors",
        "--history",
        "a.json",
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr
    out = first.stdout
    assert out.startswith("backend numpy\nmodel  vocab_size=9 d_model=32 n_heads=4 (d_head=8) max_len=6")
    assert "epoch 1/1  mean loss " in out and "final loss " in out and "numpy · head 2 of 4" in out
    assert "saved weights to w.safetensors (Adam's state to w.adam.safetensors)" in out and first.stderr == ""
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["backend"] == "numpy" and len(data["losses"]) == 3
    other = OTHERS[0]
    second = run_cli(other, "--epochs", "2", "--n-sequences", "96", "--resume", "w.safetensors", "--history", "b.json", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "resume after epoch 1 (step 3) of a saved run" in second.stdout
    resumed = History.load(tmp_path / "b.json")
    assert resumed.first_step == 3 and len(resumed.losses) == 3


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_glibc_is_told_to_keep_freed_memory():
    assert NUMPY.train.keep_freed_memory() is True
