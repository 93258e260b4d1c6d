"""The float64 twin of a torch model, for the tolerances' reference run: while `widened()` is open,
every float32 the model computes with is float64. The twin measures the model's own float32 error,
so a float32 step left in it would make its rows no better than the float32 run they measure.

- float32 the code asks for by hand is float64: `x.float()`, `x.to(torch.float32)`, `.type(...)`,
  a `dtype=torch.float32` argument (a softmax's, `torch.arange`'s), inside `autocast(enabled=False)`
  or not, and the default dtype (a tensor built without one: an accumulator, a mask of ones). A
  careful model's upcasts, in a norm, a softmax or a rotary table, stay float64.
- A float32 tensor a function is given is given as float64: a parameter (readers/torch/reader.py's
  float64_twin converts none, so that a large model's float64 weights exist one operation at a
  time, not all at once), or an array the
  model holds outside its parameters and buffers. Every float32 value is a float64 value, so this
  is exact. The tensor an in-place operation writes into (`cache.copy_(x)`, `cache[t] = x`) is
  left as it is: a copy would drop the write.
- A cast below float32 (bfloat16, float16) is kept: that is the model's precision, not an upcast.
  A reinterpreting `view(dtype)` is left alone: it reads bits, not values.
- Gradients are float64 too: each float64 copy of a float32 parameter that takes a gradient sums
  what backward gives it into one float64 gradient per parameter, handed over once every copy has
  given its part (`hand_over`, `gradient_of`); the parameter's own .grad is left alone. A lookup
  in such a parameter (an embedding) reads a float64 copy of the table, so that its backward sums
  in float64. What backward needs of a copy is not kept: the float32 tensor it copies is, and
  backward copies it again (torch's saved-tensor hooks), so that a large model's float64 weights
  never all exist.

Through torch's public hook for every function call (`torch.overrides.TorchFunctionMode`); nothing
is patched.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch.overrides import TorchFunctionMode

NARROW, WIDE = torch.float32, torch.float64
# the legacy spellings `Tensor.type` takes
TYPE_NAMES = {"torch.FloatTensor": "torch.DoubleTensor"}
_active = [0]  # how many widened() blocks are open


def active() -> bool:
    """Whether a widened() block is open: the reader's dataflow then takes float32 data as float64."""
    return _active[0] > 0


_sums: dict[torch.Tensor, torch.Tensor] = {}  # a float32 parameter -> its float64 gradient so far
_uses: dict[torch.Tensor, list[int]] = {}  # a float32 parameter -> [its copies that take a gradient, their parts summed so far]
_copies: dict[int, tuple[weakref.ref, torch.Tensor]] = {}  # id(float64 copy) -> (a reference to it, the float32 tensor it copies)
_taker: list = [None]  # (parameter, float64 gradient) -> None, handed each gradient once complete


def gradient_of(parameter: torch.Tensor) -> torch.Tensor | None:
    """The float64 gradient backward has summed for `parameter` through its float64 copies so far
    (None where none took one), handed over once: it is let go here."""
    _uses.pop(parameter, None)
    return _sums.pop(parameter, None)


def hand_over(taker):
    """Hand `taker(parameter, float64 gradient)` each parameter's gradient as soon as every copy
    that takes a part of it has given it (a copy the output does not reach gives none: gradient_of
    has what was summed), until the returned handle's remove()."""
    _taker[0] = taker

    class Handle:
        def remove(self) -> None:
            _taker[0] = None

    return Handle()


class _Widen(torch.autograd.Function):
    """A float32 parameter as float64, its gradient summed in float64 (gradient_of, hand_over) and
    not passed back: the parameter's own .grad stays as it was, and no float32 copy of a large
    gradient is made."""

    @staticmethod
    def forward(ctx, narrow: torch.Tensor) -> torch.Tensor:
        ctx.narrow = narrow
        _uses.setdefault(narrow, [0, 0])[0] += 1
        return narrow.to(WIDE)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        parameter = ctx.narrow
        uses = _uses.setdefault(parameter, [1, 0])
        uses[1] += 1
        known = _sums.get(parameter)
        if known is not None:
            known.add_(grad)  # a sum of this module's own (below)
        elif uses[1] < uses[0]:
            # more parts to come: summed into a tensor of its own, not into this one, which backward
            # may also pass to another branch (a sum's gradient), or which may be a broadcast view
            _sums[parameter] = grad.clone()
        else:
            _sums[parameter] = grad  # the whole gradient: read, never written (a large embedding's is 2 GB)
        if uses[1] == uses[0] and _taker[0] is not None:
            _taker[0](parameter, gradient_of(parameter))
        return None


