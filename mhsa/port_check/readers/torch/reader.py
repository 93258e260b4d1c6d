"""The PyTorch half of the port checker (mhsa.port_check): read any torch.nn.Module's parameters,
settings, per-submodule outputs and gradients in one framework-neutral form, the exchange convention
(DESIGN.md): parameters named and laid out as in torch's state_dict, so this side needs no
conversion. Module types are named as torch names them ("Linear", "LayerNorm", "Conv", ...),
settings in torch's conventions. NumPy in, NumPy out; outputs are captured through forward hooks.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import typing
import weakref
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from mhsa import registry
from mhsa.port_check.core import progress
from mhsa.port_check.core.cotangents import Direction
from mhsa.port_check.core.structure import (
    Inputs,
    Output,
    Traced,
    as_inputs,
    dtype_name,
    flatten,
    is_float_dtype,
    leaves,
    map_inputs,
    split_arrays,
    to_numpy,
)
from mhsa.port_check.readers.protocol import ModuleInfo
from mhsa.port_check.readers.torch.dataflow import Dataflow, Reads
from mhsa.port_check.readers.torch.widened import active as widened_active
from mhsa.port_check.readers.torch.widened import gradient_of, widened
from mhsa.port_check.readers.torch.widened import hand_over as widened_hand_over

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


def _modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of every submodule but a parametrization's own (the code that computes a
    weight-normed weight, say: part of its module, not a layer of the model)."""
    return [(path, module) for path, module in model.named_modules() if "parametrizations" not in path.split(".")]


def describe(model: nn.Module, inputs: Inputs, traced: Traced | None = None) -> dict[str, ModuleInfo]:
    """Reader.describe (readers/protocol.py); `inputs` and `traced` unused (Linen needs them)."""
    return {path: ModuleInfo(module_type(module), _settings(module), _dtypes(module)) for path, module in _modules(model)}


def _dtypes(module) -> dict[str, str]:
    """{attribute: dtype name} for attributes holding a floating dtype (a compute
    dtype kept on the module: `.to()` casts parameters, not these); {} when there are none."""
    return {name: dtype_name(value) for name, value in vars(module).items() if isinstance(value, torch.dtype) and value.is_floating_point}


# where a norm written by hand keeps its epsilon (torch's own, a library's RMSNorm, Flax's spelling)
EPS_NAMES = ("eps", "variance_epsilon", "epsilon")


def _settings(module) -> dict:
    kind = next((name for cls, name in TYPES if isinstance(module, cls)), None)
    if kind is None:  # a layer written by hand: only what can be read without knowing it
        return next(({"eps": value} for value in (getattr(module, name, None) for name in EPS_NAMES) if isinstance(value, float)), {})
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
        return {
            "bias": module.bias is not None,
            "stride": tuple(module.stride),
            "padding": _padding(module),
            "dilation": tuple(module.dilation),
            "groups": module.groups,
            "kernel_size": tuple(module.kernel_size),
        }
    if kind == "Embedding":
        return {"padding_idx": module.padding_idx}
    return {}


