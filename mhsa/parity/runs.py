"""What the sections of a parity report compute on: the inputs, the padding mask, and the trained
runs that several sections read (trained once, shared)."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np

from mhsa import registry
from mhsa.parity.lanes import Lanes
from shared.config import ModelConfig, TrainConfig


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
