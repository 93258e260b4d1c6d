"""Train TinyLM on the copy task with PyTorch: new_optimizer, train_step, train_steps, train
(loss_fn is in model.py), and Adam's state in the exchange format. What only makes it faster
lives apart: compiled.py (the opt-in torch.compile).

Run it: `python -m torch_impl.train --help`.
"""

from __future__ import annotations

if __name__ == "__main__":  # flags parsed (mhsa/launch.py) before torch is imported
    from mhsa.launch import main

    main("torch")

import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

from shared import checks, training
from shared.adam_state import AdamState
from shared.config import ModelConfig, TrainConfig
from shared.history import History
from torch_impl.compiled import StepFn, compile_step
from torch_impl.device import resolve
from torch_impl.model import TinyLM, from_exchange, loss_fn


def new_optimizer(model: TinyLM, train_config: TrainConfig) -> torch.optim.Adam:
    """Adam over the model's parameters with TrainConfig's lr, betas and eps. fused=True: one
    kernel updates every parameter; its moments are created beside the parameters, on their
    device, at the first step."""
    return torch.optim.Adam(model.parameters(), lr=train_config.lr, betas=train_config.betas, eps=train_config.eps, fused=True)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Adam, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One Adam step; returns the loss before the update (a 0-d tensor, no host sync)."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model, x, y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def train_steps(
    model: torch.nn.Module, optimizer: torch.optim.Adam, batches: Iterable[tuple[np.ndarray, np.ndarray]], step: StepFn | None = None
) -> np.ndarray:
    """Every step of `batches` (an epoch, or a run of its steps), on the model's device: train_step,
    or `step` (compile_step's compiled whole step); returns the per-step losses as a NumPy array
    (one copy to the host, after the last step)."""
    device = next(model.parameters()).device
    run = step or (lambda x, y: train_step(model, optimizer, x, y))
    losses = [run(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)) for x, y in batches]
    return torch.stack(losses).cpu().numpy()


def train(
    model_config: ModelConfig,
    train_config: TrainConfig,
    init: str = "shared",
    on_step: Callable[[int, float], object] | None = None,
    resume: AdamState | None = None,
    on_epoch: Callable[[int, Any, Any], object] | None = None,
    device: str = "cpu",
    compile: bool = False,
) -> History:
    """Train from `init` ("shared", "native" or a weights file); returns the History with the
    model and optimizer.

    resume: an AdamState saved with those weights (by either backend): the run continues
    where it stopped, with the same moments, step count and remaining batches.
    on_step(step, loss) is called for every step once its run of steps has finished.
    on_epoch(epochs_done, model, optimizer), if given, is called after every epoch's last step
    (epochs_done counted over the whole run) with the live model and optimizer, valid only during
    the call: the tools copy them to keep the last complete epoch when a run is interrupted.
    device: "cpu" or "cuda" (torch's first CUDA device); the returned model and optimizer live
    there, and everything that takes a model (predict, attend, generate, to_exchange) runs there.
    compile: every step runs as one graph of torch.compile (forward, backward and Adam's update:
    torch_impl.compiled.compile_step), compiled before the first step; its seconds are
    History.compile_seconds. The returned model is the plain TinyLM either way.
    Data parallel is torch_impl.parallel.train, which runs this file's train_step on every rank.
    Raises ValueError before any work for a device torch does not have, ValueError naming the
    first batch with an id out of range before its epoch's first step, ValueError when
    torch.compile fails, and training.NonFiniteLossError naming the first step whose loss was
    NaN or infinite.
    """
    target = resolve(training.check_device(device))
    started = time.perf_counter()
    start_epoch = training.first_epoch(resume, train_config)

    # 1. model: the shared NumPy init, identical for every backend, unless init says otherwise
    torch.manual_seed(train_config.seed)
    arrays = training.initial_weights(init, model_config, train_config)
    model = TinyLM(model_config, dtype=train_config.dtype) if arrays is None else from_exchange(arrays, model_config)
    model = model.to(target)  # before the optimizer: its moments are created beside the parameters

    # 2. optimizer: Adam with TrainConfig's lr, betas and eps
    # (torch: handed the parameters, it keeps their moments and updates them in place)
    optimizer = new_optimizer(model, train_config)
    if resume is not None:
        optimizer_from_exchange(resume, optimizer, model)
    step, compile_seconds = (
        compile_step(model, optimizer, _first_epoch(model_config, train_config, start_epoch), loss_fn) if compile else (None, None)
    )

    # 3. epochs: the same batches as every other backend
    losses: list[float] = []
    for epochs_done, batches in enumerate(training.epochs(model_config, train_config, start=start_epoch), start=start_epoch + 1):
        checks.check_batches(batches, model_config.vocab_size, model_config.max_len)  # once per epoch, on the host: no sync per step
        for chunk in training.chunks(batches):  # a few steps at a time: progress as it happens
            run_losses = train_steps(model, optimizer, chunk, step)
            training.record_losses(losses, run_losses, train_config, start_epoch, on_step)
        if on_epoch is not None:
            on_epoch(epochs_done, model, optimizer)
    return training.history("torch", model_config, train_config, losses, started, model, optimizer, start_epoch, compile_seconds)


def _first_epoch(model_config: ModelConfig, train_config: TrainConfig, start_epoch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    # what compile_step compiles for: every epoch has the same batch shapes
    return next(training.epochs(model_config, train_config, start=start_epoch), [])


def optimizer_to_exchange(optimizer: torch.optim.Adam, model: TinyLM, train_config: TrainConfig) -> AdamState:
    """Adam's moments and step count in the exchange layout (after train_config.epochs epochs)."""
    names: dict[torch.Tensor, str] = {parameter: name for name, parameter in model.named_parameters()}
    moments: dict[str, dict[str, np.ndarray]] = {"exp_avg": {}, "exp_avg_sq": {}}
    step = 0
    for parameter, state in optimizer.state.items():
        for moment in moments:
            moments[moment][names[parameter]] = state[moment].detach().cpu().numpy().copy()
        step = int(state["step"])
    return AdamState(step, train_config.epochs, moments["exp_avg"], moments["exp_avg_sq"], train_config)


def optimizer_from_exchange(adam_state: AdamState, optimizer: torch.optim.Adam, model: TinyLM) -> None:
    """Give a fresh Adam the saved moments and step count of every parameter, on its device."""
    for name, parameter in model.named_parameters():
        optimizer.state[parameter] = {
            "step": torch.tensor(float(adam_state.step), device=parameter.device),
            "exp_avg": torch.from_numpy(adam_state.exp_avg[name].copy()).to(parameter.device),
            "exp_avg_sq": torch.from_numpy(adam_state.exp_avg_sq[name].copy()).to(parameter.device),
        }
