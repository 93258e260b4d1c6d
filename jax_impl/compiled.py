"""How the JAX trainer runs its steps fast, apart from the lesson: train_step repeated by one
jax.lax.scan under jax.jit on split state (the model and optimizer as one nnx.State, donated), and
each run of steps queued before the losses of the run before it are read, so that the host stacks
the next run's batches while XLA computes this one.

Why: each jitted call of one step pays its dispatch and a host sync when its loss is read; one
scan of 16 steps pays them once, and queuing the next run first keeps XLA busy while the host
reads the losses (docs/performance.md measures it).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

Step = Callable[..., jax.Array]  # train_step(model, optimizer, x, y) -> the loss before the update


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=2)
def scan_steps(step: Step, graphdef: nnx.GraphDef, state: nnx.State, xs: jax.Array, ys: jax.Array) -> tuple[nnx.State, jax.Array]:
    """step over stacked batches xs, ys (steps, B, T) in one compiled loop, on the model and
    optimizer split into graphdef and state; returns (new state, losses (steps,)). Merge and split
    cost nothing at run time: they happen once, while tracing."""

    def one(state: nnx.State, batch: tuple[jax.Array, jax.Array]) -> tuple[nnx.State, jax.Array]:
        model, optimizer = nnx.merge(graphdef, state)
        loss = step(model, optimizer, *batch)
        return nnx.state((model, optimizer)), loss

    return jax.lax.scan(one, state, (xs, ys))


def run_steps(step: Step, graphdef: nnx.GraphDef, state: nnx.State, batches: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[nnx.State, jax.Array]:
    """Every step of `batches` queued without waiting: full batches under one scan_steps, a smaller
    last batch (when batch_size does not divide n_sequences) as one more scanned step of its own
    shape. Returns (new state, per-step losses (steps,)) at once, the losses still being computed."""
    size = len(batches[0][0])
    full = [batch for batch in batches if len(batch[0]) == size]
    xs, ys = np.stack([x for x, _ in full]), np.stack([y for _, y in full])  # (steps, B, T), one scan
    state, losses = scan_steps(step, graphdef, state, xs, ys)
    for x, y in batches[len(full) :]:
        state, loss = scan_steps(step, graphdef, state, x[None], y[None])
        losses = jnp.concatenate([losses, loss])
    return state, losses


@contextlib.contextmanager
def read_one_run_late(finish: Callable[[np.ndarray], Any]) -> Iterator[Callable[[jax.Array], None]]:
    """Yields report(losses) for the losses of each run of steps as it is queued: each is handed
    to finish, as NumPy, once the next run is queued (the host waits for a run only while XLA
    already has the next one), and the last on a normal exit; in order, each run exactly once."""
    waiting: list[jax.Array] = []

    def report(losses: jax.Array) -> None:
        waiting.append(losses)
        if len(waiting) == 2:
            finish(np.asarray(waiting.pop(0)))

    yield report
    for losses in waiting:
        finish(np.asarray(losses))
