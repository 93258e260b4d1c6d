"""Train TinyLM on the copy task with JAX, Flax NNX and optax: train_step, train_epoch, train (loss_fn is in model.py).

Run it: `python -m jax_impl.train --help`.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command line belongs to the tools layer: parse flags before importing jax
    import sys

    try:  # Ctrl-C while the command line is still being imported: one line and 130, as at any later moment
        from mhsa.train_cli import main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(main("jax"))

import functools
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jax_impl.device import resolve
from jax_impl.model import TinyLM, assign_exchange, from_exchange, grads_to_exchange, loss_fn
from shared import training
from shared.adam_state import AdamState
from shared.config import ModelConfig, TrainConfig
from shared.history import History


def train_step(graphdef: nnx.GraphDef, state: nnx.State, x: jax.Array, y: jax.Array) -> tuple[nnx.State, jax.Array]:
    """One Adam step on split state; returns (new state, the loss before the update).

    Pure, so jax.jit compiles it and jax.lax.scan repeats it; merge and split cost
    nothing at run time, they happen once while tracing.
    """
    model, optimizer = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)  # grads of nnx.Param only
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), loss


@functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
def scan_steps(graphdef: nnx.GraphDef, state: nnx.State, xs: jax.Array, ys: jax.Array) -> tuple[nnx.State, jax.Array]:
    """train_step over stacked batches xs, ys (steps, B, T) in one compiled loop."""
    return jax.lax.scan(lambda state, batch: train_step(graphdef, state, *batch), state, (xs, ys))


def train_epoch(graphdef: nnx.GraphDef, state: nnx.State, batches: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[nnx.State, np.ndarray]:
    """Every step of `batches` (an epoch, or a run of its steps), compiled; returns (new state, per-step losses as NumPy).

    Full batches run under one jax.lax.scan; a smaller last batch (when batch_size does
    not divide n_sequences) runs as one more scanned step of its own shape.
    """
    state, losses = _dispatch(graphdef, state, batches)
    return state, np.asarray(losses)


def _dispatch(graphdef: nnx.GraphDef, state: nnx.State, batches: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[nnx.State, jax.Array]:
    """train_epoch without waiting: returns as soon as the steps are queued, with the per-step
    losses (steps,) still being computed, so that the host can queue the next run meanwhile."""
    size = len(batches[0][0])
    full = [batch for batch in batches if len(batch[0]) == size]
    xs, ys = np.stack([x for x, _ in full]), np.stack([y for _, y in full])  # steps x B x T, one scan
    state, losses = scan_steps(graphdef, state, xs, ys)
    for x, y in batches[len(full) :]:
        state, loss = scan_steps(graphdef, state, x[None], y[None])
        losses = jnp.concatenate([losses, loss])
    return state, losses


def train(
    model_config: ModelConfig,
    train_config: TrainConfig,
    init: str = "shared",
    on_step: Callable[[int, float], object] | None = None,
    resume: AdamState | None = None,
    device: str = "cpu",
) -> History:
    """Train from `init` ("shared", "native" or a weights file); returns the History with the
    model and optimizer.

    resume: an AdamState saved with those weights (by either backend): the run continues
    where it stopped, with the same moments, step count and remaining batches.
    on_step(step, loss) is called for every step once its run of steps has finished.
    device: "cpu" or "cuda" (JAX's first CUDA device); the returned model and optimizer live
    there, and everything that takes a model (predict, attend, generate, to_exchange) runs there.
    Data parallel is jax_impl.parallel.train, which runs this file's scan_steps over a mesh.
    Raises ValueError before any work for a device JAX does not have, and
    training.NonFiniteLossError naming the first step whose loss was NaN or infinite.
    """
    target = resolve(training.check_device(device))
    started = time.perf_counter()
    start_epoch = training.first_epoch(resume, train_config)
    if train_config.dtype == "float64":
        jax.config.update("jax_enable_x64", True)  # off by default: float64 would silently become float32

    # 1. model: the shared NumPy init, identical for every backend, unless init says otherwise
    arrays = training.initial_weights(init, model_config, train_config)
    # (nnx.Rngs only for the framework's own init: making its key compiles a program)
    model = (
        TinyLM(model_config, dtype=train_config.dtype, rngs=nnx.Rngs(train_config.seed)) if arrays is None else from_exchange(arrays, model_config)
    )

    # 2. optimizer: Adam with TrainConfig's lr, betas and eps
    # (optax is pure functions; nnx.Optimizer keeps the moments of nnx.Param only, the mask is not one)
    optimizer = new_optimizer(model, train_config)
    if resume is not None:
        optimizer_from_exchange(resume, optimizer, model)
    graphdef, state = nnx.split((model, optimizer))
    state = jax.device_put(state, target)  # committed: every later computation on these arrays runs there

    # 3. epochs: the same batches as every other backend
    losses: list[float] = []
    running = None  # the run of steps queued before the current one, whose losses are read next
    for batches in training.epochs(model_config, train_config, start=start_epoch):
        for chunk in training.chunks(batches):  # a few steps at a time: progress as it happens
            state, chunk_losses = _dispatch(graphdef, state, chunk)
            if running is not None:  # the host waits for the previous run while this one is queued
                training.finish_epoch(losses, np.asarray(running), train_config, start_epoch, on_step)
            running = chunk_losses
    if running is not None:
        training.finish_epoch(losses, np.asarray(running), train_config, start_epoch, on_step)
    model, optimizer = nnx.merge(graphdef, state)
    return training.history("jax", model_config, train_config, losses, started, model, optimizer, start_epoch)


@functools.cache
def _transform(lr: float, betas: tuple[float, float], eps: float) -> optax.GradientTransformation:
    """optax.adam(lr, *betas, eps=eps), one object per setting: the transform is part of the graph
    definition that scan_steps is compiled for, so a new one for every run would compile the
    training step again for a second run of the same settings in one process."""
    return optax.adam(lr, *betas, eps=eps)


def new_optimizer(model: TinyLM, train_config: TrainConfig) -> nnx.Optimizer:
    """nnx.Optimizer(model, optax.adam(lr, *betas, eps=eps), wrt=nnx.Param), built without a
    compilation: Adam starts from zeros (its step count and both moments), so nnx.eval_shape gives
    the structure and NumPy the zeros. Eagerly, optax's init compiles a zeros_like per parameter
    shape, a share of the start-up; tests/implementations/test_jax_speed_paths.py holds the two equal."""
    tx = _transform(train_config.lr, train_config.betas, train_config.eps)
    graphdef, state = nnx.split(nnx.eval_shape(lambda model: nnx.Optimizer(model, tx, wrt=nnx.Param), model))
    return nnx.merge(graphdef, jax.tree.map(lambda leaf: jax.device_put(np.zeros(leaf.shape, leaf.dtype)), state))


def optimizer_to_exchange(optimizer: nnx.Optimizer, model: TinyLM, train_config: TrainConfig) -> AdamState:
    """Adam's moments and step count in the exchange layout (after train_config.epochs epochs)."""
    adam = optimizer.opt_state[0]  # optax.adam = (ScaleByAdamState(count, mu, nu), scale by -lr)
    moments = {"exp_avg": grads_to_exchange(adam.mu), "exp_avg_sq": grads_to_exchange(adam.nu)}
    step = int(adam.count[...])
    return AdamState(step, train_config.epochs, moments["exp_avg"], moments["exp_avg_sq"], train_config)


def optimizer_from_exchange(adam_state: AdamState, optimizer: nnx.Optimizer, model: TinyLM) -> None:
    """Give a fresh Adam the saved moments and step count of every parameter."""
    adam = optimizer.opt_state[0]
    assign_exchange(adam.mu, adam_state.exp_avg)
    assign_exchange(adam.nu, adam_state.exp_avg_sq)
    adam.count[...] = adam_state.step
