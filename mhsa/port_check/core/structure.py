"""A model's inputs and outputs taken apart the same way on both sides, whatever their structure.

Inputs: a model is called as `model(*args, **kwargs)`, with what a factory or a caller gives read by
`as_inputs`. Arrays may sit inside nested tuples, lists and dicts; any other value (True, None, a
string) is passed as it is.

Outputs: any nesting of tuples, lists, mappings (dicts, a library's ModelOutput, an OrderedDict
subclass) and dataclasses is flattened into leaves labelled by where they sit: "[0]" for a
position, "[logits]" for a key or a field, so that a torch ModelOutput and its Flax dataclass
twin give the same labels. Leaves that are not floating-point arrays (None, ints, integer or
boolean arrays) are kept as labels with their kind, so that the report can say what it skipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

# the precision of a floating dtype, for "computes in a lower precision than asked"
RANKS = {"float64": 3, "float32": 2, "bfloat16": 1, "float16": 1, "float8_e4m3fn": 0, "float8_e5m2": 0}


@dataclasses.dataclass(frozen=True)
class Inputs:
    """What a model is called with: model(*args, **kwargs)."""

    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)


def as_inputs(value: Any) -> Inputs:
    """An array -> one positional argument; a tuple or list -> positional arguments; a dict ->
    keyword arguments; a pair (tuple or list, dict) -> both; an Inputs stays as it is."""
    if isinstance(value, Inputs):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], (tuple, list)) and isinstance(value[1], dict):
        return Inputs(tuple(value[0]), dict(value[1]))
    if isinstance(value, dict):
        return Inputs((), dict(value))
    if isinstance(value, (tuple, list)):
        return Inputs(tuple(value), {})
    return Inputs((value,), {})


def dtype_name(dtype: Any) -> str:
    """'float32', 'bfloat16', 'int64': one name for a NumPy, JAX or torch dtype."""
    return str(dtype).removeprefix("torch.")


def is_float_dtype(dtype: Any) -> bool:
    """Whether a NumPy, JAX or torch dtype (or its name) is floating point, bfloat16 included."""
    return dtype_name(dtype) in RANKS or (isinstance(dtype, np.dtype) and np.issubdtype(dtype, np.floating))


def is_array(value: Any) -> bool:
    """An array of any framework: it has a shape and a dtype (a NumPy scalar counts; a Python number does not)."""
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type)


def map_inputs(inputs: Inputs, function: Callable[[Any], Any], leaf: Callable[[Any], bool] = is_array) -> Inputs:
    """Inputs with `function` applied to every array (every value `leaf` accepts) inside args and
    kwargs (nested tuples, lists and dicts followed; every other value kept)."""
    args = tuple(_map(value, function, leaf) for value in inputs.args)
    return Inputs(args, {key: _map(value, function, leaf) for key, value in inputs.kwargs.items()})


def _map(value, function, leaf):
    if leaf(value):
        return function(value)
    if isinstance(value, (tuple, list)):  # of its own type, a named tuple's included
        items = [_map(item, function, leaf) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return {key: _map(item, function, leaf) for key, item in value.items()}
    return value


def to_numpy(value: Any) -> np.ndarray:
    """A NumPy copy of any framework's array (a torch tensor that requires grad included; torch's
    bfloat16, which NumPy cannot hold, as float32, which holds each of its values exactly)."""
    if hasattr(value, "detach"):  # torch: leave the graph first
        value = value.detach().cpu()
        return (value.float() if dtype_name(value.dtype) == "bfloat16" else value).numpy().copy()
    return np.array(value)


def numpy_inputs(inputs: Inputs) -> Inputs:
    """Inputs with every array as a NumPy array, so that either side can take them."""
    return map_inputs(inputs, to_numpy)


def cast_floats(inputs: Inputs, dtype: Any) -> Inputs:
    """Inputs with every floating-point array as a NumPy array of `dtype`, every other value as it is."""
    return map_inputs(inputs, lambda x: np.asarray(x).astype(dtype) if is_float_dtype(x.dtype) else x)


def describe_inputs(inputs: Inputs) -> str:
    """'(3, 5, 24) float32, mask=(3, 5) bool': what a model was called with, for messages."""
    parts = [_shape_of(value) for value in inputs.args] + [f"{key}={_shape_of(value)}" for key, value in inputs.kwargs.items()]
    return ", ".join(parts) or "no arguments"


def _shape_of(value) -> str:
    if is_array(value):
        return f"{tuple(value.shape)} {value.dtype}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_shape_of(item) for item in value) + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_shape_of(item)}" for key, item in value.items()) + "}"
    return repr(value) if isinstance(value, (bool, int, float, str, type(None))) else type(value).__name__


def flatten(output: Any, leaf: Callable[[Any], bool]) -> list[tuple[str, Any]]:
    """(label, leaf) for every leaf of `output`, depth first, labelled as the module docstring says
    ("" for a leaf output); `leaf(value)`: whether a value is an array of the framework at hand."""
    if leaf(output) or output is None:
        return [("", output)]
    if isinstance(output, Mapping):
        items: list = list(output.items())
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        items = [(field.name, getattr(output, field.name)) for field in dataclasses.fields(output)]
    elif isinstance(output, (tuple, list)):
        items = list(enumerate(output))
    else:
        return [("", output)]
    return [(f"[{key}]{label}", value) for key, item in items for label, value in flatten(item, leaf)]


class Output(NamedTuple):
    """One leaf of one call's output."""

    call: int  # the call's index among all the calls recorded
    path: str  # the module path ("" for the model)
    label: str  # where the leaf sits in the output ("" or "[0]", "[logits]", ...)
    value: np.ndarray | None  # None where no floating-point array, or not computed yet; bfloat16 as float32 (exact)
    dtype: str  # its dtype name, or the type name of a value that is no array
    shape: tuple = ()
    layout: tuple | None = None  # core/layouts.py: which axis holds a convolution output's channels (None: nothing fixes one)
    upstream: int = -1  # the calls whose outputs it is computed from, as bits (1 << call; -1: not known)
    floor: int | None = None  # the lowest precision (RANKS) it went through, a float32 step in a float64 run say (None: not known)


