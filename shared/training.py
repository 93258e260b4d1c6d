"""The parts of training no framework changes: initial weights, the batch stream, the
finite-loss check and the history. Each backend's train.py supplies only the steps."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from shared import weights
from shared.adam_state import AdamState
from shared.config import ModelConfig, TrainConfig
from shared.data import batches, copy_task
from shared.history import History
from shared.words import plural

INITS = ("shared", "native")


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; names the first such step (counted from 0)."""

    def __init__(self, step: int, loss: float, steps_per_epoch: int) -> None:
        self.step, self.loss = step, loss
        super().__init__(
            f"loss became non-finite at step {step} (epoch {step // steps_per_epoch + 1}): {loss}; training stopped (try a smaller --lr)"
        )


class RankFailedError(RuntimeError):
    """One rank (process or device) of a data-parallel run failed; every rank was stopped."""

    def __init__(self, rank: int, dp: int, reason: str) -> None:
        self.rank, self.dp, self.reason = rank, dp, reason
        super().__init__(f"data-parallel rank {rank} of {dp} failed: {reason}; all {dp} ranks were stopped")


def initial_weights(init: str | Path | weights.Loaded, model_config: ModelConfig, train_config: TrainConfig) -> dict | None:
    """Exchange arrays to start from: "shared" = init_weights(config, seed), identical for every
    backend; "native" = None (the framework's own initializers); a path = a saved weights file;
    a weights.Loaded = a file already read and validated (the command line reads each file once)."""
    if init == "shared":
        return weights.init_weights(model_config, train_config.seed, train_config.dtype)
    if init == "native":
        return None
    if isinstance(init, weights.Loaded):  # a file the command line has read (once) and checked
        weights.check_same_architecture(init.config, model_config, source=f"weights file {str(init.path)!r}")
        if init.dtype != train_config.dtype:
            raise ValueError(f"weights file {str(init.path)!r}: weights are {init.dtype}, expected {train_config.dtype} (the run's dtype)")
        return init.arrays
    if isinstance(init, (str, Path)) and init and (Path(init).exists() or Path(init).suffix):
        arrays, _ = weights.load(init, expect=model_config)
        try:
            weights.validate(arrays, model_config, dtype=train_config.dtype)
        except ValueError as error:  # the file is fine, but not in the dtype this run trains in
            raise ValueError(f"weights file {str(init)!r}: {error} (the run's dtype)") from None
        return arrays
    raise ValueError(f"init must be one of {', '.join(INITS)} or a weights file path, got {init!r}")


def epochs(model_config: ModelConfig, train_config: TrainConfig, start: int = 0) -> Iterator[list[tuple[np.ndarray, np.ndarray]]]:
    """One list of (x, y) int64 batches (batch, T) per epoch, T = max_len; the same for every backend.

    start: epochs already trained (a resumed run), whose batches are drawn and skipped so the
    rest of the stream is exactly the one an uninterrupted run sees.
    """
    rows = copy_task(train_config.n_sequences, model_config.max_len, model_config.vocab_size, train_config.seed)
    stream = batches(rows, train_config.batch_size, train_config.epochs, train_config.seed + 1)
    for epoch in range(train_config.epochs):
        batch_list = list(islice(stream, train_config.steps_per_epoch))
        if epoch >= start:
            yield batch_list


PROGRESS_STEPS = 16  # steps per call of a trainer's train_steps, so on_step hears of each run of steps as it ends


def chunks(batches: list, size: int = PROGRESS_STEPS) -> Iterator[list]:
    """An epoch's batches in runs of `size` steps. The trainers take one run at a time so that
    progress is reported as it happens (a compiled JAX epoch would otherwise report only when
    the whole epoch is done); the batches and the maths are the same."""
    for start in range(0, len(batches), size):
        yield batches[start : start + size]


