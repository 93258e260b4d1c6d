"""Every submodule call of a JAX model, recorded inside its own transformations, for every reader of a
JAX library (readers/flax/, readers/equinox/), without patching any class or letting a traced value
escape the transformation it belongs to.

A model's code calls its submodules inside transformations of its own: `jax.vmap(self.norm)(x)`
over a sequence, a stack of layers run by `nnx.scan`, `jax.lax.scan` or Linen's `nn.scan`, a
`remat` around a block. A value appended to a list there would leak that transformation's tracer.
So each recorded call passes its output's arrays through `mark`, an identity primitive named for
that call (Calls.mark), which vmap moves the batch axes of to the front (the outermost first, as
the arrays of a batch are). The forward pass is traced once to a jaxpr, and `interpret` runs that
jaxpr operation by operation: each mark's values, values of the running program, are recorded where
the mark sits, which is where its call returned (a child before its parent). A mark inside a jit or
a remat of the model's own is found there too. A scan whose scanned operands are the model's
parameters (a stack of layers, one slice each) is run one iteration at a time: each layer's calls
are recorded as that layer's, their module path indexed where the stack's parameters sit
(`transformer.h[1].attn`, the scanned parameters being `transformer.h.*`). Any other scan (over
time, say) runs whole, and the marks in it as the identity, unrecorded: its calls are compared
through their caller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core
from jax.interpreters import ad, batching, mlir

from mhsa.port_check.readers import jax_widened

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

# operations that only lay a parameter's values out anew: a slice of a scanned stack is still that stack's
LAYOUT_ONLY = {"reshape", "transpose", "squeeze", "expand_dims", "convert_element_type", "copy", "copy_p", "broadcast_in_dim", "slice"}


def is_array(value: Any) -> bool:
    return isinstance(value, jax.Array)


class Calls:
    """The recorded calls of one trace: {mark name: (module path, rebuild: the output again from
    new values of its arrays)}, filled while the model is traced."""

    def __init__(self, eager: bool = False) -> None:
        self.entries: dict[str, tuple[str, Callable[[list], Any]]] = {}
        self.eager: list[tuple[str, Any]] | None = [] if eager else None  # (path, output) of each call, for a model run untraced

    def mark(self, path: str, output: Any) -> Any:
        """`output` with its arrays passed through a mark of their own, recorded under `path`; run
        eagerly (Calls(eager=True)), the output itself is recorded as it is."""
        if self.eager is not None:
            self.eager.append((path, output))
            return output
        arrays, rebuild = split(output)
        name = f"{PREFIX}{len(self.entries)}"
        self.entries[name] = (path, rebuild)
        return rebuild(mark.bind(*arrays, name=name)) if arrays else output

    def output(self, name: str, values: list) -> Any:
        """A recorded call's output rebuilt from its marked values."""
        return self.entries[name][1](values)


def split(value: Any) -> tuple[list, Callable[[list], Any]]:
    """(the arrays inside `value`, rebuild: `value` with new arrays in their places): through every
    registered pytree (tuples, lists, dicts, a flax.struct or Equinox dataclass) and, inside or
    outside one, mappings (a library's ModelOutput) and plain dataclasses; any other value is kept."""
    if is_array(value):
        return [value], lambda values: values[0]
    leaves, structure = jax.tree_util.tree_flatten(value)
    if not (len(leaves) == 1 and leaves[0] is value):  # a pytree: its leaves, each split in turn
        parts = [split(leaf) for leaf in leaves]
        return _joined(parts, lambda items: jax.tree_util.tree_unflatten(structure, items))
    if isinstance(value, Mapping):
        keys, parts = list(value), [split(item) for item in value.values()]
        return _joined(parts, lambda items: _mapping(value, dict(zip(keys, items))))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [field.name for field in dataclasses.fields(value) if field.init]
        parts = [split(getattr(value, name)) for name in fields]
        return _joined(parts, lambda items: dataclasses.replace(value, **dict(zip(fields, items))))
    return [], lambda values: value


def _joined(parts: list[tuple[list, Callable]], join: Callable[[list], Any]) -> tuple[list, Callable[[list], Any]]:
    arrays = [array for found, _ in parts for array in found]
    sizes = [len(found) for found, _ in parts]

    def rebuild(values: list) -> Any:
        items, start = [], 0
        for (_, again), size in zip(parts, sizes):
            items.append(again(values[start : start + size]))
            start += size
        return join(items)

    return arrays, rebuild


def _mapping(original: Mapping, items: dict) -> Any:
    """A mapping of `original`'s type holding `items` (a plain dict where that type cannot be built from one)."""
    kind: Any = type(original)
    try:
        return kind(items)
    except Exception:  # a mapping type with a constructor of its own
        return items


