"""What a traced JAX program tells about a model before it runs: which of its inputs it reads, the
layout (core/layouts.py) of each of its outputs and which recorded outputs each is computed from,
read off its jaxpr (`jax.jit(f).trace(...).jaxpr`: every operation with its inputs and outputs):
- an input is read when an operation that leads to an output uses it (a converter's leftover, a
  variable the model never touches, is not);
- a convolution's output has the layout its dimension numbers give (Flax's NHWC); a pooling
  (reduce_window), a padding, a slice or a concatenation keeps its input's; a transpose moves it;
  an operation whose result has the shape of an input with a layout keeps it; a matmul over the
  channels of a channels-last array keeps it; anything else (a reshape, an einsum) has none.
Operations holding programs of their own (a nested jit, a custom_jvp such as jax.nn.gelu) are
followed inside.
"""

from __future__ import annotations

from jax.extend import core

from mhsa.port_check.core import layouts
from mhsa.port_check.core.structure import RANKS, dtype_name, is_float_dtype

# primitives that keep the rank and the layout of an input with one: the poolings, then paddings, slices, concatenations
POOLINGS = {"reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window", "select_and_gather_add"}
SAME_RANK = POOLINGS | {"pad", "slice", "dynamic_slice", "concatenate", "rev"}


def _inner(eqn) -> core.Jaxpr | None:
    """The program an operation runs (a nested jit, a custom_jvp_call, ...), when it takes and gives
    what the operation does; None for a plain primitive."""
    for inner in core.jaxprs_in_params(eqn.params):
        jaxpr = inner.jaxpr if isinstance(inner, core.ClosedJaxpr) else inner
        if len(jaxpr.invars) == len(eqn.invars) and len(jaxpr.outvars) == len(eqn.outvars):
            return jaxpr
    return None


def _is_var(atom) -> bool:
    return isinstance(atom, core.Var)


def flow(closed: core.ClosedJaxpr, marks: list[int]) -> list[tuple[layouts.Axes | None, int, int | None]]:
    """(layout, upstream, floor) of each output of the program: upstream the union of the `marks`
    (bits, one per output: the calls that return it) of the outputs it is computed from, floor the
    lowest precision (structure.RANKS) on its way from the program's inputs (None: a constant)."""
    jaxpr = closed.jaxpr if isinstance(closed, core.ClosedJaxpr) else closed
    own: dict = {}
    for atom, mark in zip(jaxpr.outvars, marks):
        if _is_var(atom):
            own[atom] = own.get(atom, 0) | mark
    inputs = [(None, 0, _rank(var)) for var in jaxpr.invars]
    known = _walk(jaxpr, inputs, own)
    results = []
    for atom in jaxpr.outvars:
        axes, bits, floor = _of(known, atom)
        results.append((axes, bits & ~own.get(atom, 0) if _is_var(atom) else 0, floor))
    return results


def _rank(var) -> int | None:
    """The precision rank of a variable's floating dtype; None for another dtype."""
    dtype = getattr(getattr(var, "aval", None), "dtype", None)
    return RANKS.get(dtype_name(dtype)) if dtype is not None and is_float_dtype(dtype) else None


def _of(known: dict, atom) -> tuple:
    """(layout, upstream bits, floor) of an operation's argument: a literal's is (None, 0, None)."""
    return known.get(atom, (None, 0, None)) if _is_var(atom) else (None, 0, None)


def _walk(jaxpr: core.Jaxpr, inputs: list, own: dict) -> dict:
    """{var: (layout, upstream bits, floor)} of every variable of the program, from its inputs'
    (one triple per input); `own`: bits a variable adds for the variables computed from it."""
    known: dict = {}
    for var, (axes, bits, floor) in zip(jaxpr.invars, inputs):
        known[var] = (axes, bits | own.get(var, 0), floor)
    for eqn in jaxpr.eqns:
        ins = [_of(known, atom) for atom in eqn.invars]
        bits = 0
        for _, b, _ in ins:
            bits |= b
        floors = [floor for _, _, floor in ins if floor is not None]
        inner = _inner(eqn)
        if inner is not None:
            found = _walk(inner, ins, {})
            outs = [_of(found, atom) for atom in inner.outvars]
        else:
            outs = []
            for out in eqn.outvars:
                rank = _rank(out)
                floor = min(floors + ([rank] if rank is not None else [])) if floors else None  # from the inputs: its least precise step
                outs.append((_layout(eqn, [axes for axes, _, _ in ins], out), bits, floor))
        for var, (axes, b, floor) in zip(eqn.outvars, outs):
            if axes is not None and len(axes) != len(getattr(var.aval, "shape", ())):
                axes = None
            known[var] = (axes, b | own.get(var, 0), floor)
    return known


def _layout(eqn, ins: list, out) -> layouts.Axes | None:
    name = eqn.primitive.name
    shape = tuple(getattr(out.aval, "shape", ()))
    if name == "conv_general_dilated":
        return tuple(int(axis) for axis in eqn.params["dimension_numbers"].out_spec)
    if name == "transpose":
        return layouts.transposed(ins[0], eqn.params["permutation"])
    shaped = [(axes, tuple(getattr(atom.aval, "shape", ()))) for axes, atom in zip(ins, eqn.invars) if axes is not None]
    if name in SAME_RANK:
        return next((axes for axes, in_shape in shaped if len(in_shape) == len(shape)), None)
    if name == "dot_general":  # x @ kernel over the channels of a channels-last x keeps its layout
        (contracting, _), (batch, _) = eqn.params["dimension_numbers"]
        lhs = ins[0]
        if layouts.channels_last(lhs) and tuple(contracting) == (len(lhs) - 1,) and not batch and len(shape) == len(lhs):
            return lhs
        return None
    return next((axes for axes, in_shape in shaped if in_shape == shape), None)


def read_inputs(closed: core.ClosedJaxpr) -> list[bool]:
    """For each input of the program, whether an operation that leads to an output reads it."""
    jaxpr = closed.jaxpr if isinstance(closed, core.ClosedJaxpr) else closed
    live = {atom for atom in jaxpr.outvars if _is_var(atom)}
    for eqn in reversed(jaxpr.eqns):
        if eqn.effects or any(var in live for var in eqn.outvars):
            live.update(atom for atom in eqn.invars if _is_var(atom))
    return [var in live for var in jaxpr.invars]