def _padding(conv) -> tuple | str:
    """Explicit ((low, high), ...) per spatial axis, also for 'same' and 'valid' (torch allows
    'same' only with stride 1, where it pads dilation * (kernel - 1) split low-first)."""
    if conv.padding == "valid":
        return ((0, 0),) * len(conv.kernel_size)
    if conv.padding == "same":
        totals = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
        return tuple((total // 2, total - total // 2) for total in totals)
    return tuple((p, p) for p in conv.padding)


def frozen(model: nn.Module) -> frozenset[str]:
    """The parameters the model does not train (requires_grad=False), neutral names."""
    names = _neutral_names(model)
    return frozenset(names[name] for name, p in model.named_parameters() if not p.requires_grad and name in names)


def _neutral_names(model: nn.Module) -> dict[str, str]:
    """state_dict key -> neutral name: the key itself, but for parametrized tensors (torch's
    weight_norm and spectral_norm): weight_norm's two originals are `W_g` and `W_v` (the names of
    torch's legacy weight_norm, which Flax ports and library converters use); any other
    parametrization's original and state are read as the weight they compute (_computed): no entry."""
    names: dict[str, str | None] = {}
    for path, module in model.named_modules():
        if not parametrize.is_parametrized(module):
            continue
        prefix = f"{path}." if path else ""
        for tensor, chain in module.parametrizations.items():
            base = f"{prefix}parametrizations.{tensor}."
            weight_norm = len(chain) == 1 and type(chain[0]).__name__ == "_WeightNorm"
            for key in chain.state_dict():
                original = weight_norm and key in ("original0", "original1")
                names[base + key] = f"{prefix}{tensor}_{'g' if key == 'original0' else 'v'}" if original else None
    return {key: name for key in model.state_dict() if (name := names.get(key, key)) is not None}


def _computed(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(neutral name, module, tensor name) of every parametrized tensor read as the weight it
    computes: every parametrization but weight_norm, whose originals are read as they are."""
    found = []
    for path, module in model.named_modules():
        if parametrize.is_parametrized(module):
            for tensor, chain in module.parametrizations.items():
                if not (len(chain) == 1 and type(chain[0]).__name__ == "_WeightNorm"):
                    found.append((f"{path}.{tensor}" if path else tensor, module, tensor))
    return found


def tied(model: nn.Module) -> dict[str, str]:
    """{parameter name: the earlier name it shares its storage with}: tied weights (a language
    model's output layer that reuses the embedding), which state_dict lists under both names."""
    first: dict[tuple, str] = {}
    found = {}
    names = _neutral_names(model)
    for state_key, value in model.state_dict().items():
        name = names.get(state_key)
        if name is None or not value.is_floating_point() or value.numel() == 0:
            continue
        key = (value.data_ptr(), tuple(value.shape), tuple(value.stride()), value.dtype)
        if first.setdefault(key, name) != name:
            found[name] = first[key]
    return found


def parameters(model: nn.Module) -> dict[str, np.ndarray]:
    """Reader.parameters (readers/protocol.py) as state_dict holds them (BatchNorm's running
    statistics among them), parametrized tensors as _neutral_names says: read-only views (no copy: a
    large model's weights are not held twice); bfloat16 and float16 as float32 copies."""
    names = _neutral_names(model)
    found = {names[key]: _view(value) for key, value in model.state_dict().items() if value.is_floating_point() and key in names}
    with torch.no_grad():
        for name, module, tensor in _computed(model):
            found[name] = _view(getattr(module, tensor))
    return found


def _view(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if tensor.dtype not in (torch.float32, torch.float64):
        return to_numpy(tensor)
    array = tensor.numpy()
    array.flags.writeable = False
    return array


def load_parameters(model: nn.Module, arrays: dict[str, np.ndarray]) -> nn.Module:
    """Reader.load_parameters (readers/protocol.py), in the model's dtype; returns the model."""
    keys = {name: key for key, name in _neutral_names(model).items()}
    computed = {name for name, *_ in _computed(model)}
    state = model.state_dict()
    with torch.no_grad():
        for neutral, value in arrays.items():
            if neutral in computed:
                raise ValueError(f"'{neutral}' is computed by a parametrization: the weight it computes cannot be written")
            name = keys[neutral]
            value = np.ascontiguousarray(value)
            state[name].copy_(torch.as_tensor(value if value.flags.writeable else value.copy()))  # torch warns on a read-only view
    return model


def cast(model: nn.Module, dtype: str) -> tuple[nn.Module, list[str]]:
    """Reader.cast (readers/protocol.py): `model` itself when every floating-point parameter and
    buffer is in `dtype` already (the check changes nothing of it: run() leaves its .grad as it
    was), else a copy, each converted straight into it (no second copy in the old dtype); no line (a
    torch module holds no compute dtype of its own)."""
    target = DTYPES[dtype]
    tensors = [*model.parameters(), *model.buffers()]
    if all(t.dtype == target for t in tensors if t.is_floating_point()):
        return model, []
    memo: dict[int, typing.Any] = {}
    for t in tensors:  # a tied weight is one tensor: one entry, so the copy stays tied
        if t.is_floating_point() and id(t) not in memo:
            converted = t.detach().to(target)
            memo[id(t)] = nn.Parameter(converted, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else converted
    return copy.deepcopy(model, memo), []


def trace(model: nn.Module, inputs: Inputs) -> Traced:
    """Reader.trace (readers/protocol.py): eager torch knows what its forward pass reads only while it
    runs, so nothing is known before a run (every parameter counts as read), and `complete` runs it
    once where the check needs to know (a parameter left unpaired, the call order)."""
    return Traced(complete=functools.cache(lambda: _traced(model, inputs)))


def _traced(model: nn.Module, inputs: Inputs) -> Traced:
    """The model run once, without gradients: every parameter and buffer an operation takes
    (readers/torch/dataflow.py's Reads; a parametrized weight's originals read as its neutral name),
    and the submodules' paths in the order their calls return."""
    names: dict[int, list[str]] = {}
    keys = _neutral_names(model)
    # a parametrized weight (not weight norm's, read as its originals) is read as the weight it computes
    computed = {f"{name[: -len(tensor)]}parametrizations.{tensor}.": name for name, _, tensor in _computed(model)}
    for key, value in model.state_dict(keep_vars=True).items():
        name = keys.get(key) or next((neutral for prefix, neutral in computed.items() if key.startswith(prefix)), None)
        if name is not None and value.is_floating_point():
            names.setdefault(id(value), []).append(name)
    order: list[str] = []
    handles = [module.register_forward_hook(lambda module, args, output, path=path: order.append(path)) for path, module in _modules(model)]
    reads = Reads(names)
    try:
        with torch.no_grad(), reads, parametrize.cached():
            tensors = _tensors(model, inputs)
            model(*tensors.args, **tensors.kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return Traced(read=frozenset(reads.found), order=order)


def run(
    model: nn.Module,
    inputs: Inputs,
    grads: Direction | None = None,
    each=None,
    traced: Traced | None = None,
    each_gradient=None,
    later: bool = False,
) -> tuple[list[Output], typing.Any]:
    """Reader.run (readers/protocol.py): `model(*args, **kwargs)` called once, every output leaf
    recorded by forward hooks (removed even on error) with its layout and upstream calls
    (readers/torch/dataflow.py); with `grads` the gradients from one backward pass (zeros where the output does
    not reach a parameter). Each leaf goes through `each` as soon as its call returns (a float64 run
    compared as it goes): its value is then a view of the tensor, valid during that call only. Each
    gradient goes through `each_gradient` as soon as backward has accumulated it (a post-accumulate
    hook), its .grad let go after: a view that the taker may keep. `later`: the backward pass kept
    for the caller (its graph held; the forward is not run again). The model's .grad are left as
    they were; `traced` unused (eager torch has nothing to reuse)."""
    calls: list[Output] = []
    count = [0]
    copied: dict[int, tuple] = {}  # id(tensor) -> (weak references to it and to its copy, its version)
    flow = Dataflow(wide=widened_active())  # in the float64 twin float32 data counts as float64: it is computed with as such

    def copy_once(tensor: torch.Tensor) -> np.ndarray:
        """A tensor that several calls return (the model's logits are its head's) is copied once:
        the same object (alive, so its id is its own) at the same version (no in-place change since),
        while its copy is still held (by `calls`, or by `each` until it has reduced it)."""
        known = copied.get(id(tensor))
        array = known[1]() if known is not None and known[0]() is tensor and known[2] == tensor._version else None
        if array is not None:
            return array
        array = to_numpy(tensor)
        copied[id(tensor)] = (weakref.ref(tensor), weakref.ref(array), tensor._version)
        return array

    def hook(path):
        def record(module, args, output):
            if each is None:
                calls.extend(leaves(count[0], path, output, _is_tensor, copy_once, flow.flow))
            else:  # reduced at once, before anything can change the tensor in place: a view does
                calls.extend(each(leaf) for leaf in leaves(count[0], path, output, _is_tensor, _view, flow.flow))
            for _, value in flatten(output, _is_tensor):
                flow.mark(value, count[0])
            count[0] += 1
            progress.called(path)  # "call k of N" on the check's progress line, where one is shown

        return record

    handles = [module.register_forward_hook(hook(path)) for path, module in _modules(model)]
    saved = {p: p.grad for p in model.parameters()}

    def restore() -> None:
        for handle in handles:
            handle.remove()
        for p, grad in saved.items():
            p.grad = grad

    deferred = False
    try:
        with torch.set_grad_enabled(grads is not None):
            for p in saved:
                p.grad = None
            tensors = _tensors(model, inputs)
            with flow, parametrize.cached():  # a parametrized weight computed once, its gradient kept
                flow.data([*split_arrays(tensors)[0], *model.parameters(), *model.buffers()])
                computed = {name: getattr(module, tensor) for name, module, tensor in _computed(model)}
                for weight in computed.values():
                    if grads is not None and weight.requires_grad:
                        weight.retain_grad()
                output = model(*tensors.args, **tensors.kwargs)
            for handle in handles:
                handle.remove()
            if grads is None:
                return calls, None
            objective = _objective(output, grads, flow)
            del output
            names = _neutral_names(model)
            weights = {names[name]: p for name, p in model.named_parameters() if name in names} | computed
            if later:  # the graph kept until the caller differentiates (or lets the function go: .grad restored then)
                deferred = True
                return calls, _later(objective, weights, handles, restore)
            return calls, _backward(objective, weights, handles, each_gradient)
    finally:
        if not deferred:
            restore()


def _backward(objective: torch.Tensor, weights: dict[str, torch.Tensor], handles: list, each_gradient) -> dict[str, np.ndarray]:
    """run's backward pass: each gradient to `each_gradient` as it is complete ({} returned), or all of them returned."""
    given: set[str] = set()
    if each_gradient is not None:
        handles += _handed_over(weights, each_gradient, given)
    objective.backward()
    del objective
    left = {name: weight for name, weight in weights.items() if name not in given}
    found = {name: _view(_gradient(weight)) for name, weight in left.items()}
    if each_gradient is None:
        return found
    for name in list(found):  # a computed weight's, and a parameter's the output does not reach (zeros)
        each_gradient(name, found.pop(name))
    return {}


def _later(objective: torch.Tensor, weights: dict[str, torch.Tensor], handles: list, restore):
    """run's backward pass as a function of each_gradient, to be called once (with grad mode on);
    the model's .grad and hooks restored after it, or when the function is let go uncalled."""
    pending = [objective]
    finalizers: list[weakref.finalize] = []

    def differentiate(each_gradient) -> dict[str, np.ndarray]:
        try:
            with torch.enable_grad():
                return _backward(pending.pop(), weights, handles, each_gradient)
        finally:
            finalizers[0].detach()
            restore()

    finalizers.append(weakref.finalize(differentiate, restore))
    return differentiate


def _gradient(weight: torch.Tensor) -> torch.Tensor:
    """`weight`'s gradient: in the float64 twin the float64 one its copies summed (widened.py), else
    its .grad, zeros where the output does not reach it."""
    wide = gradient_of(weight) if widened_active() else None
    if wide is not None:
        return wide
    return weight.grad if weight.grad is not None else torch.zeros_like(weight)


def _handed_over(weights: dict[str, torch.Tensor], each_gradient, given: set[str]) -> list:
    """Each trained parameter among `weights` handed to `each_gradient` once backward has summed
    its gradient (a tied parameter, one tensor, once, under its first name); each name handed over
    joins `given`. In the float64 twin its copies sum it in float64 (widened.hand_over); else a
    post-accumulate hook takes its .grad, let go after. The handles to remove."""
    if widened_active():
        names = {weight: name for name, weight in reversed(weights.items())}  # a tied parameter: its first name

        def take(parameter: torch.Tensor, grad: torch.Tensor) -> None:
            if parameter in names:
                each_gradient(names[parameter], _view(grad))
                given.add(names[parameter])

        return [widened_hand_over(take)]

    def hook(name: str):
        def hand_over(parameter: torch.Tensor) -> None:
            each_gradient(name, _view(_gradient(parameter)))
            parameter.grad = None  # freed once the taker lets go of its view
            given.add(name)

        return hand_over

    return [weight.register_post_accumulate_grad_hook(hook(name)) for name, weight in weights.items() if weight.is_leaf and weight.requires_grad]


def _objective(output, direction: Direction, flow: Dataflow) -> torch.Tensor:
    """<r, output>: each floating-point leaf of the model's output weighted by its direction."""
    found = [(label, value) for label, value in flatten(output, _is_tensor) if _is_tensor(value) and value.is_floating_point()]
    records = [Output(-1, "", label, None, dtype_name(value.dtype), tuple(value.shape), flow.flow(value).axes) for label, value in found]
    weights = direction(records)
    terms = [(value * torch.as_tensor(weights[label], dtype=value.dtype)).sum() for label, value in found if label in weights]
    if not terms:
        raise ValueError("the model's output holds no floating-point tensor to differentiate")
    return typing.cast(torch.Tensor, sum(terms))  # a sum of tensors is a tensor (sum's start 0 makes the stub say int | Tensor)


def _is_tensor(value) -> bool:
    return isinstance(value, torch.Tensor)


def _tensors(model, inputs: Inputs) -> Inputs:
    """The inputs with every array as a tensor: floating arrays take the model's dtype, integer ones
    (token ids) stay as they are, other values pass through."""
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)

    def tensor(x):
        if isinstance(x, torch.Tensor):
            return x.to(dtype) if x.is_floating_point() else x
        x = np.asarray(x)
        return torch.as_tensor(x, dtype=dtype) if is_float_dtype(x.dtype) else torch.as_tensor(x)

    return map_inputs(as_inputs(inputs), tensor)


def switched(model: nn.Module, switch: str, path: str, value: float | str | None = None) -> nn.Module | None:
    """Reader.switched (readers/protocol.py): "transpose" the (square) weight of the Linear at `path`,
    "eps" = value for the norm at `path`, "approximate" = value ('none' or 'tanh') for the GELU."""
    model = copy.deepcopy(model)
    module: typing.Any = model.get_submodule(path)  # any layer: its weight or eps is looked up by name
    if switch == "transpose" and module_type(module) == "Linear" and module.weight.shape[0] == module.weight.shape[1]:
        with torch.no_grad():
            module.weight.copy_(module.weight.T.clone())
        return model
    eps = next((name for name in EPS_NAMES if isinstance(getattr(module, name, None), float)), None)
    if switch == "eps" and eps is not None:
        setattr(module, eps, value)
        return model
    if switch == "approximate" and module_type(module) == "GELU":
        module.approximate = value
        return model
    return None


@contextlib.contextmanager
def float64_twin(model: nn.Module, grads: bool = False) -> Iterator[nn.Module]:
    """Reader.float64_twin (readers/protocol.py) as `model` itself, float64 inside the block
    (readers/torch/widened.py): every float32 the model computes with is float64, its parameters as
    each operation reads them (a copy of one weight at a time, let go once the operation returns),
    so that a large model's float64 weights never exist all at once. A gradient does not flow back
    into the float32 parameter: its copies sum it in float64, and run() hands that over (widened.py's
    hand_over, gradient_of); `grads` changes nothing. Its buffers (running statistics, a cache its
    forward writes into) are converted in place, tensor by tensor, and back after. A model
    whose tensors share storage (views of one flat buffer) gets a float64 copy instead: converted
    one by one, they would come back apart."""
    if not _owns_storage(model):
        twin, _ = cast(model, "float64")
        with widened():
            yield twin
        return
    buffers = [
        (module, name, buffer)
        for module in model.modules()
        for name, buffer in module._buffers.items()
        if buffer is not None and buffer.is_floating_point() and buffer.dtype != torch.float64
    ]
    converted: dict[int, torch.Tensor] = {}  # id(buffer) -> its float64 version: a buffer registered twice stays one
    try:
        with torch.no_grad():
            for module, name, buffer in buffers:
                if id(buffer) not in converted:
                    converted[id(buffer)] = buffer.to(torch.float64)
                module._buffers[name] = converted[id(buffer)]
        with widened():
            yield model
    finally:
        for module, name, buffer in buffers:
            module._buffers[name] = buffer


def float64_twin_bytes(model: nn.Module, grads: bool = False) -> int:
    """Reader.float64_twin_bytes (readers/protocol.py): the largest weight's float64 copy (with
    `grads` also copied again in backward, and its float64 gradient), the buffers converted in
    place; a model whose tensors share storage: a float64 copy of all of them (and float64 gradients)."""
    weights = [p.numel() for p in model.parameters() if p.is_floating_point()]
    buffers = sum(b.numel() for b in model.buffers() if b.is_floating_point() and b.dtype != torch.float64)
    if not _owns_storage(model):
        return 8 * (sum(weights) * (2 if grads else 1) + buffers)
    return 8 * (max(weights, default=0) * (3 if grads else 1) + buffers)


def _owns_storage(model: nn.Module) -> bool:
    """Whether each floating-point parameter and buffer of `model` (each tensor once) is the whole
    of a storage no other of them uses."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()}
    storages = set()
    for t in tensors.values():
        storage = t.untyped_storage()
        if storage.data_ptr() in storages or storage.nbytes() != t.numel() * t.element_size():
            return False
        storages.add(storage.data_ptr())
    return True


def highest_precision() -> contextlib.AbstractContextManager[None]:
    """Reader.highest_precision: TF32 off (on by default for cuDNN) by the torch backend's switch."""
    return registry.get("torch").module("device").full_precision()