@dataclasses.dataclass
class Traced:
    """What a reader learns of a model from its inputs before running it."""

    read: frozenset[str] | None = None  # neutral names of the variables its forward pass reads (None: every one counts, the reader cannot tell)
    modules: dict | None = None  # {path: module} as called (Linen builds its submodules only while called; None: the model knows its own)
    outputs: list[Output] | None = None  # every leaf of every call, without values (None: unknown before the run)
    program: Any = None  # the reader's own (a traced program to compile and run)
    order: list[str] | None = None  # the module paths in the order their calls return, where known without the outputs
    complete: Any = None  # () -> Traced with `read` and `order`, by running the model once (eager torch): asked only where needed


def leaves(call: int, path: str, output: Any, leaf: Callable[[Any], bool], convert: Callable[[Any], np.ndarray], flow=None) -> list[Output]:
    """Every leaf of one call's output as Output records; `convert` makes a framework's floating-point
    array NumPy, the optional `flow(array) -> (layout, upstream, floor)` says how it was computed."""
    records = []
    for label, value in flatten(output, leaf):
        if leaf(value) and is_float_dtype(value.dtype):
            layout, upstream, floor = flow(value) if flow is not None else (None, -1, None)
            records.append(Output(call, path, label, convert(value), dtype_name(value.dtype), tuple(value.shape), layout, upstream, floor))
        else:
            kind = dtype_name(value.dtype) if leaf(value) else type(value).__name__
            records.append(Output(call, path, label, None, kind, tuple(value.shape) if leaf(value) else ()))
    return records


class _Slot(NamedTuple):
    position: int


def split_arrays(inputs: Inputs) -> tuple[list[Any], Callable[[list[Any]], Inputs]]:
    """(the arrays of `inputs` in order, rebuild): rebuild(arrays) puts (new) arrays back where
    they were, every other value as it was. A compiled call traces the arrays and closes over
    the rest (a flag like deterministic=True must stay a Python value)."""
    arrays: list[Any] = []

    def slot(value):
        arrays.append(value)
        return _Slot(len(arrays) - 1)

    template = map_inputs(inputs, slot)

    def rebuild(values: list[Any]) -> Inputs:
        return map_inputs(template, lambda filled: values[filled.position], leaf=lambda value: isinstance(value, _Slot))

    return arrays, rebuild
