"""The PyTorch half of the port checker (mhsa.port_check): read any torch.nn.Module's
parameters, settings, per-submodule outputs and gradients in one framework-neutral form.

The neutral form is the exchange convention (DESIGN.md): parameters named and laid out as
in torch's state_dict, so this side needs no conversion. Module types are named as torch
names them ("Linear", "LayerNorm", "Conv", ...), settings in torch's conventions. NumPy in,
NumPy out; outputs are captured through forward hooks, removed again even on error.
"""

from __future__ import annotations

import contextlib
import copy
import typing
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

DTYPES = {"float32": torch.float32, "float64": torch.float64}

# module class -> the neutral type name the other side's port module uses too
TYPES = (
    (nn.Linear, "Linear"),
    (nn.Embedding, "Embedding"),
    (nn.LayerNorm, "LayerNorm"),
    (nn.RMSNorm, "RMSNorm"),
    (nn.GroupNorm, "GroupNorm"),
    (nn.modules.batchnorm._BatchNorm, "BatchNorm"),
    (nn.modules.conv._ConvNd, "Conv"),
    (nn.Dropout, "Dropout"),
    (nn.GELU, "GELU"),
)


def owns(model: object) -> bool:
    """Whether this backend can read `model`."""
    return isinstance(model, nn.Module)


def module_type(module: nn.Module) -> str:
    """The neutral type name of one submodule (its class name where no neutral name exists)."""
    return next((name for cls, name in TYPES if isinstance(module, cls)), type(module).__name__)


def describe(model: nn.Module, inputs: tuple) -> dict[str, dict]:
    """module path ("" for the model itself) -> {"type": neutral name, setting: value, ...}, with
    the settings the lint compares, in torch's conventions. inputs: unused here (Linen needs them)."""
    return {path: {"type": module_type(module), **_settings(module)} for path, module in model.named_modules()}


def _settings(module) -> dict:
    kind = module_type(module)
    if kind == "Linear":
        return {"bias": module.bias is not None}
    if kind in ("LayerNorm", "RMSNorm", "GroupNorm"):
        settings = {"eps": module.eps}
        if kind != "RMSNorm":
            settings["bias"] = getattr(module, "bias", None) is not None
        if kind == "GroupNorm":
            settings["groups"] = module.num_groups
        return settings
    if kind == "BatchNorm":
        return {"eps": module.eps, "momentum": module.momentum}
    if kind == "Dropout":
        return {"active": module.training and module.p > 0, "rate": module.p}
    if kind == "GELU":
        return {"approximate": module.approximate}
    if kind == "Conv":
        padding = module.padding.upper() if isinstance(module.padding, str) else tuple((p, p) for p in module.padding)
        return {
            "bias": module.bias is not None,
            "stride": tuple(module.stride),
            "padding": padding,
            "dilation": tuple(module.dilation),
            "groups": module.groups,
            "kernel_size": tuple(module.kernel_size),
        }
    if kind == "Embedding":
        return {"padding_idx": module.padding_idx}
    return {}


def parameters(model: nn.Module) -> dict[str, np.ndarray]:
    """Every floating-point parameter and persistent buffer (BatchNorm's running statistics), named
    and laid out as in state_dict: the neutral form itself."""
    return {name: value.detach().cpu().numpy().copy() for name, value in model.state_dict().items() if value.is_floating_point()}


def load_parameters(model: nn.Module, arrays: dict[str, np.ndarray]) -> nn.Module:
    """Write neutral arrays (already matched and shape-checked by the caller) into `model`, in
    its dtype; returns the model."""
    state = model.state_dict()
    with torch.no_grad():
        for name, value in arrays.items():
            state[name].copy_(torch.as_tensor(np.ascontiguousarray(value)))
    return model


def cast(model: nn.Module, dtype: str) -> nn.Module:
    """A copy of `model` with every floating-point parameter and buffer in `dtype`."""
    return copy.deepcopy(model).to(DTYPES[dtype])


def capture(model: nn.Module, inputs: tuple) -> list[tuple[str, np.ndarray]]:
    """Call `model(*inputs)` once and return (module path, output) for every submodule call in
    the order the calls return (a child before its parent; the model itself last, path "").
    A tuple output gives one entry per array, "path[i]". Hooks are removed even on error."""
    calls = []

    def hook(path):
        return lambda module, args, output: calls.extend(_flatten(path, output))

    handles = [module.register_forward_hook(hook(path)) for path, module in model.named_modules()]
    try:
        with torch.no_grad():
            model(*_tensors(model, inputs))
    finally:
        for handle in handles:
            handle.remove()
    return calls


def _flatten(path, output) -> list[tuple[str, np.ndarray]]:
    if isinstance(output, torch.Tensor):
        return [(path, output.detach().cpu().numpy().copy())]
    if isinstance(output, (tuple, list)):
        return [(f"{path}[{i}]", value.detach().cpu().numpy().copy()) for i, value in enumerate(output) if isinstance(value, torch.Tensor)]
    return []


def _tensors(model, inputs) -> list[torch.Tensor]:
    # floating inputs take the model's dtype, integer ones (token ids) stay as they are
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return [torch.as_tensor(x, dtype=dtype) if np.issubdtype(np.asarray(x).dtype, np.floating) else torch.as_tensor(x) for x in inputs]


def gradients(model: nn.Module, inputs: tuple) -> dict[str, np.ndarray]:
    """d (sum of every floating-point output) / d every parameter, neutral names and layout;
    a parameter the output does not reach gets zeros."""
    model.zero_grad(set_to_none=True)
    output = model(*_tensors(model, inputs))
    outputs = output if isinstance(output, (tuple, list)) else (output,)
    # a sum of tensors is a tensor (sum's start 0 makes the stub say int | Tensor)
    typing.cast(torch.Tensor, sum(value.sum() for value in outputs if isinstance(value, torch.Tensor) and value.is_floating_point())).backward()
    grads = {name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().numpy().copy() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


def switched(model: nn.Module, switch: str, path: str, value: float | None = None) -> nn.Module | None:
    """A copy of `model` with one likely cause of a difference switched, for the probes:
    "transpose" the (square) weight of the Linear at `path`, or "eps" = value for the norm
    at `path`. None where the switch does not apply."""
    model = copy.deepcopy(model)
    module: typing.Any = model.get_submodule(path)  # any layer: its weight or eps is looked up by name
    if switch == "transpose" and module_type(module) == "Linear" and module.weight.shape[0] == module.weight.shape[1]:
        with torch.no_grad():
            module.weight.copy_(module.weight.T.clone())
        return model
    if switch == "eps" and hasattr(module, "eps"):
        module.eps = value
        return model
    return None


@contextlib.contextmanager
def highest_precision() -> Iterator[None]:
    """Full float32 matmuls for the duration: TF32 off (it is on by default for cuDNN)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])
