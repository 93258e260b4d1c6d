"""How the JAX trainer runs fast, apart from the lesson: train_step repeated by one jax.lax.scan
under jax.jit on split state (the model and optimizer as one nnx.State, donated), each run of steps
queued before the losses of the run before it are read; and a start without compiling: the model
that from_exchange fills built without its random initializers, Adam's zero state with one optax
transform per setting (eagerly, each compiles small programs whose results are only overwritten).

Why: each jitted call of one step pays its dispatch and a host sync when its loss is read; one
scan of 16 steps pays them once, and queuing the next run first keeps XLA busy while the host
reads the losses; and a run then compiles its own programs only, not one per parameter shape
(docs/performance.md). tests/implementations/test_jax_startup.py holds the Adam built here equal
to nnx.Optimizer's, leaf for leaf, and counts the programs a run compiles.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from shared.config import ModelConfig, TrainConfig

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


if TYPE_CHECKING:  # the model's module imports this one
    from jax_impl.model import TinyLM


def zeros_model(model_class: type[TinyLM], block_class: type, config: ModelConfig, dtype: str) -> TinyLM:
    """model_class(config, dtype=dtype) with every parameter zero, for from_exchange to fill:
    the structure is traced once per config (_structure), and what is not a parameter (the causal
    mask) comes from the real constructor, compiled once per config with the initializers cut
    away (_buffers)."""
    graphdef, shapes, rest = _structure(model_class, block_class, config, dtype)
    # jax.device_put, not jnp.asarray: on an nnx.State leaf the latter compiles a program per shape
    params = jax.tree.map(lambda leaf: jax.device_put(np.zeros(leaf.shape, leaf.dtype)), shapes)
    # fresh arrays for every model: a trainer donates its state, which deletes the buffers
    rest = jax.tree.map(lambda leaf: leaf, rest)  # a State of its own to fill: the cached one stays a structure
    nnx.replace_by_pure_dict(rest, jax.tree.map(lambda buffer: jax.device_put(buffer.copy()), _buffers(model_class, block_class, config, dtype)))
    return nnx.merge(graphdef, params, rest)


@functools.lru_cache(maxsize=64)
def _structure(model_class: type, block_class: type, config: ModelConfig, dtype: str) -> tuple[Any, Any, Any]:
    """(graph definition, the parameters' shapes, the other variables' shapes) of a model, from
    nnx.eval_shape: tracing the constructor costs more than the copy it saves, so it is done once
    per config (block_class in the key, as for _buffers)."""
    # two filters give three parts; the stub types split's result as a variadic tuple
    graphdef, params, rest = nnx.split(nnx.eval_shape(lambda: model_class(config, dtype=dtype, rngs=nnx.Rngs(0))), nnx.Param, ...)  # type: ignore[misc]
    return graphdef, params, rest


@functools.lru_cache(maxsize=64)
def _buffers(model_class: type, block_class: type, config: ModelConfig, dtype: str) -> dict[str, Any]:
    """The state of a fresh model that is not a parameter, as a pure dict of NumPy arrays.
    block_class, the attention class the model builds, is part of the key: a block swapped in
    (a test's planted fault) is built anew."""
    compiled = jax.jit(lambda: nnx.state(model_class(config, dtype=dtype, rngs=nnx.Rngs(0)), nnx.Not(nnx.Param)))
    return jax.tree.map(np.asarray, nnx.to_pure_dict(compiled()))


@functools.cache
def _transform(lr: float, betas: tuple[float, float], eps: float) -> optax.GradientTransformation:
    """optax.adam(lr, *betas, eps=eps), one object per setting: the transform is part of the graph
    definition the scanned steps are compiled for, so a new one for every run would compile the
    training step again for a second run of the same settings in one process."""
    return optax.adam(lr, *betas, eps=eps)


def zeros_optimizer(model: TinyLM, train_config: TrainConfig) -> nnx.Optimizer:
    """nnx.Optimizer(model, optax.adam(lr, *betas, eps=eps), wrt=nnx.Param), built without a
    compilation: Adam starts from zeros (its step count and both moments), so nnx.eval_shape gives
    the structure and NumPy the zeros (optax's init compiles a zeros_like per parameter shape)."""
    tx = _transform(train_config.lr, train_config.betas, train_config.eps)
    graphdef, state = nnx.split(nnx.eval_shape(lambda model: nnx.Optimizer(model, tx, wrt=nnx.Param), model))
    return nnx.merge(graphdef, jax.tree.map(lambda leaf: jax.device_put(np.zeros(leaf.shape, leaf.dtype)), state))
