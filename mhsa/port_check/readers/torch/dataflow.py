"""How a torch model's outputs were computed, followed operation by operation while the model runs,
through torch's public hook for every function call (`torch.overrides.TorchFunctionMode`): each
tensor's layout (core/layouts.py), the recorded calls it is computed from (its upstream, as bits:
the check's row after a difference is the first that reads it), and the lowest precision its data
went through (a float64 run through a float32 step of the model's code, say a softmax in float32).

torch's convolutions, poolings and batch, group and instance norms put the channels first; a
transpose, permute or movedim moves them; a result of the shape of an input with a layout keeps it
(an elementwise operation, a norm, a dropout, a cast), and so do a padding, a slice, a concatenation
or an interpolation (same rank) and a linear layer over a channels-last array's channels; anything
else has none.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
from torch.overrides import TorchFunctionMode

from mhsa.port_check.core import layouts
from mhsa.port_check.core.structure import RANKS, dtype_name

# functions whose output is channels-first whatever their input: convolutions, poolings, norms over channels, resizings
FIRST = {
    *(f"{kind}{n}d" for kind in ("conv", "conv_transpose", "max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool") for n in (1, 2, 3)),
    *(f"max_pool{n}d_with_indices" for n in (1, 2, 3)),
    *("lp_pool1d", "lp_pool2d", "batch_norm", "group_norm", "instance_norm", "local_response_norm", "interpolate", "upsample"),
}
# functions that keep the rank and the layout of their first input with one
SAME_RANK = {"pad", "__getitem__", "cat", "concat", "concatenate", "narrow", "roll", "flip", "chunk", "split"}
PERMUTE = {"permute", "transpose", "swapaxes", "swapdims", "movedim", "moveaxis"}


class Flow(NamedTuple):
    """What is known of how a tensor was computed."""

    axes: layouts.Axes | None = None
    upstream: int = 0  # the recorded calls it is computed from, as bits
    floor: int | None = None  # the lowest precision it went through (RANKS; None: not from the model's data, a constant of its code)


class Dataflow(TorchFunctionMode):
    """While active, gives every tensor a torch function returns its Flow (the module docstring's
    rules); `flow(tensor)` reads it, `mark(tensor, call)` records that call `call` returned it,
    `data(tensors)` says which tensors are the model's own (inputs, parameters, buffers)."""

    def __init__(self, wide: bool = False) -> None:
        super().__init__()
        self._known: dict[int, tuple[weakref.ref, Flow]] = {}
        self.wide = wide  # the model's float32 data is computed with as float64 (readers/torch/widened.py)

    def flow(self, tensor) -> Flow:
        known = self._known.get(id(tensor))
        return known[1] if known is not None and known[0]() is tensor else Flow()

    def mark(self, tensor, call: int) -> None:
        known = self.flow(tensor)
        self._set(tensor, known._replace(upstream=known.upstream | (1 << call)))

    def data(self, tensors) -> None:
        """The model's inputs, parameters and buffers: what its outputs are computed from."""
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                rank = RANKS.get(dtype_name(tensor.dtype), 3)
                self._set(tensor, self.flow(tensor)._replace(floor=RANKS["float64"] if self.wide and rank == RANKS["float32"] else rank))

    def _set(self, tensor, flow: Flow) -> None:
        if isinstance(tensor, torch.Tensor):
            axes = flow.axes if flow.axes is not None and len(flow.axes) == tensor.ndim else None
            if axes is not None or flow.upstream or flow.floor is not None:
                self._known[id(tensor)] = (weakref.ref(tensor), flow._replace(axes=axes))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        output = func(*args, **kwargs)
        name = _name(func)
        inputs = [value for value in _flat([*args, *kwargs.values()]) if isinstance(value, torch.Tensor)]
        upstream, floors = 0, []
        for tensor in inputs:
            known = self.flow(tensor)
            upstream |= known.upstream
            if known.floor is not None:
                floors.append(known.floor)
        for result in _flat(output):
            if isinstance(result, torch.Tensor):
                floor = None
                if floors:  # computed from the model's data: as precise as its least precise step
                    floor = min(floors + ([RANKS.get(dtype_name(result.dtype), 3)] if result.is_floating_point() else []))
                axes = self._layout(name, args, kwargs, inputs, result)
                self._set(result, Flow(axes, upstream | self.flow(result).upstream, floor))
        return output

    def _layout(self, name, args, kwargs, inputs, result) -> layouts.Axes | None:
        first = inputs[0] if inputs else None
        axes = self.flow(first).axes  # None without a first tensor
        if name in FIRST:
            return axes if axes is not None and name in ("interpolate", "upsample") else layouts.channels_first(result.ndim)
        if name in ("T", "mT") and first is not None:  # the properties: every axis reversed, the last two swapped
            return layouts.transposed(axes, range(first.ndim - 1, -1, -1)) if name == "T" else layouts.swapped(axes, -2, -1)
        if name in PERMUTE and first is not None:
            return _permuted(name, axes, args[1:], kwargs, first.ndim)
        if name in SAME_RANK or name in ("contiguous", "clone"):
            return next((self.flow(t).axes for t in inputs if t.ndim == result.ndim and self.flow(t).axes is not None), None)
        if name == "linear" and first is not None and layouts.channels_last(axes) and result.ndim == first.ndim:
            return axes
        return next((self.flow(t).axes for t in inputs if tuple(t.shape) == tuple(result.shape) and self.flow(t).axes is not None), None)


def _name(func) -> str:
    """A torch function's name; a property's getter (`x.T`) by its property's name."""
    name = getattr(func, "__name__", "")
    if name == "__get__":
        return getattr(getattr(func, "__self__", None), "__name__", "")
    return name


# torch's keyword names of each permutation's arguments after the tensor, in their positional order
KEYWORDS = {
    "permute": ("dims",),
    "transpose": ("dim0", "dim1"),
    "swapdims": ("dim0", "dim1"),
    "swapaxes": ("axis0", "axis1"),
    "movedim": ("source", "destination"),
    "moveaxis": ("source", "destination"),
}


def _permuted(name, axes, rest, kwargs, ndim):
    """The layout after one of torch's axis permutations, from its arguments as given: positional
    first, the rest by keyword (x.transpose(1, dim1=3)); None where they cannot be read."""
    if axes is None:
        return None
    if name == "permute" and "dims" not in kwargs and not (len(rest) == 1 and isinstance(rest[0], (tuple, list))):
        rest = (tuple(rest),)  # x.permute(0, 2, 1): the dims as separate arguments
    given = [*rest, *(kwargs.get(key) for key in KEYWORDS[name][len(rest) :])]
    if len(given) != len(KEYWORDS[name]) or any(value is None for value in given):
        return None
    if name == "permute":
        return layouts.transposed(axes, [int(d) % ndim for d in given[0]])
    if name in ("movedim", "moveaxis"):
        return layouts.moved(axes, *given)
    return layouts.swapped(axes, int(given[0]), int(given[1]))


def _flat(value):
    """The tensors (and other values) inside nested tuples and lists."""
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _flat(item)
    else:
        yield value


class Reads(TorchFunctionMode):
    """While active, collects the names of the model's tensors that any torch function takes (the
    parameters and buffers its forward pass reads: a converter's leftover, a module never called,
    is not read). names: {id(tensor): its names} (a tied weight has two)."""

    def __init__(self, names: dict[int, list[str]]) -> None:
        super().__init__()
        self._names = names
        self.found: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for value in _flat([*args, *kwargs.values()]):
            if isinstance(value, torch.Tensor):
                self.found.update(self._names.get(id(value), ()))
        return func(*args, **kwargs)
