"""What makes a JAX run start quickly, apart from the lesson: the model that from_exchange fills is
built without its random initializers, and Adam's zero state without a compilation, with one optax
transform per setting. Eagerly, each of those compiles small programs (a random key, a zeros_like
per parameter shape) whose results are only overwritten.

Why: a run then compiles its own programs only, not one per parameter shape (docs/performance.md,
"Start-up"). tests/implementations/test_jax_startup.py holds the Adam built here equal to
nnx.Optimizer's, leaf for leaf, and counts the programs a run compiles.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import optax
from flax import nnx

from shared.config import ModelConfig, TrainConfig

if TYPE_CHECKING:  # the model's module imports this one
    from jax_impl.model import TinyLM


def zeros_model(model_class: type[TinyLM], block_class: type, config: ModelConfig, dtype: str) -> TinyLM:
    """model_class(config, dtype=dtype) with every parameter zero, for from_exchange to fill:
    nnx.eval_shape gives the structure, and what is not a parameter (the causal mask) comes from
    the real constructor, compiled once per config with the initializers cut away (_buffers)."""
    # two filters give three parts; the stub types split's result as a variadic tuple
    graphdef, params, rest = nnx.split(nnx.eval_shape(lambda: model_class(config, dtype=dtype, rngs=nnx.Rngs(0))), nnx.Param, ...)  # type: ignore[misc]
    # jax.device_put, not jnp.asarray: on an nnx.State leaf the latter compiles a program per shape
    params = jax.tree.map(lambda leaf: jax.device_put(np.zeros(leaf.shape, leaf.dtype)), params)
    # fresh arrays for every model: a trainer donates its state, which deletes the buffers
    nnx.replace_by_pure_dict(rest, jax.tree.map(lambda buffer: jax.device_put(buffer.copy()), _buffers(model_class, block_class, config, dtype)))
    return nnx.merge(graphdef, params, rest)


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
