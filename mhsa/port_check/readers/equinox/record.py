"""Every submodule call of an Equinox model, captured in the order the calls return, without
patching any class and without letting a traced value escape its transformation.

An Equinox model is an immutable pytree, and its code calls its submodules inside transformations
of its own (`jax.vmap(self.norm)(x)` over a sequence, `jax.lax.scan` over a stack of layers). So a
copy of the model is built (`eqx.tree_at`) whose every submodule is a `Recorder`: it calls its
module and passes the output through readers/marks.py's `Calls.mark`, which records it where it
returns, inside those transformations too (a stack of layers scanned, one layer at a time).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax

from mhsa.port_check.core.structure import Inputs, split_arrays
from mhsa.port_check.readers import marks
from mhsa.port_check.readers.marks import Calls


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
        return self.calls.mark(self.path, self.module(*args, **kwargs))


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


def run(
    model: Any, names: list[str], inputs: Inputs, batched: bool, parameters: dict[int, str] | None = None, eager: bool = False
) -> tuple[list[tuple[str, Any]], Any]:
    """Call `model` on `inputs`, per example under jax.vmap over the first axis of every input array
    unless `batched`: ([(path, output)] of every recorded call in return order, the model's own
    last under path "", the model's output). parameters: {id(array): neutral name} of the model's
    arrays (readers/marks.py runs a scan of them layer by layer); eager: run untraced."""
    calls = Calls(eager)
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

    found, output = marks.run(forward, (dynamic, arrays), parameters or {}, calls)
    output = eqx.combine(output, kept["static"])
    return found + [("", output)], output
