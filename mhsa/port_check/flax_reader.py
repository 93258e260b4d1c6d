"""The Flax half of the port checker (mhsa.port_check): read any Flax NNX module, or a
Linen module with its variables passed as the pair (module, variables), in the same neutral
form as torch_reader.py.

The neutral form is the exchange convention (DESIGN.md): parameters named and laid out as in
torch's state_dict, so Dense/Linear kernels are transposed here (in, out) -> (out, in), Conv
kernels (k..., in, out) -> (out, in, k...), scale -> weight, embedding -> weight, BatchNorm's
mean/var -> running_mean/running_var, and settings are given in torch's conventions (BatchNorm
momentum 1 - Flax's). NumPy in, NumPy out. NNX outputs are captured by wrapping the submodules'
classes' __call__ for one eager call (restored even on error), Linen's by capture_intermediates.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

DTYPES = {"float32": jnp.float32, "float64": jnp.float64}

# what this port reads: an nnx.Module, or a Linen (module, variables) pair
Model = Any

# module class -> the neutral type name the other side's port module uses too
TYPES = (
    (nnx.Linear, "Linear"),
    (nn.Dense, "Linear"),
    (nnx.Embed, "Embedding"),
    (nn.Embed, "Embedding"),
    (nnx.LayerNorm, "LayerNorm"),
    (nn.LayerNorm, "LayerNorm"),
    (nnx.RMSNorm, "RMSNorm"),
    (nn.RMSNorm, "RMSNorm"),
    (nnx.GroupNorm, "GroupNorm"),
    (nn.GroupNorm, "GroupNorm"),
    (nnx.BatchNorm, "BatchNorm"),
    (nn.BatchNorm, "BatchNorm"),
    (nnx.Conv, "Conv"),
    (nn.Conv, "Conv"),
    (nnx.Dropout, "Dropout"),
    (nn.Dropout, "Dropout"),
)

# neutral type -> {Flax variable name: (torch name, layout)}; a variable of a type not listed
# keeps its own name and layout
LAYOUTS = {
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


def describe(model: Model, inputs: tuple) -> dict[str, dict]:
    """module path ("" for the model itself) -> {"type": neutral name, setting: value, ...}, with
    the settings the lint compares, in torch's conventions. inputs: Linen's submodules exist only
    while the model is called, so a Linen model is called once with them."""
    return {path: {"type": module_type(module), **_settings(module)} for path, module in _modules(model, inputs).items()}


def _settings(module) -> dict:
    kind = module_type(module)
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
            "padding": _padding(module.padding, n),
            "dilation": _per_dim(module.kernel_dilation, n),
            "groups": module.feature_group_count,
            "kernel_size": tuple(module.kernel_size),
        }
    if kind == "Embedding":
        return {"padding_idx": None}  # Flax's Embed has no padding index
    return {}


def _per_dim(value, n) -> tuple:
    return (1,) * n if value is None else (value,) * n if isinstance(value, int) else tuple(value)


def _padding(value, n):
    if isinstance(value, str):
        return value.upper()
    if isinstance(value, int):
        return ((value, value),) * n
    return tuple((p, p) if isinstance(p, int) else tuple(p) for p in value)


def _modules(model, inputs=None) -> dict:
    """path -> module: every submodule of an NNX module, or of a Linen module as called once (only
    traced, by jax.eval_shape: the modules are known at trace time and nothing is compiled)."""
    if _is_linen(model):
        modules = {}

        def run(variables, arrays):
            calls, seen = _linen_run((model[0], variables), arrays)
            modules.update(seen)
            return [value for _, value in calls]

        jax.eval_shape(run, _unfreeze(dict(model[1])), _arrays(model, inputs))
        return modules
    return {_join(path): module for path, module in nnx.iter_modules(model)}


def _join(path) -> str:
    return ".".join(str(key) for key in path)


def parameters(model: Model) -> dict[str, np.ndarray]:
    """Every parameter and batch statistic, named and laid out as torch's state_dict would."""
    return {name: np.array(value) for name, value in _neutral(model, _variables(model)).items()}


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


