"""The Flax half of the port checker (mhsa.port_check): read any Flax NNX module, or a Linen module
with its variables as the pair (module, variables), in the neutral form of readers/torch/reader.py.

The neutral form is the exchange convention (DESIGN.md): parameters named and laid out as in torch's
state_dict (Dense/Linear kernels transposed (in, out) -> (out, in), Conv kernels (k..., in, out) ->
(out, in, k...), scale and embedding -> weight, BatchNorm's mean/var -> running_mean/running_var),
settings in torch's conventions (BatchNorm momentum 1 - Flax's). NumPy in, NumPy out. NNX outputs
are captured through a recording subclass of each submodule's class, Linen's by an interceptor.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx
from flax.core import unfreeze
from flax.traverse_util import flatten_dict

from mhsa.port_check.core import padding
from mhsa.port_check.core.cotangents import Direction
from mhsa.port_check.core.structure import Inputs, Output, Traced, dtype_name, split_arrays
from mhsa.port_check.readers import jax_program, marks
from mhsa.port_check.readers.protocol import Model, ModuleInfo

DTYPES = {"float32": jnp.float32, "float64": jnp.float64}

# (NNX class, Linen class) -> the neutral type name the other side's port module uses too
TYPES = (
    ((nnx.Linear, nn.Dense), "Linear"),
    ((nnx.Embed, nn.Embed), "Embedding"),
    ((nnx.LayerNorm, nn.LayerNorm), "LayerNorm"),
    ((nnx.RMSNorm, nn.RMSNorm), "RMSNorm"),
    ((nnx.GroupNorm, nn.GroupNorm), "GroupNorm"),
    ((nnx.BatchNorm, nn.BatchNorm), "BatchNorm"),
    ((nnx.Conv, nn.Conv), "Conv"),
    ((nnx.Dropout, nn.Dropout), "Dropout"),
)

# neutral type -> {Flax variable name: (torch name, layout)}; a variable of a type not listed
# keeps its own name and layout
LAYOUTS: dict[str, dict[str, tuple[str, str | None]]] = {
    "Linear": {"kernel": ("weight", "linear"), "bias": ("bias", None)},
    "Embedding": {"embedding": ("weight", None)},
    "LayerNorm": {"scale": ("weight", None), "bias": ("bias", None)},
    "RMSNorm": {"scale": ("weight", None)},
    "GroupNorm": {"scale": ("weight", None), "bias": ("bias", None)},
    "BatchNorm": {"scale": ("weight", None), "bias": ("bias", None), "mean": ("running_mean", None), "var": ("running_var", None)},
    "Conv": {"kernel": ("weight", "conv"), "bias": ("bias", None)},
}


def owns(model: object) -> bool:
    """Whether this backend can read `model`: an nnx.Module, or a Linen (module, variables) pair."""
    return isinstance(model, nnx.Module) or _is_linen(model)


def _is_linen(model) -> bool:
    return isinstance(model, tuple) and len(model) == 2 and isinstance(model[0], nn.Module)


def module_type(module: object) -> str:
    """The neutral type name of one submodule (its class name where no neutral name exists)."""
    return next((name for cls, name in TYPES if isinstance(module, cls)), type(module).__name__)


def describe(model: Model, inputs: Inputs, traced: Traced | None = None) -> dict[str, ModuleInfo]:
    """Reader.describe (readers/protocol.py): Linen's submodules exist only while the model is called,
    so a Linen model is traced once on `inputs` (or `traced` is read)."""
    modules = _modules(model, inputs, traced)
    return {path: ModuleInfo(module_type(module), _settings(module), _dtypes(module)) for path, module in modules.items()}


def _dtypes(module) -> dict[str, str]:
    """{attribute: dtype name} of the module's floating compute dtypes (Flax layers compute in `dtype`
    whatever their parameters' dtype): a Linen module's dataclass fields, an NNX module's attributes;
    dtype objects only (a string may name anything), not param_dtype."""
    if isinstance(module, nn.Module):
        items = [(field.name, getattr(module, field.name, None)) for field in dataclasses.fields(module)]
    else:
        items = list(vars(module).items())
    # param_dtype only says how parameters are created: the check casts them itself
    return {
        name: dtype_name(jnp.dtype(value))
        for name, value in items
        if not name.startswith("_") and name != "param_dtype" and not isinstance(value, str) and _is_float_dtype(value)
    }


# where a norm written by hand keeps its epsilon (Flax's spelling, torch's, a library's RMSNorm)
EPS_NAMES = ("epsilon", "eps", "variance_epsilon")


def _settings(module) -> dict:
    kind = next((name for cls, name in TYPES if isinstance(module, cls)), None)
    if kind is None:  # a layer written by hand: only what can be read without knowing it
        return next(({"eps": value} for value in (getattr(module, name, None) for name in EPS_NAMES) if isinstance(value, float)), {})
    if kind == "Linear":
        return {"bias": module.use_bias}
    if kind in ("LayerNorm", "RMSNorm", "GroupNorm"):
        settings = {"eps": module.epsilon}
        if kind != "RMSNorm":
            settings["bias"] = module.use_bias
        if kind == "GroupNorm":
            settings["groups"] = module.num_groups
        return settings
    if kind == "BatchNorm":
        return {"eps": module.epsilon, "momentum": round(1.0 - module.momentum, 12)}
    if kind == "Dropout":
        # Linen's `deterministic` is often passed at call time; None means the call decides
        active = None if module.deterministic is None else (not module.deterministic and module.rate > 0)
        return {"active": active, "rate": module.rate}
    if kind == "Conv":
        n = len(module.kernel_size)
        return {
            "bias": module.use_bias,
            "stride": _per_dim(module.strides, n),
            "padding": padding.explicit(
                module.padding, n, _per_dim(module.strides, n), _per_dim(module.kernel_dilation, n), tuple(module.kernel_size)
            ),
            "dilation": _per_dim(module.kernel_dilation, n),
            "groups": module.feature_group_count,
            "kernel_size": tuple(module.kernel_size),
        }
    if kind == "Embedding":
        return {"padding_idx": None}  # Flax's Embed has no padding index
    return {}


def _per_dim(value, n) -> tuple:
    return (1,) * n if value is None else (value,) * n if isinstance(value, int) else tuple(value)


def _modules(model, inputs=None, traced: Traced | None = None) -> dict:
    """path -> module: every submodule of an NNX module, or of a Linen module as called once (only
    traced: the modules are known at trace time and nothing is compiled)."""
    if _is_linen(model):
        traced = trace(model, inputs) if traced is None or traced.modules is None else traced
        return dict(traced.modules or {})
    return {_join(path): module for path, module in nnx.iter_modules(model)}


def _join(path) -> str:
    return ".".join(str(key) for key in path)


def parameters(model: Model) -> dict[str, np.ndarray]:
    """Every parameter and batch statistic, named and laid out as torch's state_dict would."""
    return {name: jax_program.numpy(value) for name, value in neutral(variable_names(model), _variables(model)).items()}