def _wide(value):
    """float32 as float64: a dtype, a legacy type name, a float32 tensor (a float64 copy; a
    parameter's through _Widen), inside lists and tuples; anything else as it is."""
    if value is NARROW:
        return WIDE
    if isinstance(value, torch.Tensor):
        if value.dtype != NARROW:
            return value
        if not (value.is_leaf and torch.is_grad_enabled()):
            return value.to(WIDE)
        copy = _Widen.apply(value) if value.requires_grad else value.to(WIDE)
        _copies[id(copy)] = (weakref.ref(copy), value)
        return copy
    if isinstance(value, str):
        return TYPE_NAMES.get(value, value)
    if value is torch.FloatTensor:
        return torch.DoubleTensor
    if type(value) in (list, tuple) and any(isinstance(item, torch.Tensor) or item is NARROW for item in value):
        return type(value)(_wide(item) for item in value)
    return value


# what reads a tensor's metadata, not its values: nothing to widen (a copy of a large weight would be waste)
METADATA = {
    "size",
    "dim",
    "ndimension",
    "numel",
    "nelement",
    "stride",
    "storage_offset",
    "element_size",
    "data_ptr",
    "is_contiguous",
    "is_floating_point",
    "is_complex",
    "get_device",
    "untyped_storage",
    "__len__",
    "__hash__",
    "__format__",
    "register_hook",  # and what acts on the tensor itself: a hook on a copy would never be called
    "register_post_accumulate_grad_hook",
    "retain_grad",
}
# what hands its tensor's values on unchanged (a reader taking a gradient's view): an operation that
# computes with the result widens it then
HANDED_ON = {"detach", "cpu", "numpy"}
VALUE_PROPERTIES = {"T", "mT", "H", "mH", "real", "imag"}  # the properties whose value is the tensor's values


def _reads_values(func) -> bool:
    """Whether `func` computes with its tensors' values (not their shape, dtype or storage)."""
    name = getattr(func, "__name__", "")
    if name == "__get__":  # a property: x.shape, x.dtype, ... read metadata, x.T its values
        return getattr(getattr(func, "__self__", None), "__name__", "") in VALUE_PROPERTIES
    # a property set (p.grad = None) is the tensor's own
    return name not in METADATA and name not in HANDED_ON and name not in ("__set__", "__delete__")


# what only picks values out (a lookup, a slice): computed as the code asks, its result widened, the
# same values as picking them from a widened copy, without copying the whole table (a 1B model's
# embedding: 2 GB in float64) for the few rows it takes
PICKING = {"embedding", "__getitem__", "index_select", "gather", "take", "narrow", "select"}


def _in_place(func) -> bool:
    """Whether `func` writes into its first argument: `add_`, `copy_`, `__setitem__`, `__iadd__`, ..."""
    name = getattr(func, "__name__", "")
    return (name.endswith("_") and not name.startswith("__")) or name in ("__setitem__",) or (name.startswith("__i") and name.endswith("__"))


class _Copied(NamedTuple):
    """What backward keeps of a float64 copy of a float32 tensor, or of a view of one (a weight
    transposed for a matmul): that tensor, and where the view lies in the copy."""

    narrow: torch.Tensor
    size: tuple
    stride: tuple
    offset: int


def _pack(tensor: torch.Tensor):
    base = tensor if tensor._base is None else tensor._base
    known = _copies.get(id(base))
    if known is None or known[0]() is not base or base.stride() != known[1].stride():  # a copy laid out otherwise is kept
        return tensor
    return _Copied(known[1], tuple(tensor.shape), tensor.stride(), int(tensor.storage_offset()))


def _unpack(packed):
    """The saved tensor again: the float32 tensor copied anew (laid out as the first copy was), viewed as it was."""
    if not isinstance(packed, _Copied):
        return packed
    return packed.narrow.detach().to(WIDE).as_strided(packed.size, packed.stride, packed.offset)


def _differentiated(args) -> bool:
    """Whether a float32 parameter among `args` takes a gradient here (its lookup then reads a float64 copy)."""
    tensors = [arg for arg in args if isinstance(arg, torch.Tensor) and arg.dtype == NARROW]
    return torch.is_grad_enabled() and any(tensor.is_leaf and tensor.requires_grad for tensor in tensors)


class Widened(TorchFunctionMode):
    """While active, float32 asked for or given is float64 (the module docstring's rules)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.view:  # a reinterpreting view reads the bits as they are
            return func(*args, **kwargs)
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        if not _reads_values(func):
            return func(*args, **kwargs)
        if getattr(func, "__name__", "") in PICKING and not _differentiated(args):
            return _wide(func(*args, **kwargs))
        kept = args[:1] if args and _in_place(func) else ()  # the tensor written into stays itself
        args = (*kept, *(_wide(arg) for arg in args[len(kept) :]))
        kwargs = {key: value if key == "out" else _wide(value) for key, value in kwargs.items()}
        return func(*args, **kwargs)


@contextlib.contextmanager
def widened() -> Iterator[None]:
    """float32 asked for or given inside the block is float64 (`Widened`), and so is the default dtype."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(WIDE)
    _active[0] += 1
    try:
        with Widened(), torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
            yield
    finally:
        _active[0] -= 1
        torch.set_default_dtype(default)
        if not _active[0]:
            _sums.clear()  # a run that failed halfway: its partial gradients go
            _uses.clear()
            _copies.clear()