def _flat(tree, prefix=()) -> dict[tuple, Any]:
    out = {}
    for key, value in tree.items():
        if hasattr(value, "items"):
            out.update(_flat(value, prefix + (key,)))
        else:
            out[prefix + (key,)] = value
    return out


def _neutral(model, tree) -> dict[str, object]:
    """A nested dict shaped like the model's variables (the variables, or their gradients) ->
    neutral names and layout."""
    types = _types(model)
    out = {}
    for path, value in _flat(tree).items():
        name, layout = _neutral_name(types.get(_join(path[:-1]), ""), str(path[-1]))
        out[_join(path[:-1] + (name,))] = _to_torch(np.asarray(value), layout)
    return out


def _types(model) -> dict[str, str]:
    """module path -> neutral type, for naming variables. Linen's submodules exist only while
    called, so there the type is read off the variables: a 2-d `kernel` is a Dense, a deeper one
    a Conv, an `embedding` an Embed, `scale` a norm, `mean` and `var` BatchNorm statistics."""
    if not _is_linen(model):
        return {_join(path): module_type(module) for path, module in nnx.iter_modules(model)}
    types = {}
    for path, value in _flat(_variables(model)).items():
        module, name = _join(path[:-1]), path[-1]
        if name == "kernel":
            types[module] = "Linear" if np.ndim(value) == 2 else "Conv"
        elif name == "embedding":
            types[module] = "Embedding"
        elif name in ("mean", "var"):
            types[module] = "BatchNorm"
        elif name == "scale":
            types.setdefault(module, "LayerNorm")
    return types


def _neutral_name(kind, name):
    return LAYOUTS.get(kind, {}).get(name, (name, None))


def _to_torch(value, layout):
    if layout == "linear":
        return value.T
    if layout == "conv":  # Flax (k..., in, out) -> torch (out, in, k...)
        n = value.ndim
        return value.transpose(n - 1, n - 2, *range(n - 2))
    return value


def _from_torch(value, layout):
    if layout == "linear":
        return value.T
    if layout == "conv":  # torch (out, in, k...) -> Flax (k..., in, out)
        n = value.ndim
        return value.transpose(*range(2, n), 1, 0)
    return value


def _native_paths(model) -> dict[str, tuple]:
    """neutral name -> (path of the Flax variable, layout)."""
    types = _types(model)
    native = {}
    for path in _flat(_variables(model)):
        name, layout = _neutral_name(types.get(_join(path[:-1]), ""), str(path[-1]))
        native[_join(path[:-1] + (name,))] = (path, layout)
    return native


def load_parameters(model: Model, arrays: dict[str, np.ndarray]) -> Model:
    """Write neutral arrays (already matched and shape-checked by the caller) into `model`, each
    in the dtype of the variable it replaces; returns the model (for Linen a new pair)."""
    native = _native_paths(model)
    if _is_linen(model):
        module, variables = model
        variables = jax.tree.map(lambda leaf: leaf, dict(variables))
        variables = {collection: _unfreeze(tree) for collection, tree in variables.items()}
        for name, value in arrays.items():
            path, layout = native[name]
            collection = "params" if _has(variables.get("params", {}), path) else "batch_stats"
            tree = variables[collection]
            for key in path[:-1]:
                tree = tree[key]
            tree[path[-1]] = jnp.asarray(_from_torch(value, layout), dtype=tree[path[-1]].dtype)
        return module, variables
    for name, value in arrays.items():
        path, layout = native[name]
        variable = _variable(model, path)
        variable[...] = jnp.asarray(_from_torch(value, layout), dtype=variable[...].dtype)
    return model


def _unfreeze(tree):
    return {key: _unfreeze(value) for key, value in tree.items()} if hasattr(tree, "items") else tree


def _has(tree, path) -> bool:
    for key in path:
        if not hasattr(tree, "items") or key not in tree:
            return False
        tree = tree[key]
    return True


def _variable(model, path):
    for key in path:
        model = model[key] if isinstance(key, int) else getattr(model, key)
    return model


