"""The float32 rows' tolerances, derived from each side's own error (shared/tolerances.py; the
design is docs/DESIGN.md's "The port check"): a model runs once more in float64 on the same weights
(its float32 ones cast up) and inputs, and each output leaf and gradient of that run is reduced at
once against its float32 twin to two numbers, the model's own float32 error there and the largest
value compared; nothing else of the run is kept. A row is held to K times the larger of the two
sides' errors (the port's measured only once a row fails on the reference's alone, since its
tolerance can only grow), at least K float32 roundings of the largest value (an exact stage, an
embedding lookup, has no error of its own). A leaf computed in float32 even in the float64 run (a
cast in the model's code) has no twin and keeps the fixed tolerance, as does a row whose two runs
differ by more than rounding can (NOT_A_TWIN; forward/check.py says why); a gradient that is 0 in
exact arithmetic (ZERO) is rounding on both sides, and its row says so.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from mhsa.port_check.core.chunks import blocks, largest_abs
from mhsa.port_check.core.structure import Output, cast_floats
from shared.malloc import kept_for_reuse
from shared.tolerances import reference_error, scale


@dataclass
class Derived:
    """One model's own float32 errors: (error, largest value) per output leaf, by (call, label), and
    per parameter's gradient; `zero`: the parameters whose exact gradient is 0; keeping the fixed
    tolerance, `fixed` (leaves computed in float32 in the float64 run) and `apart` (NOT_A_TWIN)."""

    outputs: dict[tuple[int, str], tuple[float, float]] = field(default_factory=dict)
    grads: dict[str, tuple[float, float]] = field(default_factory=dict)
    zero: set[str] = field(default_factory=set)
    fixed: list[str] = field(default_factory=list)
    apart: list[str] = field(default_factory=list)


# a float64 run that differs from the float32 one by more than this fraction of the largest value
# is no rounding twin (a random layer in train mode, a branch on a value): it derives nothing
NOT_A_TWIN = 1e-3
# a gradient whose float64 values are all within this fraction of the model's largest gradient is
# 0 in exact arithmetic: float64 rounds a sum of terms of that size to about 1e-16 of them
ZERO = 2.0**-36


def _twin(value32: np.ndarray, value64: np.ndarray) -> tuple[float, float]:
    """(the model's own error, the largest value) of one leaf or gradient, in blocks."""
    error = largest_value = 0.0
    for index in blocks(value64.shape):  # both reductions of a block while it is in the cache
        block64 = value64[index]
        error, largest_value = max(error, reference_error(value32[index], block64)), max(largest_value, scale(block64))
    return error, largest_value


def is_twin(error: float, largest_value: float) -> bool:
    """Whether a float64 run within `error` of the float32 one on values up to `largest_value` is its rounding twin."""
    return error <= NOT_A_TWIN * largest_value


def zero_gradients(grads: dict[str, np.ndarray]) -> set[str]:
    """The parameters whose gradient is 0 in exact arithmetic, from float64 gradients: each of their
    values within ZERO of the largest gradient of the model (all of them when it is 0 everywhere)."""
    largest = {name: largest_abs(grad) for name, grad in grads.items()}
    top = max(largest.values(), default=0.0)
    return {name for name, value in largest.items() if value <= ZERO * top}


def from_twin_run(dtype: str, reader, model, inputs, outputs: list[Output], grads: dict | None, direction=None, pull=None) -> Derived:
    """Run `model` through `reader` once more in `dtype`, the other precision, reducing each output
    leaf and gradient against its twin in `outputs` and `grads` (the check's run, its gradients
    along `direction`). "float64" in a float32 check: every row's own error. "float32" in a float64
    check: that of the rows that fall to float32, held to K times it as a float32 check holds every
    row, not to a fixed number blind to their size. pull: the run's gradients -> the names `grads`
    has (the port's pulled back into the reference's). Errors of the run are the caller's to report."""
    found = Derived()
    by_key = {(output.call, output.label): output for output in outputs if output.value is not None}
    up = dtype == "float64"

    def reduce(output: Output) -> Output:
        twin = by_key.get((output.call, output.label))  # the check's run there: compared where both hold a value, at one path and shape
        if twin is None or twin.value is None or output.value is None or twin.path != output.path or twin.value.shape != output.value.shape:
            return output._replace(value=None)
        name = (twin.path or "(model output)") + twin.label
        if up and (output.dtype != "float64" or (output.floor is not None and output.floor < 3)):  # a float32 step inside
            found.fixed.append(name)
            return output._replace(value=None)
        error, largest_value = _twin(*((twin.value, output.value) if up else (output.value, twin.value)))  # (float32, float64)
        if is_twin(error, largest_value):
            found.outputs[output.call, output.label] = error, largest_value
        else:
            found.apart.append(name)
        return output._replace(value=None)

    # in float64 exactly the float32 run's inputs and weights, cast up
    in_dtype = reader.float64_twin(model, grads is not None) if up else contextlib.nullcontext(reader.cast(model, "float32")[0])
    with kept_for_reuse(), in_dtype as twin_model:  # its many large blocks reused, not faulted in anew
        _, twin_grads = reader.run(twin_model, cast_floats(inputs, dtype), direction if grads is not None else None, reduce)
        if pull is not None and twin_grads is not None:
            twin_grads = pull(twin_grads)
        _gradient_errors(found, *((grads, twin_grads) if up else (twin_grads, grads)))
        del twin_grads
    return found


def _gradient_errors(found: Derived, grads32: dict | None, grads64: dict | None) -> None:
    """Each gradient's own error into found.grads where the two runs are rounding twins or its exact
    value is 0 (found.zero, from the float64 gradients); the others into found.apart."""
    found.zero = zero_gradients(grads64 or {})
    for name, grad64 in (grads64 or {}).items():
        grad32 = (grads32 or {}).get(name)
        if grad32 is None or grad32.shape != grad64.shape:
            continue
        error, largest_value = _twin(grad32, grad64)
        if name in found.zero or is_twin(error, largest_value):
            found.grads[name] = error, largest_value
        else:
            found.apart.append(f"grad {name}")
