"""The float64 twin of a JAX model whose code asks for float32 by hand, for every reader of a JAX
library: inside `widening()`, the program a model traces to is evaluated once more, operation by
operation, with every float32 it asks for as float64, and traced anew. So a careful model's upcasts
(`x.astype(jnp.float32)` in a norm, `jnp.asarray(x, jnp.float32)`, `jax.lax.convert_element_type`,
`jnp.arange(n, dtype=jnp.float32)` for a rotary table, a matmul's `preferred_element_type`) stay
float64 in the twin instead of rounding it to float32 there. The twin is the tolerances' reference
run: a float32 step in it would make its rows no better than the float32 run they measure. A cast
below float32 (bfloat16, float16) is kept: it is the model's precision, not an upcast; a rounding to
float32's precision (`reduce_precision`) is passed over.

An operation holding a program of its own (a jit, a remat, a scan, a while loop, a cond, a custom
derivative's function) is rebuilt around its program widened in turn, by the public function that
makes it (jax.checkpoint, jax.lax.scan, ...), so the marks of readers/marks.py inside it stay where
they are. A custom derivative is replaced by the derivative of its function, the same in exact
arithmetic. An operation this module does not know that holds a program of its own is bound as it
is; where that fails, `widened` gives None and the twin runs as the model's code asks (its float32
rows keep the fixed tolerance, as the report says).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.extend import core

NARROW, WIDE = np.dtype("float32"), np.dtype("float64")
_ACTIVE = contextvars.ContextVar("mhsa_port_check_widening", default=False)


@contextlib.contextmanager
def widening() -> Iterator[None]:
    """While open, JAX programs the readers trace (readers/marks.py) are widened."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> bool:
    return _ACTIVE.get()


def widened(closed: core.ClosedJaxpr, args: list) -> core.ClosedJaxpr | None:
    """`closed` traced again on `args` with every float32 it asks for as float64; None where one
    of its operations cannot be rebuilt so (the model then runs as it is)."""
    try:
        return jax.make_jaxpr(lambda *values: evaluate(closed.jaxpr, closed.consts, list(values)))(*args)
    except Exception:  # an operation holding a program this module cannot rebuild: the twin as the code asks
        return None


def _wide(value: Any) -> Any:
    """float32 as float64: a dtype, or an array or scalar of the program (a literal, a constant)."""
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return WIDE if np.dtype(value) == NARROW else value
    if isinstance(value, (np.ndarray, np.generic, jax.Array)) and value.dtype == NARROW:
        return value.astype(WIDE)
    return value


def evaluate(jaxpr: core.Jaxpr, consts: list, args: list) -> list:
    """jaxpr's outputs on `args`, each operation bound with float32 widened (its parameters, its
    literals, the program's constants); an operation holding a program of its own by its rule."""
    env: dict = {}

    def read(atom):
        return _wide(atom.val) if isinstance(atom, core.Literal) else env[atom]

    env.update(zip(jaxpr.constvars, [_wide(const) for const in consts]))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        values = [read(atom) for atom in eqn.invars]
        rule = RULES.get(eqn.primitive.name)
        outs = rule(eqn.params, values) if rule is not None else _bind(eqn, values)
        env.update(zip(eqn.outvars, outs))
    return [read(atom) for atom in jaxpr.outvars]


def _bind(eqn, values: list) -> list:
    """One operation bound with float32 in its parameters as float64 (a cast's new_dtype, an iota's
    dtype, a matmul's preferred_element_type)."""
    if eqn.primitive.name == "reduce_precision":  # a rounding to a narrower precision's: passed over
        return values
    params: Any = eqn.primitive.get_bind_params({name: _wide(value) for name, value in eqn.params.items()})
    subfuns, params = params if isinstance(params, tuple) else ((), params)
    manager = getattr(getattr(eqn, "ctx", None), "manager", None)  # the operation's own context (its sharding, say)
    with manager if manager is not None else contextlib.nullcontext():
        outs = eqn.primitive.bind(*subfuns, *values, **params)
    return list(outs) if eqn.primitive.multiple_results else [outs]


def _closed(program) -> tuple[core.Jaxpr, list]:
    """(jaxpr, consts) of a ClosedJaxpr or a bare Jaxpr."""
    return (program.jaxpr, list(program.consts)) if isinstance(program, core.ClosedJaxpr) else (program, [])


def _inline(key: str) -> Callable[[dict, list], list]:
    """The rule of an operation that calls the program in params[key] on its operands: the program inline."""

    def rule(params: dict, values: list) -> list:
        return evaluate(*_closed(params[key]), values)

    return rule


def _remat(params: dict, values: list) -> list:
    jaxpr, consts = _closed(params["jaxpr"])
    rematerialized = jax.checkpoint(lambda *args: evaluate(jaxpr, consts, list(args)), prevent_cse=params["prevent_cse"], policy=params["policy"])
    return list(rematerialized(*values))


def _scan(params: dict, values: list) -> list:
    jaxpr, consts = _closed(params["jaxpr"])
    n_consts, n_carry = params["num_consts"], params["num_carry"]
    fixed, init, xs = values[:n_consts], values[n_consts : n_consts + n_carry], values[n_consts + n_carry :]

    def step(carry, x):
        outs = evaluate(jaxpr, consts, [*fixed, *carry, *x])
        return outs[:n_carry], outs[n_carry:]

    carry, ys = jax.lax.scan(step, init, xs, length=params["length"], reverse=params["reverse"], unroll=params["unroll"])
    return [*carry, *ys]


def _while(params: dict, values: list) -> list:
    (cond, cond_consts), (body, body_consts) = _closed(params["cond_jaxpr"]), _closed(params["body_jaxpr"])
    n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
    for_cond, for_body, init = values[:n_cond], values[n_cond : n_cond + n_body], values[n_cond + n_body :]
    return list(
        jax.lax.while_loop(
            lambda carry: evaluate(cond, cond_consts, [*for_cond, *carry])[0], lambda carry: evaluate(body, body_consts, [*for_body, *carry]), init
        )
    )


def _cond(params: dict, values: list) -> list:
    index, operands = values[0], values[1:]
    branches = [lambda *args, branch=branch: evaluate(*_closed(branch), list(args)) for branch in params["branches"]]
    return list(jax.lax.switch(index, branches, *operands))


# operations that hold a program of their own, by primitive name
RULES: dict[str, Callable[[dict, list], list]] = {
    "jit": _inline("jaxpr"),
    "pjit": _inline("jaxpr"),
    "closed_call": _inline("call_jaxpr"),
    "core_call": _inline("call_jaxpr"),
    "custom_jvp_call": _inline("call_jaxpr"),
    "custom_vjp_call": _inline("call_jaxpr"),
    "custom_vjp_call_jaxpr": _inline("fun_jaxpr"),
    "remat2": _remat,
    "checkpoint": _remat,
    "scan": _scan,
    "while": _while,
    "cond": _cond,
}