def cast(model: Model, dtype: str) -> Model:
    """A copy of `model` with every floating-point variable in `dtype`, and every submodule's
    computation dtype too (a layer built with dtype=float32 would otherwise compute in float32).
    float64 turns on jax_enable_x64, without which JAX silently keeps float32."""
    if dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    target = DTYPES[dtype]

    def convert(leaf):  # in NumPy: an XLA convert would compile once per shape
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
            return leaf  # integers, booleans, PRNG keys
        return jnp.asarray(np.asarray(leaf).astype(target))

    if _is_linen(model):
        # Linen modules are frozen dataclasses: their `dtype` fields stay; the default None
        # computes in the parameters' dtype
        return model[0], jax.tree.map(convert, _unfreeze(dict(model[1])))
    model = nnx.clone(model)
    for _, module in nnx.iter_modules(model):
        for name in ("dtype", "param_dtype"):
            current = getattr(module, name, None)
            if current is not None and _is_float_dtype(current):
                setattr(module, name, target)
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(convert, state))


def _is_float_dtype(value) -> bool:
    try:
        return jnp.issubdtype(jnp.dtype(value), jnp.floating)
    except TypeError:
        return False


def capture(model: Model, inputs: tuple) -> list[tuple[str, np.ndarray]]:
    """Call the model once and return (module path, output) for every submodule call in the order
    the calls return (a child before its parent; the model itself last, path ""). A tuple output
    gives one entry per array, "path[i]". NNX: each submodule class's __call__ is wrapped for this
    one call and restored even on error; Linen: capture_intermediates. The call is traced once and
    compiled (eagerly, every operation compiles on its own for each new shape and dtype, several
    times slower for a first call); a model that cannot be traced, say one that reads a value
    with float(), runs eagerly instead.
    A module called through a method other than __call__ is not seen."""
    arrays = _arrays(model, inputs)
    if _is_linen(model):
        module, variables = model
        order: list[str] = []

        def linen(variables, arrays):
            calls, _ = _linen_run((module, variables), arrays)
            order[:] = [path for path, _ in calls]
            return [value for _, value in calls]

        values = _compiled_or_eager(jax.jit(linen), linen, _unfreeze(dict(variables)), arrays)
        return [(path, np.array(value)) for path, value in zip(order, values)]
    order = []

    def run(model, arrays):
        calls = []
        with _wrapped(model, calls):
            model(*arrays)
        order[:] = [path for path, _ in calls]
        return [value for _, value in calls]

    values = _compiled_or_eager(nnx.jit(run), run, model, arrays)
    return [(path, np.array(value)) for path, value in zip(order, values)]


def _compiled_or_eager(compiled, eager, *args):
    try:
        return compiled(*args)
    except (
        jax.errors.ConcretizationTypeError,
        jax.errors.TracerArrayConversionError,
        jax.errors.TracerIntegerConversionError,
        jax.errors.TracerBoolConversionError,
    ):
        return eager(*args)


@contextlib.contextmanager
def _wrapped(model, calls):
    """While open, every call of a submodule of `model` appends (path, output) to `calls`."""
    paths = {id(module): _join(path) for path, module in nnx.iter_modules(model)}
    classes = {type(module) for _, module in nnx.iter_modules(model)}
    originals = {cls: (cls.__dict__.get("__call__"), cls.__call__) for cls in classes}
    active = []

    def wrap(original):
        def __call__(self, *args, **kwargs):
            # a subclass's __call__ that calls super().__call__ reaches a second wrapper: record once
            outer = id(self) in paths and id(self) not in active
            if outer:
                active.append(id(self))
            try:
                output = original(self, *args, **kwargs)
            finally:
                if outer:
                    active.pop()
            if outer:
                calls.extend(_flatten(paths[id(self)], output))
            return output

        return __call__

    try:
        for cls, (_, inherited) in originals.items():
            cls.__call__ = wrap(inherited)
        yield
    finally:
        for cls, (own, _) in originals.items():
            if own is None:
                del cls.__call__
            else:
                cls.__call__ = own


