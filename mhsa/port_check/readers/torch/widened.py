"""The float64 twin of a torch model, for the tolerances' reference run: while `widened()` is open,
every float32 the model computes with is float64. The twin measures the model's own float32 error,
so a float32 step left in it would make its rows no better than the float32 run they measure.

- float32 the code asks for by hand is float64: `x.float()`, `x.to(torch.float32)`, `.type(...)`,
  a `dtype=torch.float32` argument (a softmax's, `torch.arange`'s), inside `autocast(enabled=False)`
  or not, and the default dtype (a tensor built without one: an accumulator, a mask of ones). A
  careful model's upcasts, in a norm, a softmax or a rotary table, stay float64.
- A float32 tensor a function is given is given as float64: a parameter the reader has not
  converted (readers/torch/reader.py's float64_twin converts none for a forward pass, so that a
  large model's float64 weights exist one operation at a time, not all at once), or an array the
  model holds outside its parameters and buffers. Every float32 value is a float64 value, so this
  is exact. The tensor an in-place operation writes into (`cache.copy_(x)`, `cache[t] = x`) is
  left as it is: a copy would drop the write.
- A cast below float32 (bfloat16, float16) is kept: that is the model's precision, not an upcast.
  A reinterpreting `view(dtype)` is left alone: it reads bits, not values.

Through torch's public hook for every function call (`torch.overrides.TorchFunctionMode`); nothing
is patched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

NARROW, WIDE = torch.float32, torch.float64
# the legacy spellings `Tensor.type` takes
TYPE_NAMES = {"torch.FloatTensor": "torch.DoubleTensor"}
_active = [0]  # how many widened() blocks are open


def active() -> bool:
    """Whether a widened() block is open: the reader's dataflow then takes float32 data as float64."""
    return _active[0] > 0


def _wide(value):
    """float32 as float64: a dtype, a legacy type name, a float32 tensor (a float64 copy), inside
    lists and tuples; anything else as it is."""
    if value is NARROW:
        return WIDE
    if isinstance(value, torch.Tensor):
        return value.to(WIDE) if value.dtype == NARROW else value
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
VALUE_PROPERTIES = {"T", "mT", "H", "mH", "real", "imag"}  # the properties whose value is the tensor's values


def _reads_values(func) -> bool:
    """Whether `func` computes with its tensors' values (not their shape, dtype or storage)."""
    name = getattr(func, "__name__", "")
    if name == "__get__":  # a property: x.shape, x.dtype, ... read metadata, x.T its values
        return getattr(getattr(func, "__self__", None), "__name__", "") in VALUE_PROPERTIES
    return name not in METADATA and name not in ("__set__", "__delete__")  # a property set (p.grad = None) is the tensor's own


# what only picks values out (a lookup, a slice): computed as the code asks, its result widened, the
# same values as picking them from a widened copy, without copying the whole table (a 1B model's
# embedding: 2 GB in float64) for the few rows it takes
PICKING = {"embedding", "__getitem__", "index_select", "gather", "take", "narrow", "select"}


def _in_place(func) -> bool:
    """Whether `func` writes into its first argument: `add_`, `copy_`, `__setitem__`, `__iadd__`, ..."""
    name = getattr(func, "__name__", "")
    return (name.endswith("_") and not name.startswith("__")) or name in ("__setitem__",) or (name.startswith("__i") and name.endswith("__"))


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
        if getattr(func, "__name__", "") in PICKING:
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
        with Widened():
            yield
    finally:
        _active[0] -= 1
        torch.set_default_dtype(default)
