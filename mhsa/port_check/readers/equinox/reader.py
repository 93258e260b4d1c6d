"""The Equinox half of the port checker (mhsa.port_check): read any `eqx.Module` in the same neutral
form as readers/torch/reader.py and readers/flax/reader.py.

Equinox keeps torch's layouts: a Linear's weight is (out, in), a Conv's (out, in, k...), so the
neutral names are the model's own paths joined by "." and only a Conv's bias, (out, 1, ...) in
Equinox, is reshaped to torch's (out,). Parameters are the model's floating-point arrays (Equinox
has no parameter type: a constant table kept as a float array counts too); an array reached at
two paths (one layer assigned twice) is one parameter, under its first path. Weights are written
with `eqx.tree_at`, the model is never changed.

A model is called as Equinox code calls it: per example, under `jax.vmap` over the first axis of
every input array, unless its class (or the instance) sets `port_check_batched = True`: then it is
called on the whole batch. Submodule outputs are captured by record.py, inside the traced program.
Equinox is an optional extra: a model that is an Equinox module while equinox cannot be imported is
refused in one line that says how to install it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mhsa.port_check.core import padding
from mhsa.port_check.core.cotangents import Direction
from mhsa.port_check.core.records import PortCheckError
from mhsa.port_check.core.structure import Inputs, Output, Traced, dtype_name, is_float_dtype
from mhsa.port_check.readers import EXTRAS, jax_program
from mhsa.port_check.readers.protocol import Model, ModuleInfo

try:
    import equinox as eqx
except ImportError:  # the optional extra: owns() says how to install it
    eqx = None  # type: ignore[assignment]

DTYPES = {"float32": jnp.float32, "float64": jnp.float64}
INSTALL = EXTRAS["equinox"]
# the attribute by which a model says it takes the whole batch (docs/port-check.md)
BATCHED = "port_check_batched"

# equinox.nn class name -> the neutral type name (by name: equinox is imported only when present)
TYPES = {
    "Linear": "Linear",
    "Embedding": "Embedding",
    "LayerNorm": "LayerNorm",
    "RMSNorm": "RMSNorm",
    "GroupNorm": "GroupNorm",
    "BatchNorm": "BatchNorm",
    "Conv": "Conv",
    "Dropout": "Dropout",
}

# where a norm written by hand keeps its epsilon (Equinox's and torch's spelling, Flax's, a library's RMSNorm)
EPS_NAMES = ("eps", "epsilon", "variance_epsilon")


def owns(model: object) -> bool:
    """Whether this reader reads `model`: an eqx.Module. One whose classes come from equinox while
    equinox cannot be imported is a PortCheckError saying how to install it (read off the class's
    MRO, without importing anything); so is a stateful model (_refuse_state)."""
    if not any(cls.__module__.split(".")[0] == "equinox" for cls in type(model).__mro__):
        return False
    try:
        library = importlib.import_module("equinox")
    except ImportError:
        raise PortCheckError(f"the model is an Equinox module ({type(model).__name__}) and equinox is not installed: {INSTALL}") from None
    if not isinstance(model, library.Module):
        return False
    _refuse_state(model)
    return True


def _refuse_state(model) -> None:
    """A PortCheckError naming the stateful layers of `model`, if any: an eqx.nn.StateIndex in it
    (BatchNorm's, say) keeps its values in an eqx.nn.State passed with every call, which the
    check does not read; without this the model would fail in the call for want of the state."""
    modules = _modules(model)
    stateful = sorted({path.rpartition(".")[0] for path, module in modules.items() if isinstance(module, eqx.nn.StateIndex)})
    if stateful:
        named = ", ".join(f"'{path or '(the model)'}' ({module_type(modules[path])})" for path in stateful)
        raise PortCheckError(
            f"{named} {'keeps its' if len(stateful) == 1 else 'keep their'} state in an eqx.nn.State, which the port check "
            "does not read yet: expected an Equinox model called without one"
        )


def _library_type(module: object) -> str | None:
    """The neutral type of an equinox.nn layer (Conv1d..3d are Conv), or GELU for an eqx.nn.Lambda of
    jax.nn.gelu; None for any other module."""
    if isinstance(module, eqx.nn.Lambda) and _gelu(module) is not None:
        return "GELU"
    for cls in type(module).__mro__:
        if cls.__module__.startswith("equinox.nn") and cls.__name__ in TYPES:
            return TYPES[cls.__name__]
    return None


def module_type(module: Any) -> str:
    """The neutral type name of one submodule (its class name where no neutral name exists)."""
    return _library_type(module) or type(module).__name__


def _gelu(module) -> str | None:
    """A Lambda's GELU approximation in torch's words ('tanh' or 'none'), None when it is no GELU:
    jax.nn.gelu itself (approximate=True by default) or a functools.partial of it."""
    fn: Any = module.fn
    keywords: dict = {}
    if isinstance(fn, functools.partial):
        keywords, fn = fn.keywords, fn.func
    if fn is not jax.nn.gelu:
        return None
    return "tanh" if keywords.get("approximate", True) else "none"


def _modules(model) -> dict[str, Any]:
    """path -> module: the model ("") and every submodule, a module reached twice under its first path."""
    found: dict[str, Any] = {"": model}
    seen = {id(model)}
    for path, module in _record().walk(model):
        if id(module) not in seen:
            seen.add(id(module))
            found[_join(path)] = module
    return found


def _names(model) -> list[str]:
    """The path each module of record.walk(model) is recorded under: its first path (a module
    reached twice, shared, is one module, as torch's named_modules and NNX name it)."""
    first: dict[int, str] = {}
    return [first.setdefault(id(module), _join(path)) for path, module in _record().walk(model)]


def _record():
    from mhsa.port_check.readers.equinox import record  # imports equinox: only once a model is known to be one

    return record


def _join(path) -> str:
    return ".".join(str(key) for key in path)


def describe(model: Model, inputs: Inputs, traced: Traced | None = None) -> dict[str, ModuleInfo]:
    """module path ("" for the model itself) -> its neutral type, the settings the lint compares in
    torch's conventions and its compute dtypes. inputs, traced: unused (an Equinox model knows its
    submodules without a call)."""
    return {path: ModuleInfo(module_type(module), _settings(module), _dtypes(module)) for path, module in _modules(model).items()}


def _dtypes(module) -> dict[str, str]:
    """{field: dtype name} for the module's fields that hold a floating dtype (a compute dtype the
    module's code casts to); {} when there are none."""
    found = {}
    for field in dataclasses.fields(module):
        value = getattr(module, field.name, None)
        if not field.name.startswith("_") and _is_float_dtype(value):
            found[field.name] = dtype_name(jnp.dtype(value))
    return found


def _is_float_dtype(value) -> bool:
    """Whether a field's value names a floating dtype (a dtype or a scalar type like jnp.float32; a
    string may name anything, an array is no dtype)."""
    if not isinstance(value, (np.dtype, type)):
        return False
    try:
        return bool(jnp.issubdtype(jnp.dtype(value), jnp.floating))
    except TypeError:
        return False


def _settings(module) -> dict:
    kind = _library_type(module)
    if kind is None:  # a layer written by hand: only what can be read without knowing it
        return next(({"eps": value} for value in (getattr(module, name, None) for name in EPS_NAMES) if isinstance(value, float)), {})
    if kind == "Linear":
        return {"bias": module.use_bias}
    if kind in ("LayerNorm", "RMSNorm"):
        settings: dict[str, Any] = {"eps": module.eps}
        if kind == "LayerNorm":
            settings["bias"] = module.use_bias
        return settings
    if kind == "GroupNorm":
        return {"eps": module.eps, "bias": module.channelwise_affine, "groups": module.groups}
    if kind == "BatchNorm":
        return {"eps": module.eps, "momentum": round(1.0 - module.momentum, 12)}  # Equinox's is Flax's: the old statistics' weight
    if kind == "Dropout":
        # inference=False still lets the call pass inference=True (or a key): the call decides
        return {"active": False if module.inference or module.p == 0 else None, "rate": module.p}
    if kind == "GELU":
        return {"approximate": _gelu(module)}
    if kind == "Conv":
        n = module.num_spatial_dims
        return {
            "bias": module.use_bias,
            "stride": tuple(module.stride),
            "padding": padding.explicit(module.padding, n, tuple(module.stride), tuple(module.dilation), tuple(module.kernel_size)),
            "dilation": tuple(module.dilation),
            "groups": module.groups,
            "kernel_size": tuple(module.kernel_size),
        }
    if kind == "Embedding":
        return {"padding_idx": None}  # Equinox's Embedding has no padding index
    return {}


@dataclasses.dataclass
class _Leaves:
    """A model taken apart: its distinct arrays (`leaves`, an array reached at two paths once), each
    one's neutral name (None: not floating point) and layout ("conv_bias" or None), and how to put
    (new) arrays back in their places (`rebuild`)."""

    leaves: list
    names: list[str | None]
    layouts: list[str | None]
    slots: list[int]
    treedef: Any
    static: Any

    def rebuild(self, leaves: list) -> Any:
        return eqx.combine(jax.tree_util.tree_unflatten(self.treedef, [leaves[slot] for slot in self.slots]), self.static)


def _leaves(model) -> _Leaves:
    dynamic, static = eqx.partition(model, eqx.is_array)
    flat, treedef = jax.tree_util.tree_flatten_with_path(dynamic)
    kinds = {path: module_type(module) for path, module in _modules(model).items()}
    leaves: list = []
    names: list[str | None] = []
    layouts: list[str | None] = []
    slots: list[int] = []
    index: dict[int, int] = {}
    for path, leaf in flat:
        if id(leaf) not in index:
            keys = tuple(_record()._key(entry) for entry in path)
            conv_bias = kinds.get(_join(keys[:-1])) == "Conv" and keys[-1] == "bias"
            index[id(leaf)] = len(leaves)
            leaves.append(leaf)
            names.append(_join(keys) if is_float_dtype(leaf.dtype) else None)
            layouts.append("conv_bias" if conv_bias else None)
        slots.append(index[id(leaf)])
    return _Leaves(leaves, names, layouts, slots, treedef, static)


def _to_torch(value: np.ndarray, layout: str | None) -> np.ndarray:
    return value.reshape(-1) if layout == "conv_bias" else value  # (out, 1, ...) -> (out,)


def parameters(model: Model) -> dict[str, np.ndarray]:
    """Every floating-point array of the model, named and laid out as torch's state_dict would."""
    tree = _leaves(model)
    return {name: _to_torch(jax_program.numpy(leaf), layout) for leaf, name, layout in zip(tree.leaves, tree.names, tree.layouts) if name is not None}


def load_parameters(model: Model, arrays: dict[str, np.ndarray]) -> Model:
    """A new model holding the neutral `arrays` (already matched and shape-checked by the caller),
    each in the dtype and shape of the array it replaces; written with eqx.tree_at."""
    tree = _leaves(model)
    leaves = list(tree.leaves)
    for slot, name in enumerate(tree.names):
        if name in arrays:
            leaves[slot] = jax_program.on_device(np.asarray(arrays[name]).reshape(leaves[slot].shape), leaves[slot].dtype)
    targets = {slot for slot, name in enumerate(tree.names) if name in arrays}
    if not targets:
        return model
    # every place of an array reached twice gets the new value; places are counted among all the
    # leaves, which eqx.tree_at's `where` sees (wrapped) in the same order
    arrays_at = [position for position, leaf in enumerate(jax.tree_util.tree_leaves(model)) if eqx.is_array(leaf)]
    places = [(arrays_at[index], slot) for index, slot in enumerate(tree.slots) if slot in targets]
    return eqx.tree_at(
        lambda m: [jax.tree_util.tree_leaves(m)[position] for position, _ in places],
        model,
        replace=[leaves[slot] for _, slot in places],
    )


def frozen(model: Model) -> frozenset[str]:
    """The parameters the model does not train: none that Equinox would say (it has no such flag: a
    model freezes an array with jax.lax.stop_gradient in its code, or its optimizer with a filter)."""
    return frozenset()


def tied(model: Model) -> dict[str, str]:
    """{name: the earlier name it shares its array with}: an array reached at two paths (one layer
    assigned twice; eqx.nn.Shared's copies are placeholders, not arrays)."""
    dynamic = eqx.filter(model, eqx.is_array)
    first: dict[int, str] = {}
    found = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(dynamic)[0]:
        name = _join(tuple(_record()._key(entry) for entry in path))
        if not is_float_dtype(leaf.dtype):
            continue
        if id(leaf) in first:
            found[name] = first[id(leaf)]
        else:
            first[id(leaf)] = name
    return found


def cast(model: Model, dtype: str) -> tuple[Model, list[str]]:
    """A copy of `model` with every floating-point array in `dtype` (an array reached twice stays one),
    and no line: Equinox's layers compute in their arrays' dtype (a dtype field of a model's own is
    reported by describe, not changed: it is static code). float64 turns on jax_enable_x64, without
    which JAX silently keeps float32."""
    if dtype == "float64" and not jax.config.read("jax_enable_x64"):
        jax.config.update("jax_enable_x64", True)
    target = DTYPES[dtype]
    tree = _leaves(model)

    def convert(leaf):  # in NumPy: an XLA convert would compile once per shape
        if not is_float_dtype(leaf.dtype) or jnp.result_type(leaf) == target:
            return leaf
        return jax_program.on_device(jax_program.numpy(leaf), target)

    return tree.rebuild([convert(leaf) for leaf in tree.leaves]), []


def batched(model: Model) -> bool:
    """Whether the model takes the whole batch (it sets port_check_batched = True) rather than one
    example; any value but True or False is refused, not taken as either."""
    value = getattr(model, BATCHED, False)
    if not isinstance(value, bool | np.bool_):
        raise PortCheckError(
            f"{type(model).__name__}.{BATCHED} = {value!r}: expected True (called on the whole batch) or False (per example, under jax.vmap)"
        )
    return bool(value)


def _program(model) -> jax_program.Program:
    tree = _leaves(model)
    names = _names(model)
    whole = batched(model)

    def call(leaves, inputs, eager=False):
        parameters = {id(leaf): name for leaf, name in zip(leaves, tree.names) if name is not None}  # a scan of them runs layer by layer
        return _record().run(tree.rebuild(leaves), names, inputs, whole, parameters, eager)

    return jax_program.Program(list(tree.leaves), tree.names, tree.layouts, [name is not None for name in tree.names], call)


def trace(model: Model, inputs: Inputs) -> Traced:
    """The model traced on `inputs` without running it (jax_program.trace): the arrays its forward
    pass reads and every call's output leaves with their shapes and layouts."""
    return jax_program.trace(_program(model), *_arrays(model, inputs))


def run(
    model: Model, inputs: Inputs, grads: Direction | None = None, each=None, traced: Traced | None = None, each_gradient=None, later=False
) -> tuple[list[Output], Any]:
    """Reader.run (readers/protocol.py), each leaf with its layout (readers/jaxpr.py): record.py
    records the outputs inside the program trace() compiled (traced, or traced now), run once on
    the arrays as they are now, the gradients with them."""
    traced = trace(model, inputs) if traced is None else traced
    return jax_program.run(_program(model), *_arrays(model, inputs), traced, grads, each, _to_torch, each_gradient, later)


def _arrays(model, inputs: Inputs) -> tuple[list, Any]:
    """(the input arrays as JAX arrays, rebuild) as structure.split_arrays gives them: floating
    inputs take the model's dtype, integer ones (token ids) stay as they are."""
    floats = [leaf for leaf in _leaves(model).leaves if is_float_dtype(leaf.dtype)]
    dtype = floats[0].dtype if floats else jnp.float32
    return jax_program.input_arrays(inputs, dtype)


def switched(model: Model, switch: str, path: str, value: Any = None) -> Model | None:
    """A copy of `model` with one likely cause of a difference switched, for the probes: "transpose"
    the (square) weight of the Linear at `path`, "eps" = value for the norm at `path`, "approximate"
    = value ('none' or 'tanh') for the GELU Lambda at `path`, "padding" = value ((low, high) per
    axis) for the Conv at `path`, or "load" the parameters of `value` ({neutral name: array}; path
    unused). None where the switch does not apply. Each copy is made with eqx.tree_at."""
    if switch == "load":
        return load_parameters(model, value)
    module = _modules(model).get(path)
    if module is None:
        return None
    kind = module_type(module)
    if switch == "transpose" and kind == "Linear":
        name = f"{path}.weight" if path else "weight"
        weight = parameters(model)[name]
        if weight.ndim != 2 or weight.shape[0] != weight.shape[1]:
            return None
        return load_parameters(model, {name: weight.T})
    if switch == "eps":
        field = next((name for name in EPS_NAMES if isinstance(getattr(module, name, None), float)), None)
        return None if field is None else _replaced(model, path, field, value)
    if switch == "approximate" and kind == "GELU":
        return _replaced(model, path, "fn", functools.partial(jax.nn.gelu, approximate=value == "tanh"))
    if switch == "padding" and kind == "Conv":
        return _replaced(model, path, "padding", tuple(tuple(pair) for pair in value))
    return None


def _replaced(model, path: str, field: str, value) -> Model:
    """A copy of `model` whose module at `path` has `field` set to `value`: that module copied without
    __init__ (as eqx.tree_at copies, which cannot reach a static field itself), then put in place
    with eqx.tree_at."""
    keys = path.split(".") if path else []

    def at(node):
        for key in keys:
            node = node[int(key)] if isinstance(node, (tuple, list)) else node[key] if isinstance(node, dict) else getattr(node, key)
        return node

    module = at(model)
    copy = object.__new__(type(module))
    for name in (f.name for f in dataclasses.fields(module)):
        object.__setattr__(copy, name, value if name == field else getattr(module, name))
    return copy if not keys else eqx.tree_at(at, model, copy)


float64_twin = jax_program.float64_twin(cast)  # a float64 copy for the block, JAX's float64 on for the block only
float64_twin_bytes = jax_program.float64_twin_bytes(parameters)


highest_precision = jax_program.highest_precision  # full float32 matmuls for the duration (no TF32)
