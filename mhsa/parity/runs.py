"""What the sections of a parity report compute on: the inputs, the padding mask, the trained
runs that several sections read (trained once, shared), and the reference trainer's float64
twins of a float32 run, which the trajectory and data-parallel tolerances are derived from."""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from mhsa import registry
from mhsa.parity.lanes import Lanes
from mhsa.parity.rows import reference
from shared import weights
from shared.config import ModelConfig, TrainConfig
from shared.tolerances import adam_step_rounding


def inputs(config: ModelConfig, seed: int, batch: int = 3):
    """Random tokens and targets (batch, max_len): every id and position is exercised."""
    rng = np.random.default_rng(seed)
    shape = (batch, config.max_len)
    return rng.integers(0, config.vocab_size, shape), rng.integers(0, config.vocab_size, shape)


def padding_mask(config: ModelConfig, batch: int = 3) -> np.ndarray:
    """(B, 1, 1, T): sequence b may attend to its first T - b keys (the others are padding)."""
    keep = np.ones((batch, 1, 1, config.max_len), dtype=bool)
    for row in range(batch):
        keep[row, ..., config.max_len - row :] = False
    return keep


def lane(name: str, dp: int = 1) -> str:
    """The lane of a backend's jobs: its own, and another for its data-parallel runs."""
    return name if dp == 1 else f"{name} dp"


def lane64(name: str) -> str:
    """The lane of a backend's float64 twin runs (the reference's): beside its own, so they overlap."""
    return f"{name} float64"


def trained(name: str, config: ModelConfig, train_config: TrainConfig, dp: int = 1, cache: dict | None = None, lanes: Lanes | None = None) -> Future:
    """A Future of the History of one backend's real trainer, submitted to `lanes` (run at once
    without); `cache` keeps each run for the sections that read the same one (the trajectories
    and the data-parallel dp=1 runs), so that it is trained once."""
    key = (name, config, train_config, dp)
    if cache is not None and key in cache:
        return cache[key]
    backend = registry.get(name)
    job = (backend.train.train, config, train_config) if dp == 1 else (backend.module("parallel").train, config, train_config, dp)
    future = (lanes or Lanes(inline=True)).submit(lane(name, dp), *job)
    if cache is not None:
        cache[key] = future
    return future


def reference_twins(config: ModelConfig, train_config: TrainConfig, cache: dict | None = None, lanes: Lanes | None = None) -> tuple[Future, Future]:
    """Futures of the reference trainer's two float64 runs beside a float32 run (train_config):
    its twin, from the same initial weights (the float32 ones, cast up) and batches; and the
    same with every step smaller by shared.tolerances.adam_step_rounding, how far float32's
    hold on Adam's scalars can move a step. Submitted to the reference's float64 lane, kept in
    `cache` for the sections that read them (trajectories, data-parallel)."""
    key = ("reference twins", config, train_config)
    if cache is not None and key in cache:
        return cache[key]
    arrays = {name: value.astype(np.float64) for name, value in weights.init_weights(config, train_config.seed, train_config.dtype).items()}
    init = weights.Loaded(Path(f"<the {train_config.dtype} initial weights, cast to float64>"), arrays, config, "float64", digest="")
    twin = dataclasses.replace(train_config, dtype="float64")
    nudged = dataclasses.replace(twin, lr=twin.lr * (1 - adam_step_rounding(twin.lr, twin.betas)))
    train = registry.get(reference()).train.train
    lanes = lanes or Lanes(inline=True)
    futures = (lanes.submit(lane64(reference()), train, config, twin, init=init), lanes.submit(lane64(reference()), train, config, nudged, init=init))
    if cache is not None:
        cache[key] = futures
    return futures