def _variables(model) -> dict:
    """The model's parameters (and batch statistics) as a nested dict of arrays."""
    if _is_linen(model):
        return _merge(*(dict(model[1].get(collection, {})) for collection in ("params", "batch_stats")))
    return nnx.to_pure_dict(nnx.state(model, nnx.Any(nnx.Param, nnx.BatchStat)))


def _merge(a, b):
    merged = {key: dict(value) if isinstance(value, dict) else value for key, value in a.items()}
    for key, value in b.items():
        merged[key] = _merge(merged.get(key, {}), value) if isinstance(value, dict) else value
    return merged


def variable_names(model: Model) -> dict[tuple, tuple[str, str | None]]:
    """Flax variable path -> (neutral name, layout) for every parameter and batch statistic."""
    types = _types(model)
    return {path: _named(types, path) for path in flatten_dict(_variables(model))}


def _named(types: dict[str, str], path: tuple) -> tuple[str, str | None]:
    """(neutral name, layout) of the variable at `path` (its module's keys, then its own name), by
    its module's neutral type in `types` (LAYOUTS; a Conv's "Conv<n>", n its spatial axes, for its
    layout); a variable of a type not listed keeps its own name and layout."""
    kind = types.get(_join(path[:-1]), "")
    own, layout = LAYOUTS.get(kind.rstrip("0123456789"), {}).get(str(path[-1]), (str(path[-1]), None))
    if layout == "conv":
        layout = f"conv{kind[len('Conv') :] or 2}"
    return _join(path[:-1] + (own,)), layout


