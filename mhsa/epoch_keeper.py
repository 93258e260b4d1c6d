"""Ctrl-C or SIGTERM during a run with --save keeps the last complete epoch: a copy of the model's weights
and of Adam's state as they stood after it, saved as a bound checkpoint that --resume continues
exactly as if the run had never stopped.

The copy comes from the trainer: a trainer whose train() takes `on_epoch` calls
on_epoch(epochs_done, model, optimizer) after the last step of every epoch and before the first
step of the next, with its live model and optimizer (epochs_done counted over the whole run, a
resumed run's earlier epochs included). The objects are valid only during the call (a JAX
trainer's next step may reuse their buffers), so the keeper copies them to NumPy at once. The
epoch counts as complete once on_step has reported every one of its steps, finite: a trainer that
queues the next steps before it reads the last losses (JAX) hands over the copy first. A trainer
without on_epoch keeps nothing (capability check: has_on_epoch), and Ctrl-C saves nothing.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from mhsa import registry
from shared.adam_state import AdamState
from shared.config import TrainConfig


def has_on_epoch(train: Callable[..., Any]) -> bool:
    """Whether a trainer's train() hands over its model and optimizer at every epoch's end."""
    try:
        return "on_epoch" in inspect.signature(train).parameters
    except (TypeError, ValueError):  # a callable without a signature
        return False


@dataclasses.dataclass
class Kept:
    """The weights (exchange format) and Adam's state after `epochs_done` epochs."""

    epochs_done: int
    arrays: dict[str, np.ndarray]
    state: AdamState


class EpochKeeper:
    """on_epoch for a trainer, and what it kept: the newest epoch whose steps were all reported."""

    def __init__(self, backend: registry.Backend, train_config: TrainConfig, steps_before: int) -> None:
        self.backend, self.train_config = backend, train_config
        self.steps_reported = steps_before  # steps of the run (a resumed one's earlier steps included) reported by on_step
        self.copies: list[Kept] = []  # oldest first: the newest complete one, and those whose steps are not all reported yet

    def on_epoch(self, epochs_done: int, model: Any, optimizer: Any) -> None:
        arrays = {name: np.array(value, copy=True) for name, value in self.backend.model.to_exchange(model).items()}
        state = self.backend.train.optimizer_to_exchange(optimizer, model, self.train_config)
        state = dataclasses.replace(
            state,
            epochs_done=epochs_done,
            exp_avg={name: np.array(value, copy=True) for name, value in state.exp_avg.items()},
            exp_avg_sq={name: np.array(value, copy=True) for name, value in state.exp_avg_sq.items()},
        )
        if state.step != epochs_done * self.train_config.steps_per_epoch:  # a trainer breaking the hook's contract
            raise RuntimeError(
                f"on_epoch({epochs_done}) came with Adam at step {state.step}, expected "
                f"{epochs_done * self.train_config.steps_per_epoch} ({self.train_config.steps_per_epoch} steps per epoch)"
            )
        self.copies.append(Kept(epochs_done, arrays, state))
        self._forget_older()

    def on_step(self, step: int) -> None:
        """Step `step` (counted over the run) was taken and its loss was finite."""
        self.steps_reported = step + 1
        self._forget_older()

    def _forget_older(self) -> None:
        complete = self.last_complete()
        if complete is not None:
            self.copies = [kept for kept in self.copies if kept.epochs_done >= complete.epochs_done]

    def last_complete(self) -> Kept | None:
        """The newest copy whose every step on_step reported, or None."""
        complete = [kept for kept in self.copies if kept.epochs_done * self.train_config.steps_per_epoch <= self.steps_reported]
        return complete[-1] if complete else None
