"""Every submodule call of an Equinox model, captured in the order the calls return, without
patching any class and without letting a traced value escape its transformation.

An Equinox model is an immutable pytree, and its code calls its submodules inside transformations
of its own (`jax.vmap(self.norm)(x)` over a sequence): a value appended to a list there would leak
that vmap's tracer. So a copy of the model is built (`eqx.tree_at`) whose every submodule is a
`Recorder`: it calls its module and passes the output's arrays through `mark`, an identity
primitive named for that call, which vmap moves the batch axes of to the front (the outermost
first, as the arrays of a batch are). The whole forward pass is traced once to a jaxpr, and
`interpret` runs that jaxpr operation by operation: each mark's values, values of the running
program, are recorded where the mark sits, which is where its call returned (a child before its
parent). A mark inside a jit of the model's own is found there too; one inside a scan or a cond
runs as the identity, unrecorded.
"""

from __future__ import annotations

import contextlib
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.extend import core
from jax.interpreters import ad, batching, mlir

from mhsa.port_check.core.structure import Inputs, split_arrays

PREFIX = "mhsa_port_check_call_"  # a mark's name: the call it records

mark = core.Primitive("mhsa_port_check_mark")
mark.multiple_results = True
mark.def_impl(lambda *values, name: list(values))
mark.def_abstract_eval(lambda *avals, name: list(avals))
mlir.register_lowering(mark, mlir.lower_fun(lambda *values, name: list(values), multiple_results=True))


def _mark_batched(values, axes, *, name):
    """The batch axis of every mapped value moved to the front; an unmapped one (axis None: a value
    every example shares) stays as it is."""
    moved = [value if axis is None else jnp.moveaxis(value, axis, 0) for value, axis in zip(values, axes)]
    return mark.bind(*moved, name=name), [None if axis is None else 0 for axis in axes]


batching.primitive_batchers[mark] = _mark_batched
ad.primitive_jvps[mark] = lambda primals, tangents, *, name: (mark.bind(*primals, name=name), list(tangents))


class Calls:
    """The recorded calls of one trace: {mark name: (module path, the output's array structure, its
    other values)}, filled while the model is traced."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[str, Any, Any]] = {}

    def call(self, path: str, module: Any, args: tuple, kwargs: dict) -> Any:
        """module(*args, **kwargs), its output's arrays passed through a mark of their own."""
        arrays, static = eqx.partition(module(*args, **kwargs), eqx.is_array)
        leaves, structure = jax.tree_util.tree_flatten(arrays)
        name = f"{PREFIX}{len(self.entries)}"
        self.entries[name] = (path, structure, static)
        return eqx.combine(jax.tree_util.tree_unflatten(structure, mark.bind(*leaves, name=name)), static)