def neutral(names: dict[tuple, tuple[str, str | None]], tree) -> dict[str, np.ndarray]:
    """A tree shaped like (part of) the model's variables (the variables, their gradients, a moment)
    -> {neutral name: array in torch's layout}, `names` as variable_names gives them; a leaf that is
    no array (optax.MaskedNode) is left out."""
    pure = nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree
    out = {}
    for path, value in flatten_dict(pure).items():
        if path in names and hasattr(value, "shape"):
            name, layout = names[path]
            out[name] = _to_torch(np.asarray(value), layout)
    return out


def _types(model) -> dict[str, str]:
    """module path -> neutral type, for naming variables, a Conv's as "Conv<n>" (n spatial axes).
    Linen's submodules exist only while called, so there the type is read off the variables: a
    `kernel` of two axes more than the module's stacked ones (stacked_axes) is a Dense, a deeper
    one a Conv, an `embedding` an Embed, `scale` a norm, `mean` and `var` BatchNorm statistics."""
    if not _is_linen(model):
        return {_join(path): _kind(module) for path, module in nnx.iter_modules(model)}
    variables = flatten_dict(_variables(model))
    stacked = stacked_axes(variables)
    types = {}
    for path, value in variables.items():
        module, name = _join(path[:-1]), path[-1]
        if name == "kernel":
            axes = np.ndim(value) - stacked.get(module, 0)
            types[module] = "Linear" if axes == 2 else f"Conv{axes - 2}"
        elif name == "embedding":
            types[module] = "Embedding"
        elif name in ("mean", "var"):
            types[module] = "BatchNorm"
        elif name == "scale":
            types.setdefault(module, "LayerNorm")
    return types


def _kind(module) -> str:
    kind = module_type(module)
    return f"Conv{len(module.kernel_size)}" if kind == "Conv" else kind


# the variables whose own shape is a vector: an extra leading axis of theirs is a stack of layers
VECTORS = ("bias", "scale", "mean", "var")


def stacked_axes(variables: dict[tuple, Any]) -> dict[str, int]:
    """{Linen module path: how many leading axes its variables have for a stack of layers (nn.scan
    with variable_axes={"params": 0}: 1)}: read off its vectors (a bias (L, out) where a layer's is
    (out,)); a module without one (a Dense without bias) takes its siblings' count, then its
    ancestors' siblings', as a stack's modules all have one."""
    own: dict[str, int] = {}
    for path, value in variables.items():
        if path[-1] in VECTORS:
            own[_join(path[:-1])] = max(own.get(_join(path[:-1]), 0), np.ndim(value) - 1)
    found = {}
    for module in {_join(path[:-1]) for path in variables}:
        if module in own:
            found[module] = own[module]
            continue
        parts = module.split(".")
        for depth in range(len(parts) - 1, -1, -1):
            scope = ".".join(parts[:depth])
            near = [count for other, count in own.items() if other.startswith(scope + ".") or not scope]
            if near:
                found[module] = max(near)
                break
    return found


def _to_torch(value, layout):
    """A kernel in torch's layout, any leading stacked axes kept: a Dense's (in, out) -> (out, in) (its
    last two axes swapped), a Conv's (k..., in, out) -> (out, in, k...) ("conv<n>": n spatial axes)."""
    if layout == "linear":
        return np.swapaxes(value, -1, -2)
    if layout and layout.startswith("conv"):
        n = int(layout[4:])
        lead = value.ndim - n - 2
        return value.transpose(*range(lead), value.ndim - 1, value.ndim - 2, *range(lead, lead + n))
    return value


