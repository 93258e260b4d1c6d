"""What the zoo's converters share: taking a torch state_dict apart by name, so that an array
taken twice or never is an error, and writing the result into the Flax side with every name and
shape checked first (`nnx.update` checks neither, and a square kernel left untransposed raises
nothing anywhere).

A port that receives every weight from its converter is built abstractly first (`nnx.eval_shape`:
shapes and dtypes only, no initializer runs), the usual way to load pretrained weights into NNX:
each new kernel shape would otherwise compile its own random initializer, seconds per model on a
small CPU, for values that are overwritten at once."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

M = TypeVar("M", bound=nnx.Module)


class StateDict:
    """A torch state_dict as NumPy arrays, taken apart by name."""

    def __init__(self, arrays: Mapping[str, np.ndarray]):
        self._arrays = dict(arrays)
        self._taken: set[str] = set()

    def __call__(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            raise ValueError(f"the state_dict has no {name!r}")
        if name in self._taken:
            raise ValueError(f"{name!r} is taken from the state_dict twice")
        self._taken.add(name)
        return self._arrays[name]

    def finish(self, unused: Iterable[str] = ()) -> None:
        """Every array taken, apart from those named `unused` (counters, say)."""
        left = sorted(set(self._arrays) - self._taken - set(unused))
        if left:
            raise ValueError(f"the converter leaves {len(left)} array(s) of the state_dict unused: {', '.join(left)}")


def _check(arrays: Mapping[str, np.ndarray], shapes: Mapping[str, tuple], complete: bool) -> None:
    unknown = sorted(set(arrays) - set(shapes))
    if unknown:
        raise ValueError(f"the port has no variable {', '.join(unknown)}")
    for name, value in arrays.items():
        if tuple(value.shape) != tuple(shapes[name]):
            raise ValueError(f"{name}: the converter gives shape {tuple(value.shape)}, the port holds {tuple(shapes[name])}")
    missing = sorted(set(shapes) - set(arrays))
    if complete and missing:
        raise ValueError(f"the converter gives no value for {', '.join(missing)}")


def abstract(build: Callable[[], M], swap: Callable[[M], None] | None = None) -> M:
    """The model `build()` makes, then `swap(model)` applied to it (a bug planted, say), with every
    variable a shape and dtype only, to be filled by load_nnx."""

    def made():
        model = build()
        if swap is not None:
            swap(model)
        return model

    return nnx.eval_shape(made)


def load_nnx(model: M, arrays: Mapping[str, np.ndarray], *, complete: bool = True) -> M:
    """Write {Flax variable path "a.0.kernel": array in Flax layout} into `model`'s parameters and
    batch statistics, each in the dtype of the variable it replaces; every name and shape is checked
    before anything is written. With `complete` every variable must be given; an abstract model's
    variables always must. Returns `model`."""
    state = nnx.to_flat_state(nnx.state(model, nnx.Any(nnx.Param, nnx.BatchStat)))
    variables = {".".join(str(key) for key in path): variable for path, variable in state}
    _check(arrays, {name: variable.get_value().shape for name, variable in variables.items()}, complete)
    empty = sorted(name for name, variable in variables.items() if name not in arrays and isinstance(variable.get_value(), jax.ShapeDtypeStruct))
    if empty:
        raise ValueError(f"the converter gives no value for {', '.join(empty)}, which the abstract port holds no value for")
    for name, value in arrays.items():
        variable = variables[name]
        variable.set_value(jnp.asarray(value, dtype=variable.get_value().dtype))  # the variable's dtype, not the array's
    return model


def linen_variables(module, example_inputs: tuple, arrays: Mapping[str, np.ndarray], dtype: str = "float32", unread: Iterable[str] = ()) -> dict:
    """{"params": nested dict} for a Linen module from {"a.0.kernel": array}, every name and shape
    checked against the variables `module.init` would create (traced only, nothing computed), and
    every parameter given; arrays cast to `dtype`. `unread`: names beyond those, kept as a
    converter leaves them (a copy of a shared embedding, say), which the module never reads."""
    expected = jax.eval_shape(module.init, jax.random.key(0), *example_inputs)["params"]
    shapes = {".".join(str(key.key) for key in path): leaf.shape for path, leaf in jax.tree_util.tree_leaves_with_path(expected)}
    unread = set(unread)
    if unread & set(shapes):
        raise ValueError(f"{', '.join(sorted(unread & set(shapes)))}: said to be unread, but the module creates it")
    _check({name: value for name, value in arrays.items() if name not in unread}, shapes, complete=True)
    params: dict = {}
    for name, value in arrays.items():
        *parents, leaf = name.split(".")
        tree = params
        for key in parents:
            tree = tree.setdefault(key, {})
        tree[leaf] = jnp.asarray(np.asarray(value, dtype=dtype))
    return {"params": params}


def jax_dtype(name: str):
    """ "float32" or "float64" -> the JAX dtype; float64 needs jax_enable_x64, without which JAX
    would silently compute in float32."""
    if name not in ("float32", "float64"):
        raise ValueError(f"dtype must be float32 or float64; got {name!r}")
    if name == "float64" and not jax.config.read("jax_enable_x64"):
        raise ValueError("float64 needs jax.config.update('jax_enable_x64', True) first")
    return jnp.dtype(name)
