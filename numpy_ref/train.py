"""Train TinyLM on the copy task in pure NumPy: train_step, train_steps, train (loss_fn and
loss_and_grads are in model.py, the backward pass in backward.py, Adam in adam.py).

What the frameworks hide is spelled out here: the gradient is numpy_ref.backward's analytic
backward pass, the optimizer state is three plain arrays per parameter, the update is in place.

Run it: `python -m numpy_ref.train --help`.
"""

from __future__ import annotations

if __name__ == "__main__":  # flags parsed (mhsa/launch.py) before the backend is imported
    from mhsa.launch import main

    main("numpy")

import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from numpy_ref.adam import Adam
from numpy_ref.backward import backward
from numpy_ref.model import TinyLM, from_exchange, intermediates
from shared import checks, malloc, training
from shared.adam_state import AdamState
from shared.config import ModelConfig, TrainConfig
from shared.history import History


def train_step(model: TinyLM, optimizer: Adam, x: np.ndarray, y: np.ndarray) -> float:
    """One Adam step; returns the loss before the update."""
    trace = intermediates(x, model.params, model.config)  # the forward, every stage kept
    loss, grads = backward(x, y, model.params, model.config, trace)  # the backward pass by hand
    optimizer.step(grads)  # updates model.params in place
    return float(loss)


def train_steps(model: TinyLM, optimizer: Adam, batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Every step of `batches` (an epoch, or a run of its steps); returns the per-step losses as a NumPy array."""
    return np.array([train_step(model, optimizer, x, y) for x, y in batches])


def train(
    model_config: ModelConfig,
    train_config: TrainConfig,
    init: str = "shared",
    on_step: Callable[[int, float], object] | None = None,
    resume: AdamState | None = None,
    on_epoch: Callable[[int, Any, Any], object] | None = None,
) -> History:
    """Train from `init` ("shared" or a weights file); returns the History with the model and optimizer.

    resume: an AdamState saved with those weights (by any backend): the run continues
    where it stopped, with the same moments, step count and remaining batches.
    on_step(step, loss) is called for every step once its epoch has finished.
    on_epoch(epochs_done, model, optimizer), if given, is called after every epoch's last step
    (epochs_done counted over the whole run) with the live model and optimizer, valid only during
    the call: the tools copy them to keep the last complete epoch when a run is interrupted.
    Raises ValueError naming the first batch with an id out of range before its epoch's first
    step, training.NonFiniteLossError naming the first step whose loss was NaN or infinite, and
    ValueError for init="native": NumPy has no initializers of its own, "shared" is the
    torch-style init drawn with NumPy.
    """
    started = time.perf_counter()
    start_epoch = training.first_epoch(resume, train_config)
    malloc.use("settled")  # shared/malloc.py: each step's temporaries stay mapped

    # 1. model: the shared NumPy init, identical for every backend, unless init says otherwise
    arrays = training.initial_weights(init, model_config, train_config)
    if arrays is None:
        raise ValueError(
            "init 'native' means the framework's own initializers; numpy_ref has none: "
            "use 'shared' (the same torch-style init, drawn with NumPy) or a weights file"
        )
    model = from_exchange(arrays, model_config)

    # 2. optimizer: Adam with TrainConfig's lr, betas and eps
    # (NumPy: two arrays per parameter, exp_avg and exp_avg_sq, and one step count, all updated in place)
    optimizer = Adam(model.params, lr=train_config.lr, betas=train_config.betas, eps=train_config.eps)
    if resume is not None:
        optimizer_from_exchange(resume, optimizer, model)

    # 3. epochs: the same batches as every other backend
    # (an overflow is not warned about: record_losses names the first non-finite step, as in torch and JAX)
    losses: list[float] = []
    for epochs_done, batches in enumerate(training.epochs(model_config, train_config, start=start_epoch), start=start_epoch + 1):
        checks.check_batches(batches, model_config.vocab_size, model_config.max_len)  # once per epoch, not at every step
        for chunk in training.chunks(batches):  # a few steps at a time: progress as it happens
            with np.errstate(over="ignore", invalid="ignore"):
                run_losses = train_steps(model, optimizer, chunk)
            training.record_losses(losses, run_losses, train_config, start_epoch, on_step)
        if on_epoch is not None:
            on_epoch(epochs_done, model, optimizer)
    return training.history("numpy", model_config, train_config, losses, started, model, optimizer, start_epoch)


def optimizer_to_exchange(optimizer: Adam, model: TinyLM, train_config: TrainConfig) -> AdamState:
    """Adam's moments and step count in the exchange layout (after train_config.epochs epochs)."""
    moments: dict[str, dict[str, np.ndarray]] = {"exp_avg": {}, "exp_avg_sq": {}}
    for name in model.params:
        moments["exp_avg"][name] = optimizer.exp_avg[name].copy()
        moments["exp_avg_sq"][name] = optimizer.exp_avg_sq[name].copy()
    return AdamState(optimizer.step_count, train_config.epochs, moments["exp_avg"], moments["exp_avg_sq"], train_config)


def optimizer_from_exchange(adam_state: AdamState, optimizer: Adam, model: TinyLM) -> None:
    """Give a fresh Adam the saved moments and step count of every parameter."""
    for name in model.params:
        optimizer.exp_avg[name][...] = adam_state.exp_avg[name]
        optimizer.exp_avg_sq[name][...] = adam_state.exp_avg_sq[name]
    optimizer.step_count = adam_state.step