def _from_torch(value, layout):
    """A kernel in Flax's layout (_to_torch undone): (out, in) -> (in, out), (out, in, k...) -> (k..., in, out)."""
    if layout == "linear":
        return np.swapaxes(value, -1, -2)
    if layout and layout.startswith("conv"):
        n = int(layout[4:])
        lead = value.ndim - n - 2
        return value.transpose(*range(lead), *range(lead + 2, lead + 2 + n), lead + 1, lead)
    return value


def load_parameters(model: Model, arrays: dict[str, np.ndarray]) -> Model:
    """Write neutral arrays (already matched and shape-checked by the caller) into `model`, each
    in the dtype of the variable it replaces; returns the model (for Linen a new pair)."""
    native = {name: (path, layout) for path, (name, layout) in variable_names(model).items()}
    if _is_linen(model):
        module, variables = model
        variables = unfreeze(dict(variables))  # fresh dicts to write into: the caller's pair is left as it was
        params = flatten_dict(variables.get("params", {}))
        for name, value in arrays.items():
            path, layout = native[name]
            tree = variables["params" if path in params else "batch_stats"]
            for key in path[:-1]:
                tree = tree[key]
            tree[path[-1]] = jax_program.on_device(_from_torch(value, layout), tree[path[-1]].dtype)
        if isinstance(model, LinenSwitched):  # a probe's switches stay with the pair
            pair = LinenSwitched((module, variables))
            pair.switches = model.switches
            return pair
        return module, variables
    for name, value in arrays.items():
        path, layout = native[name]
        variable = _variable(model, path)
        variable[...] = jax_program.on_device(_from_torch(value, layout), variable[...].dtype)
    return model


def _variable(model, path):
    for key in path:
        model = model[key] if isinstance(key, int) else getattr(model, key)
    return model


def frozen(model: Model) -> frozenset[str]:
    """The parameters the model does not train: none that Flax would say (it has no such flag)."""
    return frozenset()


def tied(model: Model) -> dict[str, str]:
    """Tied parameters under a second name: none here (an NNX variable shared by two modules is
    one entry of the model's state; Linen shares modules, not parameters)."""
    return {}


def cast(model: Model, dtype: str) -> tuple[Model, list[str]]:
    """Reader.cast (readers/protocol.py) as a copy (the arrays already in `dtype` shared: JAX arrays
    are immutable). The compute dtype changes too, else a layer built with dtype=float32 still
    computes in float32: NNX's in every submodule's `dtype` and `param_dtype`, Linen's (frozen
    dataclasses) in the top module's `dtype` field, which library models hand down. float64 turns on
    jax_enable_x64, without which JAX silently keeps float32."""
    if dtype == "float64" and not jax.config.read("jax_enable_x64"):
        jax.config.update("jax_enable_x64", True)
    target = DTYPES[dtype]

    def convert(leaf):  # in NumPy: an XLA convert would compile once per shape
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating) or jnp.result_type(leaf) == target:
            return leaf  # integers, booleans, PRNG keys; and what is in the dtype already, shared with the model
        return jax_program.on_device(jax_program.numpy(leaf), target)

    changed = []
    if _is_linen(model):
        module = model[0]
        current = getattr(module, "dtype", None) if "dtype" in {field.name for field in dataclasses.fields(module)} else None
        if _is_float_dtype(current) and jnp.dtype(current) != jnp.dtype(target):
            changed.append(f"'(the model)' dtype {dtype_name(jnp.dtype(current))} -> {dtype}")
            module = module.clone(dtype=target)
        return (module, jax.tree.map(convert, unfreeze(dict(model[1])))), changed
    model = nnx.clone(model)
    for path, module in nnx.iter_modules(model):
        for name in ("dtype", "param_dtype"):
            current = getattr(module, name, None)
            if _is_float_dtype(current) and jnp.dtype(current) != jnp.dtype(target):
                if name == "dtype":
                    changed.append(f"'{_join(path) or '(the model)'}' dtype {dtype_name(jnp.dtype(current))} -> {dtype}")
                setattr(module, name, target)
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(convert, state)), changed


