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
    return _zero({name: largest_abs(grad) for name, grad in grads.items()})


def _zero(largest: dict[str, float]) -> set[str]:
    """The names whose largest |float64 gradient| is within ZERO of the largest of all."""
    top = max(largest.values(), default=0.0)
    return {name for name, value in largest.items() if value <= ZERO * top}


def from_twin_run(dtype: str, reader, model, inputs, outputs: list[Output], grads: dict | None, direction=None, pulling=None) -> Derived:
    """Run `model` through `reader` once more in `dtype`, the other precision, reducing each output
    leaf and gradient against its twin in `outputs` and `grads` (the check's run, its gradients
    along `direction`) as the run hands it over: no set of the twin's gradients is ever held whole.
    "float64" in a float32 check: every row's own error. "float32" in a float64 check: that of the
    rows that fall to float32, held to K times it as a float32 check holds every row, not to a fixed
    number blind to their size. pulling: (each) -> a taker of the run's gradients in its own names
    that hands them to `each` in the names `grads` has (the port's pulled back into the
    reference's: pairing.Pulling). Errors of the run are the caller's to report."""
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

    errors = GradientErrors(grads or {}, up)
    taker = errors if pulling is None else pulling(errors)
    # in float64 exactly the float32 run's inputs and weights, cast up
    in_dtype = reader.float64_twin(model, grads is not None) if up else contextlib.nullcontext(reader.cast(model, "float32")[0])
    # its many large blocks reused, not faulted in anew; not with gradients, whose blocks of many sizes
    # (each weight's float64 copy, again in backward, its gradient) would add up, kept, and gain nothing
    reuse = kept_for_reuse() if grads is None else contextlib.nullcontext()
    with reuse, in_dtype as twin_model:
        reader.run(twin_model, cast_floats(inputs, dtype), direction if grads is not None else None, reduce, None, taker)
    errors.into(found)
    return found


class GradientErrors:
    """Each gradient of a twin run, as the run hands it over (`self(name, array)`), reduced at once
    against the check run's gradient of that name (`held`) to (its own error, the largest float64
    value); `into` then sorts them: twins, zero in exact arithmetic (ZERO), apart."""

    def __init__(self, held: dict[str, np.ndarray], up: bool):
        self.held, self.up = held, up  # up: the twin is the float64 side
        self.errors: dict[str, tuple[float, float]] = {}
        self.largest: dict[str, float] = {}  # every float64 gradient's largest |value|, for ZERO

    def __call__(self, name: str, twin: np.ndarray) -> None:
        value = self.held.get(name)
        if value is None or value.shape != twin.shape:
            if self.up:
                self.largest[name] = largest_abs(twin)
            return
        grad32, grad64 = (value, twin) if self.up else (twin, value)
        self.errors[name] = _twin(grad32, grad64)
        self.largest[name] = self.errors[name][1]

    def into(self, found: Derived) -> None:
        """Each gradient's own error into found.grads where the two runs are rounding twins or its
        exact value is 0 (found.zero), the others into found.apart."""
        found.zero = _zero(self.largest) if self.up else zero_gradients(self.held)  # not up: the check run's are the float64 ones
        for name, (error, largest_value) in self.errors.items():
            if name in found.zero or is_twin(error, largest_value):
                found.grads[name] = error, largest_value
            else:
                found.apart.append(f"grad {name}")
