"""What the zoo's Equinox converters share: an Equinox port's arrays named as jax.tree_util flattens
it (attribute names and list indices joined by ".": "lstm.layers.0.weight_ih"), the port built
abstractly (eqx.filter_eval_shape: shapes only, no initializer runs) and filled by load_equinox,
every name and shape checked first, as convert.load_nnx fills an NNX port. Equinox is an optional
extra of the project: only the families with an Equinox port import this."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

E = TypeVar("E", bound=eqx.Module)


def equinox_path(path) -> str:
    """A jax key path -> "blocks.0.attn.query_proj.weight"."""
    return ".".join(str(getattr(key, "name", getattr(key, "idx", getattr(key, "key", key)))) for key in path)


def equinox_arrays(tree) -> dict[str, np.ndarray]:
    """{path: array} of every floating array of an eqx.Module (or of a tree shaped like one: its gradients)."""
    leaves = jax.tree_util.tree_flatten_with_path(eqx.filter(tree, eqx.is_inexact_array))[0]
    return {equinox_path(path): np.asarray(leaf) for path, leaf in leaves}


def _held(leaf) -> bool:
    """Whether a leaf of an Equinox port is one of its arrays: a floating array, or an abstract one's shape and dtype."""
    return isinstance(leaf, jax.ShapeDtypeStruct) or eqx.is_inexact_array(leaf)


def equinox_shapes(model) -> dict[str, tuple[int, ...]]:
    """{path: shape} of every floating array of an eqx.Module, abstract (abstract_equinox) or not."""
    return {equinox_path(path): tuple(leaf.shape) for path, leaf in jax.tree_util.tree_flatten_with_path(model)[0] if _held(leaf)}


def abstract_equinox(build: Callable[[], E]) -> E:
    """The module `build()` makes, every array a shape and dtype only, to be filled by load_equinox."""
    return eqx.filter_eval_shape(build)


def load_equinox(model: E, arrays: Mapping[str, np.ndarray]) -> E:
    """A copy of `model` with {array path: array} written in, each in the dtype of the array it
    replaces; every name and shape is checked first, and every floating array must be given."""
    shapes = equinox_shapes(model)
    unknown, missing = sorted(set(arrays) - set(shapes)), sorted(set(shapes) - set(arrays))
    if unknown or missing:
        raise ValueError(f"the converter gives arrays the port lacks ({', '.join(unknown) or 'none'}) and none for ({', '.join(missing) or 'none'})")
    for name, value in arrays.items():
        if tuple(value.shape) != shapes[name]:
            raise ValueError(f"{name}: the converter gives shape {tuple(value.shape)}, the port holds {shapes[name]}")
    leaves, treedef = jax.tree_util.tree_flatten_with_path(model)
    filled = [jnp.asarray(arrays[equinox_path(path)], dtype=leaf.dtype) if _held(leaf) else leaf for path, leaf in leaves]
    return jax.tree_util.tree_unflatten(treedef, filled)