def _is_float_dtype(value) -> bool:
    """Whether an attribute's value names a floating dtype (a dtype, a scalar type like
    jnp.float32, or its name); an array or a submodule is no dtype."""
    if not isinstance(value, (np.dtype, type, str)):
        return False
    try:
        return jnp.issubdtype(jnp.dtype(value), jnp.floating)
    except (TypeError, ValueError):
        return False


# what a model that cannot be traced raises while it is
UNTRACEABLE = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.TracerBoolConversionError,
)


def _key(entry) -> Any:
    return getattr(entry, "key", getattr(entry, "idx", getattr(entry, "name", entry)))


def _program(model) -> jax_program.Program:
    """The model as a program of its variables: a Linen pair's every collection, an NNX module's
    parameters, batch statistics and the rest (nnx.split's), the parameters differentiated."""
    types = _types(model)
    linen = _is_linen(model)
    graphdef = None
    if linen:
        module, variables = model
        tree: Any = unfreeze(dict(variables))
    else:
        graphdef, *tree = nnx.split(model, nnx.Param, nnx.BatchStat, ...)
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    paths = [tuple(_key(entry) for entry in path) for path, _ in flat]
    # a path is (collection, keys...) in Linen, (0 parameters, 1 batch statistics or 2 the rest, keys..., "value") in NNX
    kinds = [{"params": 0, "batch_stats": 1}.get(path[0], 2) if linen else path[0] for path in paths]
    keys = [path[1:-1] if not linen and path[-1] == "value" else path[1:] for path in paths]
    named = [_named(types, key) if kind < 2 else (None, None) for key, kind in zip(keys, kinds)]
    names, layouts = [name for name, _ in named], [layout for _, layout in named]
    program = jax_program.Program([leaf for _, leaf in flat], names, layouts, [kind == 0 for kind in kinds], None, modules={} if linen else None)
    switches = getattr(model, "switches", {})

    def call(leaves, inputs, eager=False):
        calls = marks.Calls(eager)
        arrays, rebuild = split_arrays(inputs)

        def forward(leaves, arrays):
            variables = jax.tree_util.tree_unflatten(treedef, leaves)
            given = rebuild(arrays)
            if linen:
                return _linen_run((module, variables), given, calls, program.modules, switches)
            instance = nnx.merge(graphdef, *variables)
            with _wrapped(instance, calls):
                return instance(*given.args, **given.kwargs)

        parameters = {id(leaf): name for leaf, name in zip(leaves, program.names) if name is not None}  # a scan of them runs layer by layer
        return marks.run(forward, (leaves, arrays), parameters, calls)

    program.call = call
    return program


def trace(model: Model, inputs: Inputs) -> Traced:
    """Reader.trace (readers/protocol.py) by jax_program.trace, without running the model. A model
    that cannot be traced gives what is known without it (every variable read)."""
    program = _program(model)
    arrays, rebuild = _arrays(model, inputs)
    try:
        return jax_program.trace(program, arrays, rebuild)
    except UNTRACEABLE:
        if not _is_linen(model):
            return Traced()
        program.call(program.leaves, rebuild(arrays), eager=True)  # Linen's modules exist only while called: once, eagerly
        return Traced(modules=program.modules)


def run(
    model: Model, inputs: Inputs, grads: Direction | None = None, each=None, traced: Traced | None = None, each_gradient=None, later=False
) -> tuple[list[Output], Any]:
    """Reader.run (readers/protocol.py) as one compiled program (the forward pass once, its outputs
    and the gradients), each leaf with its layout (readers/jaxpr.py), through `each` once it has run;
    calls recorded by _wrapped (NNX) or _linen_run (Linen), a module called through a method other
    than __call__ unseen. Eagerly, every operation would compile on its own for each new shape and
    dtype, several times slower for a first call; a model that cannot be traced (say it reads a
    value with float()) runs eagerly all the same, its layouts unknown. `traced`'s program is
    compiled, not the model traced again (its variables' values may have changed, not their shapes)."""
    traced = trace(model, inputs) if traced is None else traced
    arrays, rebuild = _arrays(model, inputs)
    return jax_program.run(_program(model), arrays, rebuild, traced, grads, each, _to_torch, each_gradient, later)


