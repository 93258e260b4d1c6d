"""What every JAX library's trainer of `--train` (readers/flax/training.py,
readers/equinox/training.py) does with optax alike: own an optax transformation, find the
optimizer's moments in its state by type (STATES, under torch's names), turn JAX's 64-bit types on
for one block, and run the transformation on the lint's probe gradients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import optax

# optax state type -> {its field: torch's name for the moment}
STATES = (
    (optax.ScaleByAdamState, {"mu": "exp_avg", "nu": "exp_avg_sq"}),
    (optax.ScaleByAmsgradState, {"mu": "exp_avg", "nu": "exp_avg_sq", "nu_max": "max_exp_avg_sq"}),
    (optax.TraceState, {"trace": "momentum_buffer"}),
)


def owns(optimizer: object) -> bool:
    """Whether `optimizer` is a JAX trainer's: an optax GradientTransformation."""
    return isinstance(optimizer, optax.GradientTransformation)


def moment_trees(state, leaf_types: tuple[type, ...] = ()) -> list[tuple[str, Any]]:
    """(torch's moment name, tree) for every moment in an optax state, found by type inside chains
    (tuples), wrappers (named tuples) and multi_transform (dicts of states); a dict of one of
    `leaf_types` (a library's own state mapping) is a tree, not a container of states."""
    for kind, fields in STATES:
        if isinstance(state, kind):
            return [(torch_name, getattr(state, field)) for field, torch_name in fields.items()]
    if isinstance(state, dict) and not isinstance(state, leaf_types):
        return [found for value in state.values() for found in moment_trees(value, leaf_types)]
    if isinstance(state, (tuple, list)):
        return [found for value in state for found in moment_trees(value, leaf_types)]
    return []


@contextlib.contextmanager
def x64(on: bool) -> Iterator[None]:
    """JAX's 64-bit types for the duration of the block only (a float64 run beside a float32 one:
    turning them on for good would change the float32 run's numerics, as optax's bias correction
    1 - b2**t then computes in float64); nothing when `on` is False."""
    if not on:
        yield
        return
    previous = jax.config.values["jax_enable_x64"]  # the process's setting, not a block's
    with jax.enable_x64(True):
        try:
            yield
        finally:  # a reader's cast turns them on for the whole process
            jax.config.update("jax_enable_x64", previous)


def probe(
    tx, template, neutral: Callable[[Any], dict], moments: Callable[[Any], dict], scenarios: list[tuple[float, list[float]]]
) -> tuple[list[list[dict]], int]:
    """Run `tx` on each scenario as readers/torch/training.py's probe runs torch's optimizer (the
    same scenarios and return), filling every array of `template` (the model's own parameter tree,
    so masks and labels apply); `neutral(tree)` and `moments(state)` name a tree's arrays as the
    reader does."""

    @jax.jit
    def update(grads, state, params):
        updates, state = tx.update(grads, state, params)
        return updates, optax.apply_updates(params, updates), state

    init = jax.jit(tx.init)
    runs = []
    for p0, gradients in scenarios:
        params = _filled(template, p0)
        state = init(params)
        steps = []
        for g in gradients:
            updates, params, state = update(_filled(template, g), state, params)
            steps.append({"update": _first(neutral(updates)), "param": _first(neutral(params)), "moment": _first(moments(state))})
        runs.append(steps)
    return runs, sum(leaf.size for leaf in jax.tree.leaves(template))


def _filled(template, value: float):
    """A tree shaped like `template` with every element `value` (NumPy: no eager JAX operation)."""
    return jax.tree.map(lambda leaf: np.full(leaf.shape, value, leaf.dtype), template)


def _first(arrays: dict) -> dict:
    return {key: float(value.reshape(-1)[0]) for key, value in arrays.items() if value.size}