def _flatten(path, output) -> list[tuple[str, object]]:
    if isinstance(output, jax.Array):
        return [(path, output)]
    if isinstance(output, (tuple, list)):
        return [(f"{path}[{i}]", value) for i, value in enumerate(output) if isinstance(value, jax.Array)]
    return []


def _linen_run(model, inputs):
    """One Linen apply with capture_intermediates: ((path, output) in return order, {path: module}).
    The order and the modules come from an interceptor that only watches; the outputs are those
    capture_intermediates stored."""
    module, variables = model
    order, modules = [], {}

    def watch(next_fun, args, kwargs, context):
        output = next_fun(*args, **kwargs)
        if context.method_name == "__call__":
            path = _join(context.module.path)
            order.append(path)
            modules[path] = context.module
        return output

    with nn.intercept_methods(watch):
        _, state = module.apply(dict(variables), *inputs, capture_intermediates=True, mutable=["intermediates"])
    stored = {}
    for path, values in _flat(_unfreeze(state["intermediates"])).items():
        if path[-1] == "__call__":
            stored[_join(path[:-1])] = list(values)
    calls, seen = [], {}
    for path in order:
        index = seen.get(path, 0)
        seen[path] = index + 1
        outputs = stored.get(path, [])
        if index < len(outputs):
            calls.extend(_flatten(path, outputs[index]))
    return calls, modules


def _arrays(model, inputs) -> list:
    # floating inputs take the model's dtype, integer ones (token ids) stay as they are
    leaves = [leaf for leaf in jax.tree.leaves(_variables(model)) if jnp.issubdtype(jnp.asarray(leaf).dtype, jnp.floating)]
    dtype = jnp.asarray(leaves[0]).dtype if leaves else jnp.float32
    arrays = [jnp.asarray(x, dtype=dtype) if np.issubdtype(np.asarray(x).dtype, np.floating) else jnp.asarray(x) for x in inputs]
    return arrays


def gradients(model: Model, inputs: tuple) -> dict[str, np.ndarray]:
    """d (sum of every floating-point output) / d every parameter, neutral names and layout
    (compiled as one function, as capture is)."""
    arrays = _arrays(model, inputs)

    def total(output):
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        return sum(value.sum() for value in outputs if jnp.issubdtype(value.dtype, jnp.floating))

    if _is_linen(model):
        module, variables = model
        variables = _unfreeze(dict(variables))

        def linen(params, arrays):
            return jax.grad(lambda p: total(module.apply({**variables, "params": p}, *arrays)))(params)

        grads = _compiled_or_eager(jax.jit(linen), linen, variables["params"], arrays)
        return {name: np.array(value) for name, value in _neutral(model, grads).items()}

    def run(model, arrays):
        return nnx.grad(lambda m: total(m(*arrays)))(model)

    grads = _compiled_or_eager(nnx.jit(run), run, model, arrays)
    return {name: np.array(value) for name, value in _neutral(model, nnx.to_pure_dict(grads)).items()}


def switched(model: Model, switch: str, path: str, value: float | None = None) -> Model | None:
    """A copy of `model` with one likely cause of a difference switched, for the probes:
    "transpose" the (square) kernel of the Linear at `path`, or "eps" = value for the norm at
    `path`. None where the switch does not apply (a Linen module's settings are frozen)."""
    kind = _types(model).get(path)
    if switch == "transpose" and kind == "Linear":
        name = f"{path}.weight" if path else "weight"
        kernel = parameters(model)[name]
        if kernel.shape[0] != kernel.shape[1]:
            return None
        return load_parameters(model if _is_linen(model) else nnx.clone(model), {name: kernel.T})
    if switch == "eps" and not _is_linen(model):
        copy = nnx.clone(model)
        module = _modules(copy).get(path)
        if module is None or not hasattr(module, "epsilon"):
            return None
        module.epsilon = value
        return copy
    return None


@contextlib.contextmanager
def highest_precision() -> Iterator[None]:
    """Full float32 matmuls for the duration: on GPUs JAX's default uses TF32 (bf16 passes on TPUs)."""
    with jax.default_matmul_precision("highest"):
        yield