@contextlib.contextmanager
def _wrapped(model, calls: marks.Calls):
    """While open, every call of a submodule of `model` (a throwaway copy: nnx.merge's) passes its
    output through calls.mark under its path, once per call. No class is patched: each submodule
    instance gets a recording subclass of its class (_recording) for the block, and its path as an
    attribute (PATH), both of which NNX's transforms carry into their copies of it (nnx.scan's copy
    of a stacked block, one per layer); its own class back after, even on error."""
    modules = list(nnx.iter_modules(model))
    swapped = []
    token = _RECORDING_INTO.set(calls)
    try:
        for path, module in modules:
            cls = type(module)
            object.__setattr__(module, PATH, _join(path))
            if "__call__" in dir(cls):
                object.__setattr__(module, "__class__", _recording(cls))
                swapped.append((module, cls))
        yield
    finally:
        for module, cls in swapped:
            object.__setattr__(module, "__class__", cls)
        for _, module in modules:
            vars(module).pop(PATH, None)
        _RECORDING_INTO.reset(token)


# the attribute naming a module's path in the throwaway copy, carried into NNX's copies of it
PATH = "_mhsa_port_check_path"
# the calls of the capture in progress
_RECORDING_INTO: contextvars.ContextVar[marks.Calls | None] = contextvars.ContextVar("recording_into", default=None)
_RECORDERS: dict[type, type] = {}


def _recording(cls: type) -> type:
    """The subclass of `cls` whose __call__ records its output into the capture in progress
    (only the instance's own class records: a __call__ that calls super().__call__ records once)."""
    if cls not in _RECORDERS:

        def __call__(self, *args, **kwargs):
            output = super(recorder, self).__call__(*args, **kwargs)
            calls, path = _RECORDING_INTO.get(), vars(self).get(PATH)
            return calls.mark(path, output) if calls is not None and path is not None else output

        namespace = {"__call__": __call__, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
        recorder = type(cls)(cls.__name__, (cls,), namespace)
        _RECORDERS[cls] = recorder
    return _RECORDERS[cls]


def _linen_run(model, inputs: Inputs, calls: marks.Calls, modules: dict | None, switches: dict | None = None) -> Any:
    """One Linen apply, its output; every module's __call__ passes its output through calls.mark
    under its path, by an interceptor (once per call: a subclass's __call__ calling
    super().__call__ is intercepted twice), and `modules` gets {path: module} as called. A module
    inside a lifted transform (nn.scan) keeps its own path; one that the model's code runs with an
    apply of its own (a library's tied head: `self.decoder.apply({"params": {"kernel":
    embedding.T}}, x)`) has paths relative to its own scope: it is named where it sits, the calling
    module's path and its name. switches: {path: (a
    setting, its value)} for a probe (LinenSwitched): that module runs as a clone with the setting
    changed, on its own variables, its calls inside not recorded."""
    module, variables = model
    modules = {} if modules is None else modules
    active: list[tuple[nn.Module, str]] = []  # the modules whose __call__ is running and their paths, innermost last
    switching: list[bool] = []  # non-empty while a switched clone runs: its own calls are the module's
    roots: dict[int, str] = {}  # id(root scope) -> the path its modules' paths are relative to

    def path_of(instance) -> str:
        root = instance.scope.root if instance.scope is not None else None
        if not roots:
            roots[id(root)] = ""
        if id(root) not in roots and instance.path:  # a lifted transform's scope (nn.scan's): its paths are the model's own
            roots[id(root)] = ""
        if id(root) not in roots:  # a nested apply: placed under the module that runs it
            roots[id(root)] = ".".join(part for part in (active[-1][1] if active else "", instance.name or type(instance).__name__) if part)
        return ".".join(part for part in (roots[id(root)], _join(instance.path)) if part)

    def watch(next_fun, args, kwargs, context):
        inner = any(seen is context.module for seen, _ in active) or switching  # a subclass's super().__call__, or a switched clone's own
        if context.method_name != "__call__" or inner:
            return next_fun(*args, **kwargs)
        active.append((context.module, path_of(context.module)))
        try:
            switch = (switches or {}).get(active[-1][1])
            output = next_fun(*args, **kwargs) if switch is None else _switched_call(context.module, switch, args, kwargs, switching)
        finally:
            _, path = active.pop()
        modules[path] = context.module
        return calls.mark(path, output)

    with nn.intercept_methods(watch):
        return module.apply(dict(variables), *inputs.args, **inputs.kwargs)


def _switched_call(module: nn.Module, switch: tuple[str, Any], args, kwargs, switching: list) -> Any:
    """The output of a Linen `module`'s call with one setting switched (a probe): a clone with the
    setting changed, applied to the module's own variables."""
    setting, value = switch
    field = next((name for name in EPS_NAMES if isinstance(getattr(module, name, None), float)), None) if setting == "eps" else setting
    clone = module.clone(parent=None, **({field: value} if field is not None else {}))
    switching.append(True)
    try:
        return clone.apply(dict(module.variables), *args, **kwargs)
    finally:
        switching.pop()


class LinenSwitched(tuple):
    """A Linen (module, variables) pair with some modules' settings switched for the probes:
    `switches` {path: (setting, value)}, applied by _linen_run (a Linen module's fields are frozen)."""

    switches: dict


def _linen_switched(model, switch: str, path: str, value: Any) -> Model | None:
    """A Linen pair whose module at `path` runs with its eps or padding set to `value`; None where
    the variables show no layer there (a Linen module's settings exist only while it is called)."""
    kind = _types(model).get(path, "").rstrip("0123456789")
    if (switch == "eps" and kind not in ("LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm")) or (switch == "padding" and kind != "Conv"):
        return None
    pair = LinenSwitched(model)
    pair.switches = {**getattr(model, "switches", {}), path: (switch, value)}
    return pair


def _arrays(model, inputs: Inputs) -> tuple[list, Any]:
    """jax_program.input_arrays of `inputs` in the model's dtype (its first floating variable's)."""
    leaves = [leaf for leaf in jax.tree.leaves(_variables(model)) if jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.floating)]
    dtype = jnp.asarray(leaves[0]).dtype if leaves else jnp.float32
    return jax_program.input_arrays(inputs, dtype)


