"""jax_impl/train.py and its scanned steps (jax_impl/compiled.py): a run committed to the device
train() was given feeds every model function as a plain model does, the run queues its next steps
before it reads the last ones' losses without changing a loss or the order of on_step, and the
default run compiled with XLA's own settings, as a user's is, agrees with every trainer.

No GPU here: the committed-device path is the one a GPU run takes (the arrays are committed to
the device train() was given), exercised on the CPU device; "cuda" is refused in
test_device.py."""

import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from flax import nnx  # noqa: E402

from jax_impl import compiled, generate, model, train  # noqa: E402
from shared import training  # noqa: E402
from shared.config import TrainConfig  # noqa: E402
from shared.history import History  # noqa: E402
from shared.tolerances import assert_close, tolerance  # noqa: E402
from tests.backends import SMALL, names  # noqa: E402
from tests.machinery.xla_flags import without_quick_compile  # noqa: E402
from tests.paths import ROOT  # noqa: E402

CONFIG = TrainConfig(epochs=2, n_sequences=100, batch_size=6)  # 17 steps per epoch: two chunks of 16, one of 1, and a last batch of 4


@pytest.fixture(scope="module")
def committed():
    """A run on device "cpu" (committed to the CPU device, as a "cuda" run is to the GPU) and the
    same weights in a model built from the exchange arrays (uncommitted, JAX's default device)."""
    history = train.train(SMALL, CONFIG, device="cpu")
    plain = model.from_exchange(model.to_exchange(history.model), SMALL)
    return history, plain


@pytest.mark.slow  # a training run (the committed fixture)
def test_the_run_lives_on_the_device_it_was_given(committed):
    history, _ = committed
    cpu = jax.devices("cpu")[0]
    for leaf in jax.tree.leaves(nnx.state((history.model, history.optimizer))):
        assert leaf.devices() == {cpu} and leaf.committed, leaf


@pytest.mark.slow  # a training run (the committed fixture)
def test_a_committed_model_feeds_every_model_function_as_a_plain_one(committed):
    history, plain = committed
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, SMALL.vocab_size, (3, SMALL.max_len))
    x = rng.standard_normal((2, 5, SMALL.d_model)).astype(np.float32)
    mask = rng.random((3, SMALL.n_heads, SMALL.max_len, SMALL.max_len)) < 0.7
    for name, run in {
        "predict": lambda m: model.predict(m, tokens, mask=mask, return_weights=True),
        "attend": lambda m: model.attend(m, x, return_weights=True),
        "generate with a cache": lambda m: generate.generate(m, tokens[:, :3], 3),
        "to_exchange": model.to_exchange,
    }.items():
        got, expected = jax.tree.leaves(run(history.model)), jax.tree.leaves(run(plain))
        assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected)), name
    saved = train.optimizer_to_exchange(history.optimizer, history.model, CONFIG)
    assert saved.step == 2 * CONFIG.steps_per_epoch
    assert all(np.isfinite(value).all() and value.any() for value in saved.exp_avg_sq.values())


def test_queued_runs_give_the_losses_of_one_run_at_a_time_in_step_order(monkeypatch):
    """train() queues the next run of steps before it reads the losses of the previous one;
    the losses equal train_steps's, run by run, and on_step hears every step in order, each run
    as soon as the next one is queued, not after the whole epoch (progress as it happens)."""
    arrays = training.initial_weights("shared", SMALL, CONFIG)
    m = model.from_exchange(arrays, SMALL)
    graphdef, state = nnx.split((m, compiled.zeros_optimizer(m, CONFIG)))
    expected = []
    for batches in training.epochs(SMALL, CONFIG):
        for chunk in training.chunks(batches):
            state, losses = train.train_steps(graphdef, state, chunk)
            expected.extend(losses.tolist())

    queued, heard = [], []
    run_steps = compiled.run_steps

    def counting(step, graphdef, state, batches):
        queued.append(len(batches))
        return run_steps(step, graphdef, state, batches)

    def on_step(step, loss):
        heard.append((step, len(queued)))

    monkeypatch.setattr(compiled, "run_steps", counting)
    history = train.train(SMALL, CONFIG, on_step=on_step)
    assert history.losses == expected
    assert [step for step, _ in heard] == list(range(len(expected)))
    ends = np.cumsum(queued)  # the step after each run
    for step, runs_queued in heard:
        run = int(np.searchsorted(ends, step, side="right"))  # the run this step belongs to (from 0)
        # one run ahead: the next run is queued before this one's losses are read, and no more
        assert runs_queued == min(run + 2, len(queued)), f"step {step} of run {run} was reported with {runs_queued} runs queued"


@pytest.mark.slow
def test_the_default_run_compiled_with_xlas_own_settings_agrees_with_every_trainer(default_run, tmp_path):
    """The tests compile JAX programs with XLA's quickest settings (tests/machinery/xla_flags.py); a user's
    run compiles with XLA's defaults. The default run, trained here as a user trains it (its own
    process, XLA's settings), holds every trainer's default run at the trajectory tolerance."""
    root = ROOT  # the checkout whose jax_impl is tested
    env = {**os.environ, "PYTHONPATH": str(root), "XLA_FLAGS": without_quick_compile(os.environ.get("XLA_FLAGS", ""))}
    command = [sys.executable, "-m", "jax_impl.train", "--quiet", "--history", "users.json"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    users = History.load(tmp_path / "users.json").losses
    assert len(users) == 192
    for name in names("train"):
        theirs = default_run(name, "float32").losses
        assert_close(f"float32 loss trajectory jax (XLA's own settings) vs {name}", users, theirs, tolerance("trajectory", "float32"))
