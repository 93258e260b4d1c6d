"""The float64 twin of a torch model whose code asks for float32 by hand: while `Widened` is active,
every float32 the code asks for is float64, so a careful model's upcasts (`x.float()`,
`x.to(torch.float32)`, `softmax(x, dim, dtype=torch.float32)`, a rotary table built with
`torch.arange(...).float()` inside `autocast(enabled=False)`) stay float64 in the twin instead of
rounding the twin to float32 there. The twin is the tolerances' reference run: a float32 step in it
would make its rows no better than the float32 run they are meant to measure. A cast below float32
(bfloat16, float16) is kept: it is the model's precision, not an upcast. The default dtype is
float64 for the block too, so a tensor the code builds without a dtype (an accumulator, a mask of
ones) is float64 as it is in float32 when the model runs in float32.

Through torch's public hook for every function call (`torch.overrides.TorchFunctionMode`); nothing
is patched. A reinterpreting `view(dtype)` is left alone: it reads bits, not values.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

NARROW, WIDE = torch.float32, torch.float64
# the legacy spellings `Tensor.type` takes
TYPE_NAMES = {"torch.FloatTensor": "torch.DoubleTensor"}


def _wide(value):
    """float32 (as a dtype or a legacy type name) as float64; anything else as it is."""
    if value is NARROW:
        return WIDE
    if isinstance(value, str):
        return TYPE_NAMES.get(value, value)
    if value is torch.FloatTensor:
        return torch.DoubleTensor
    return value


class Widened(TorchFunctionMode):
    """While active, float32 asked for by a dtype argument, `.float()`, `.to(...)`, `.type(...)` is float64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        elif func is not torch.Tensor.view:
            if "dtype" in kwargs:
                kwargs = {**kwargs, "dtype": _wide(kwargs["dtype"])}
            if func in (torch.Tensor.to, torch.Tensor.type):  # a dtype given by position: x.to(torch.float32), x.to(device, torch.float32)
                args = tuple(_wide(arg) for arg in args)
        return func(*args, **kwargs)


@contextlib.contextmanager
def widened() -> Iterator[None]:
    """float32 asked for inside the block is float64 (`Widened`), and so is the default dtype."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(WIDE)
    try:
        with Widened():
            yield
    finally:
        torch.set_default_dtype(default)