def switched(model: Model, switch: str, path: str, value: Any = None) -> Model | None:
    """Reader.switched (readers/protocol.py): "transpose" the (square) kernel of the Linear at `path`,
    "eps" = value for the norm at `path`, "padding" = value ((low, high) per axis) for the Conv at
    `path`, "load" the parameters of `value` ({neutral name: array}; path unused); None where the
    switch does not apply. A Linen module's settings are frozen fields: its pair comes back as a
    LinenSwitched, whose run calls a clone of that module with the setting changed."""
    if switch == "load":  # value: {neutral name: array}, the reference's values for parameters that differ
        return load_parameters(model if _is_linen(model) else nnx.clone(model), value)
    kind = _types(model).get(path, "").rstrip("0123456789")
    if switch == "transpose" and kind == "Linear":
        name = f"{path}.weight" if path else "weight"
        kernel = parameters(model)[name]
        return switched(model, "load", path, {name: kernel.T}) if kernel.shape[0] == kernel.shape[1] else None
    if switch not in ("padding", "eps"):
        return None
    if _is_linen(model):
        return _linen_switched(model, switch, path, value)
    copy = nnx.clone(model)
    module: Any = _modules(copy).get(path)  # any layer: its padding or eps is looked up by name
    if switch == "padding" and kind == "Conv":
        module.padding = value  # ((low, high), ...) per spatial axis, as the reader gives it
        return copy
    eps = next((name for name in EPS_NAMES if isinstance(getattr(module, name, None), float)), None)
    if switch == "eps" and eps is not None:
        setattr(module, eps, value)
        return copy
    return None


float64_twin = jax_program.float64_twin(cast)  # a float64 copy for the block, JAX's float64 on for the block only
float64_twin_bytes = jax_program.float64_twin_bytes(parameters)
highest_precision = jax_program.highest_precision  # full float32 matmuls for the duration (no TF32)