class Recorder(eqx.Module):
    """A submodule of the recording copy: calls its module through `calls`, under `path`; any other
    attribute is the module's (a parent that reads `self.embed.weight` still finds it)."""

    module: Any
    path: str = eqx.field(static=True)
    calls: Calls = eqx.field(static=True)

    def __getattr__(self, name: str) -> Any:
        if name == "module" or name.startswith("__"):  # not set yet (a copy being built), or Python's own protocols
            raise AttributeError(name)
        return getattr(self.module, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.calls.call(self.path, self.module, args, kwargs)


def is_module(value: Any) -> bool:
    return isinstance(value, eqx.Module)


def recorded(module: Any) -> bool:
    """Whether calls of `module` are recorded: a callable Equinox module, the user's or equinox.nn's;
    not Equinox's own function wrappers (a filter_vmap'd activation, a bound method)."""
    top = type(module).__module__
    internal = top.startswith("equinox.") and not top.startswith("equinox.nn")
    return is_module(module) and callable(module) and not internal and not isinstance(module, Recorder)


def children(node: Any) -> list[tuple[tuple, Any]]:
    """(key path, module) of each module directly inside `node` (within its fields, tuples, dicts)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda value: value is not node and is_module(value))
    return [(tuple(_key(entry) for entry in path), value) for path, value in flat if is_module(value)]


def _key(entry) -> Any:
    return getattr(entry, "name", getattr(entry, "idx", getattr(entry, "key", entry)))


def walk(node: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """(key path, module) of every module inside `node`, a parent before its children, in field order."""
    found = []
    for key, child in children(node):
        found.append((path + key, child))
        found += walk(child, path + key)
    return found


def recording_copy(model: Any, names: list[str], calls: Calls) -> Any:
    """A copy of `model` whose every recorded submodule is a Recorder into `calls`; names: the path
    each module of walk(model) is recorded under, in walk's order (a module reached twice, by its
    first path)."""
    order = iter(names)

    def wrap(node):
        inner = children(node)
        if not inner:
            return node
        replaced = []
        for _, child in inner:
            name = next(order)
            copy = wrap(child)
            replaced.append(Recorder(copy, name, calls) if recorded(child) else copy)
        return eqx.tree_at(lambda n: [child for _, child in children(n)], node, replace=replaced)

    return wrap(model)


def run(model: Any, names: list[str], inputs: Inputs, batched: bool) -> tuple[list[tuple[str, Any]], Any]:
    """Call `model` on `inputs`, per example under jax.vmap over the first axis of every input array
    unless `batched`: ([(path, output)] of every recorded call in return order, the model's own
    last under path "", the model's output)."""
    calls = Calls()
    copy = recording_copy(model, names, calls)
    arrays, rebuild = split_arrays(inputs)
    dynamic, static = eqx.partition(copy, eqx.is_array)
    kept: dict[str, Any] = {}

    def forward(dynamic, arrays):
        def one(arrays):
            given = rebuild(arrays)
            output, kept["static"] = eqx.partition(eqx.combine(dynamic, static)(*given.args, **given.kwargs), eqx.is_array)
            return output

        return one(arrays) if batched else jax.vmap(one)(arrays)

    closed, shape = jax.make_jaxpr(forward, return_shape=True)(dynamic, arrays)
    recorded_calls: list[tuple[str, list]] = []
    flat = interpret(closed.jaxpr, closed.consts, jax.tree_util.tree_leaves((dynamic, arrays)), recorded_calls)
    output = eqx.combine(jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), flat), kept["static"])
    found = []
    for name, values in recorded_calls:
        path, structure, other = calls.entries[name]
        found.append((path, eqx.combine(jax.tree_util.tree_unflatten(structure, values), other)))
    return found + [("", output)], output


def interpret(jaxpr: core.Jaxpr, consts: list, args: list, recorded_calls: list) -> list:
    """jaxpr's outputs on `args`, binding each operation on them (so that it runs under whatever
    transformation calls it: jit, grad); a mark passes its values on and appends (name, values) to
    `recorded_calls`; a jit holding a mark is run operation by operation too, any other bound whole."""
    env: dict = {}

    def read(atom):
        return atom.val if isinstance(atom, core.Literal) else env[atom]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        values = [read(atom) for atom in eqn.invars]
        if eqn.primitive is mark:
            outs = values
            recorded_calls.append((eqn.params["name"], values))
        elif _is_jit(eqn) and _marked(eqn.params["jaxpr"].jaxpr):
            inner = eqn.params["jaxpr"]
            outs = interpret(inner.jaxpr, inner.consts, values, recorded_calls)
        else:
            outs = _bind(eqn, values)
        env.update(zip(eqn.outvars, outs))
    return [read(atom) for atom in jaxpr.outvars]


def _is_jit(eqn) -> bool:
    return eqn.primitive.name in ("jit", "pjit")


def _bind(eqn, values: list) -> list:
    """One operation bound on `values`, as jax.core.eval_jaxpr binds it (get_bind_params gives the
    parameters, and, in JAX versions before 0.7, the sub-functions first)."""
    params: Any = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = params if isinstance(params, tuple) else ((), params)
    manager = getattr(getattr(eqn, "ctx", None), "manager", None)  # the operation's own context (its sharding, say)
    with manager if manager is not None else contextlib.nullcontext():
        outs = eqn.primitive.bind(*subfuns, *values, **params)
    return list(outs) if eqn.primitive.multiple_results else [outs]


def _marked(jaxpr: core.Jaxpr) -> bool:
    """Whether a mark sits in `jaxpr` or in a jit inside it (a user's jit around a submodule, say)."""
    return any(eqn.primitive is mark or (_is_jit(eqn) and _marked(eqn.params["jaxpr"].jaxpr)) for eqn in jaxpr.eqns)