def run(function: Callable, args: tuple, names: dict[int, str], calls: Calls) -> tuple[list[tuple[str, Any]], Any]:
    """function(*args) traced to a jaxpr (its calls marked into `calls`) and interpreted: ([(module
    path, output)] of every recorded call in the order they return, the function's output). names:
    {id(array): neutral name} of the model's parameters among the arrays of `args`, which say the
    scans to run layer by layer. With Calls(eager=True) the function runs as it is (a model that
    cannot be traced), every call recorded as it returns, none inside a scan."""
    if calls.eager is not None:
        output = function(*args)
        return list(calls.eager), output
    flat_args, args_tree = jax.tree_util.tree_flatten(args)
    kept: dict[str, Callable[[list], Any]] = {}

    def arrays_out(*flat):  # the output's arrays (a traced function returns only those), the rest kept to rebuild it
        arrays, kept["rebuild"] = split(function(*jax.tree_util.tree_unflatten(args_tree, flat)))
        return arrays

    closed = jax.make_jaxpr(arrays_out)(*flat_args)
    if jax_widened.active():  # the float64 twin: float32 the code asks for by hand as float64
        closed = jax_widened.widened(closed, flat_args) or closed
    recorded: list[tuple[str, list, tuple]] = []
    origins = [names.get(id(arg)) for arg in flat_args]
    output = kept["rebuild"](interpret(closed.jaxpr, closed.consts, flat_args, recorded, origins))
    found = []
    for name, values, iterations in recorded:
        path = calls.entries[name][0]
        for root, index in iterations:  # a layer of a stack: its index where the stack's parameters sit
            if root and (path == root or path.startswith(root + ".")):
                path = f"{root}[{index}]{path[len(root) :]}"
        found.append((path, calls.output(name, values)))
    return found, output


def interpret(jaxpr: core.Jaxpr, consts: list, args: list, recorded: list, origins: list | None = None, iterations: tuple = ()) -> list:
    """jaxpr's outputs on `args`, binding each operation on them (so that it runs under whatever
    transformation calls it: jit, grad); a mark passes its values on and appends (name, values,
    iterations) to `recorded`; a jit or a remat holding a mark is run operation by operation too, a
    scan of the parameters (`origins`: each argument's parameter name, or None) one iteration at a
    time (iterations: ((stack root, layer), ...) of the scans around); any other operation is bound whole."""
    env: dict = {}
    origin: dict = {}

    def read(atom):
        return atom.val if isinstance(atom, core.Literal) else env[atom]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for var, name in zip(jaxpr.invars, origins or []):
        if name is not None:
            origin[var] = name
    for eqn in jaxpr.eqns:
        values = [read(atom) for atom in eqn.invars]
        names = [origin.get(atom) if isinstance(atom, core.Var) else None for atom in eqn.invars]
        if eqn.primitive is mark:
            outs = values
            recorded.append((eqn.params["name"], values, iterations))
        elif _is_jit(eqn) and _marked(eqn.params["jaxpr"].jaxpr):
            inner = eqn.params["jaxpr"]
            outs = interpret(inner.jaxpr, inner.consts, values, recorded, names, iterations)
        elif eqn.primitive.name in ("remat2", "checkpoint") and _marked(eqn.params["jaxpr"]):
            outs = interpret(eqn.params["jaxpr"], [], values, recorded, names, iterations)
        elif eqn.primitive.name == "scan" and _marked(eqn.params["jaxpr"].jaxpr) and _stack_root(eqn, names) is not None:
            outs = _scan_by_layer(eqn, values, names, recorded, iterations)
        else:
            outs = _bind(eqn, values)
        if eqn.primitive.name in LAYOUT_ONLY or eqn.primitive is mark:
            for var, name in zip(eqn.outvars, names if eqn.primitive is mark else names[:1] * len(eqn.outvars)):
                if name is not None:
                    origin[var] = name
        env.update(zip(eqn.outvars, outs))
    return [read(atom) for atom in jaxpr.outvars]


def _stack_root(eqn, names: list) -> str | None:
    """The module path the parameters a scan runs over share (`transformer.h` for a stack of
    blocks): None where no scanned operand is a parameter (a scan over time, over the inputs)."""
    scanned = [name for name in names[eqn.params["num_consts"] + eqn.params["num_carry"] :] if name is not None]
    if not scanned:
        return None
    modules = [name.split(".")[:-1] for name in scanned]
    return ".".join(os.path.commonprefix(modules))


def _scan_by_layer(eqn, values: list, names: list, recorded: list, iterations: tuple) -> list:
    """A scan run one iteration at a time (its body interpreted on each slice of the scanned
    operands, the carry threaded through, the per-iteration outputs stacked), as jax.lax.scan runs
    it: its marks recorded per layer."""
    params = eqn.params
    body, consts_n, carry_n, length = params["jaxpr"], params["num_consts"], params["num_carry"], params["length"]
    root = _stack_root(eqn, names)
    consts, carry, xs = values[:consts_n], values[consts_n : consts_n + carry_n], values[consts_n + carry_n :]
    const_names, xs_names = names[:consts_n], names[consts_n + carry_n :]
    order = range(length - 1, -1, -1) if params["reverse"] else range(length)
    ys_by_index: dict[int, list] = {}
    for index in order:
        sliced = [x[index] for x in xs]
        outs = interpret(
            body.jaxpr, body.consts, [*consts, *carry, *sliced], recorded, [*const_names, *[None] * carry_n, *xs_names], (*iterations, (root, index))
        )
        carry, ys_by_index[index] = outs[:carry_n], outs[carry_n:]
    ys = [jnp.stack([ys_by_index[index][n] for index in range(length)]) for n in range(len(body.jaxpr.outvars) - carry_n)]
    return [*carry, *ys]


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
    """Whether a mark sits in `jaxpr` or in a jit, remat or scan inside it."""
    for eqn in jaxpr.eqns:
        if eqn.primitive is mark:
            return True
        inner = eqn.params.get("jaxpr")
        if inner is not None and _marked(inner.jaxpr if isinstance(inner, core.ClosedJaxpr) else inner):
            return True
    return False