def record_losses(
    losses: list[float], run_losses: ArrayLike, train_config: TrainConfig, start_epoch: int = 0, on_step: Callable | None = None
) -> None:
    """Append a run of steps' losses to `losses` and tell on_step of each; stop at the first
    non-finite one, naming its step (counted over the whole run: a run resumed after start_epoch
    epochs does not start at 0)."""
    first_step = start_epoch * train_config.steps_per_epoch
    for loss in np.asarray(run_losses, dtype=np.float64):
        step = first_step + len(losses)
        if not math.isfinite(loss):
            raise NonFiniteLossError(step, float(loss), train_config.steps_per_epoch)
        losses.append(float(loss))
        if on_step is not None:
            on_step(step, float(loss))


def first_epoch(resume: AdamState | None, train_config: TrainConfig) -> int:
    """Where a run starts: 0, or the epochs a resumed AdamState has done (checked to continue)."""
    if resume is None:
        return 0
    resume.check_continues(train_config)
    return resume.epochs_done


def history(
    backend: str,
    model_config: ModelConfig,
    train_config: TrainConfig,
    losses: list[float],
    started: float,
    model: Any,
    optimizer: Any,
    start_epoch: int = 0,
    compile_seconds: float | None = None,
) -> History:
    """Bundle a finished run; epoch means over each epoch's steps. compile_seconds: the part of
    the run spent compiling before its first step, where a trainer compiles apart (torch's opt-in)."""
    size = train_config.steps_per_epoch
    return History(
        backend,
        model_config,
        train_config,
        losses,
        epoch_means(losses, train_config),
        time.perf_counter() - started,
        first_step=start_epoch * size,
        compile_seconds=compile_seconds,
        model=model,
        optimizer=optimizer,
    )


def epoch_means(losses: list[float], train_config: TrainConfig) -> list[float]:
    """The mean loss of each epoch (of its steps recorded: a last epoch cut short counts those)."""
    size = train_config.steps_per_epoch
    return [float(np.mean(losses[start : start + size])) for start in range(0, len(losses), size)]


# --- devices (capability "device": torch_impl.train, jax_impl.train) ------------------------------

DEVICES = ("cpu", "cuda")


def check_device(device: str, dp: int = 1) -> str:
    """The device a trainer is asked for, checked before any work: one of DEVICES. A data-parallel
    run (dp > 1) runs its ranks on CPU devices only (gloo processes, a host-platform mesh)."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: expected one of {', '.join(DEVICES)}")
    if device != "cpu" and dp != 1:
        raise ValueError(f"device {device!r} with dp={dp}: the data-parallel trainers run their ranks on CPU devices only")
    return device


# --- data parallel (torch_impl.parallel, jax_impl.parallel) ------------------------------------


def check_data_parallel(train_config: TrainConfig, dp: int, devices: int | None = None, where: str = "devices") -> int:
    """dp shards per global batch: every batch, the last smaller one included, must split into
    dp equal shards, and dp must not exceed the `devices` available (None: no limit, as for
    gloo ranks on CPU). Returns the shard size of a full batch. Raised before any work."""
    if isinstance(dp, bool) or not isinstance(dp, int):
        raise TypeError(f"dp must be an int, got {dp!r} ({type(dp).__name__})")
    if dp < 1:
        raise ValueError(f"dp must be a positive integer, got {dp}")
    if train_config.batch_size % dp != 0:
        raise ValueError(f"batch_size={train_config.batch_size} is not divisible by dp={dp}: every global batch is split into {dp} equal shards")
    last = train_config.n_sequences % train_config.batch_size
    if last % dp != 0:
        raise ValueError(
            f"the last batch of each epoch has {last} sequences (n_sequences={train_config.n_sequences} "
            f"% batch_size={train_config.batch_size}), not divisible by dp={dp}: "
            f"choose n_sequences so that every batch splits into {dp} equal shards"
        )
    if devices is not None and dp > devices:
        raise ValueError(f"dp={dp} needs {dp} devices, but only {plural(devices, 'is', 'are')} available ({where})")
    return train_config.batch_size // dp
