"""Train TinyLM on the copy task with JAX, Flax NNX and optax: new_optimizer, train_step, train_steps,
train (loss_fn is in model.py), and Adam's state in the exchange format. What only makes it faster lives apart:
compiled.py (a model and Adam built without compiling, the scanned runs of steps).

Run it: `python -m jax_impl.train --help`.
"""

from __future__ import annotations

if __name__ == "__main__":  # flags parsed (mhsa/launch.py) before jax is imported
    from mhsa.launch import main

    main("jax")

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from jax_impl import compiled
from jax_impl.device import resolve
from jax_impl.model import TinyLM, assign_exchange, from_exchange, grads_to_exchange, loss_fn
from shared import checks, training
from shared.adam_state import AdamState
from shared.config import ModelConfig, TrainConfig
from shared.history import History


def new_optimizer(model: TinyLM, train_config: TrainConfig) -> nnx.Optimizer:
    """Adam over the model's nnx.Param with TrainConfig's lr, betas and eps:
    nnx.Optimizer(model, optax.adam(lr, *betas, eps=eps), wrt=nnx.Param), its zero state built
    without a compilation (compiled.zeros_optimizer)."""
    return compiled.zeros_optimizer(model, train_config)


def train_step(model: TinyLM, optimizer: nnx.Optimizer, x: jax.Array, y: jax.Array) -> jax.Array:
    """One Adam step; returns the loss before the update (a 0-d array, no host sync)."""
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)  # grads of nnx.Param only
    optimizer.update(model, grads)
    return loss


def train_steps(graphdef: nnx.GraphDef, state: nnx.State, batches: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[nnx.State, jax.Array]:
    """Every step of `batches` (an epoch, or a run of its steps) as one compiled jax.lax.scan of
    train_step (jax_impl.compiled) on the model and optimizer split into one State; returns (new
    state, the per-step losses (steps,)), which JAX is still computing: np.asarray waits for them."""
    return compiled.run_steps(train_step, graphdef, state, batches)


def train(
    model_config: ModelConfig,
    train_config: TrainConfig,
    init: str = "shared",
    on_step: Callable[[int, float], object] | None = None,
    resume: AdamState | None = None,
    on_epoch: Callable[[int, Any, Any], object] | None = None,
    device: str = "cpu",
) -> History:
    """Train from `init` ("shared", "native" or a weights file); returns the History with the
    model and optimizer.

    resume: an AdamState saved with those weights (by either backend): the run continues
    where it stopped, with the same moments, step count and remaining batches.
    on_step(step, loss) is called for every step once its run of steps has finished.
    on_epoch(epochs_done, model, optimizer), if given, is called after every epoch's last step
    (epochs_done counted over the whole run) with the live model and optimizer, valid only during
    the call: the tools copy them to keep the last complete epoch when a run is interrupted.
    device: "cpu" or "cuda" (JAX's first CUDA device); the returned model and optimizer live
    there, and everything that takes a model (predict, attend, generate, to_exchange) runs there.
    Data parallel is jax_impl.parallel.train, which runs this file's train_step over a mesh.
    Raises ValueError before any work for a device JAX does not have, ValueError naming the
    first batch with an id out of range before its epoch's first step, and
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
    record = functools.partial(training.record_losses, losses, train_config=train_config, start_epoch=start_epoch, on_step=on_step)
    with compiled.read_one_run_late(record) as finish:  # a run's losses are read once the next run is queued
        for epochs_done, batches in enumerate(training.epochs(model_config, train_config, start=start_epoch), start=start_epoch + 1):
            checks.check_batches(batches, model_config.vocab_size, model_config.max_len)  # once per epoch, on the host: jit sees no ids
            for chunk in training.chunks(batches):  # a few steps at a time: progress as it happens
                state, run_losses = train_steps(graphdef, state, chunk)
                finish(run_losses)
            if on_epoch is not None:  # the next run donates these buffers: on_epoch copies what it keeps
                on_epoch(epochs_done, *nnx.merge(graphdef, state))
    model, optimizer = nnx.merge(graphdef, state)
    return training.history("jax", model_config, train_config, losses, started, model, optimizer, start_epoch)


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
