"""The float32 rows' tolerances, derived from the reference's own error (issue 31, part 1;
shared/tolerances.py): the reference runs once more, in float64, on the same weights (its float32
ones cast up) and inputs, and each output leaf and gradient of that run is reduced at once against
its float32 twin, to the reference's own float32 error there and the largest value compared. A
row is then held to derived(error, scale): K times that error, with a floor of K float32
roundings of the largest value (an exact stage, an embedding lookup, has no error of its own).

Nothing of the float64 run is kept but those two numbers per row: the reference is float64 only
while it runs (a torch model converted in place and back: reader.float64_twin), and its outputs
live one at a time; meanwhile the memory it frees is kept for its next allocations
(mhsa/freed_memory.py). A leaf that the reference computes in float32 even in its float64 run (a
cast in its code) has no float64 twin: its row keeps the fixed tolerance, and says so; so do all
rows when the reference cannot run in float64 at all, and a row where the two runs differ by more
than rounding can (NOT_A_TWIN: a random layer left in train mode), which would otherwise loosen
its tolerance to whatever the randomness reaches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mhsa.freed_memory import kept_for_reuse
from mhsa.port_check.chunks import blocks
from mhsa.port_check.structure import Inputs, Output, is_float_dtype, map_inputs
from shared.tolerances import derived, reference_error, scale


@dataclass
class Derived:
    """The tolerances of one check's float32 rows: (error, tolerance) per output leaf, by (call,
    leaf label) of the reference's run, and per reference parameter's gradient; `fixed`: the
    output leaves computed in float32 in the float64 run; `apart`: the rows whose float64 run
    differs from the float32 one by more than rounding (NOT_A_TWIN). Both keep the fixed tolerance."""

    outputs: dict[tuple[int, str], tuple[float, float]] = field(default_factory=dict)
    grads: dict[str, tuple[float, float]] = field(default_factory=dict)
    fixed: list[str] = field(default_factory=list)
    apart: list[str] = field(default_factory=list)


# a float64 run that differs from the float32 one by more than this fraction of the largest value
# is no rounding twin (a random layer in train mode, a branch on a value): it derives nothing
NOT_A_TWIN = 1e-3


def _twin(value32: np.ndarray, value64: np.ndarray) -> tuple[float, float] | None:
    """(the reference's own error, its tolerance) of one leaf or gradient, in blocks; None when
    the two runs differ by more than rounding can."""
    error = largest_value = 0.0
    for index in blocks(value64.shape):  # both reductions of a block while it is in the cache
        block64 = value64[index]
        error, largest_value = max(error, reference_error(value32[index], block64)), max(largest_value, scale(block64))
    if not error <= NOT_A_TWIN * largest_value:
        return None
    return error, derived(error, largest_value)


def from_float64_run(reader, model, inputs, outputs32: list[Output], grads32: dict | None) -> Derived:
    """Run `model` (the reference, its reader) in float64 and derive every float32 row's
    tolerance from it against `outputs32` and `grads32` (its float32 run). Errors of the float64
    run are the caller's to report."""
    found = Derived()
    by_key = {(output.call, output.label): output for output in outputs32 if output.value is not None}

    def reduce(output64: Output) -> Output:
        twin = by_key.get((output64.call, output64.label))
        value32, value64 = None if twin is None else twin.value, output64.value
        if twin is None or value32 is None or value64 is None or twin.path != output64.path or value32.shape != value64.shape:
            return output64._replace(value=None)
        name = (twin.path or "(model output)") + twin.label
        if output64.dtype != "float64":
            found.fixed.append(name)
            return output64._replace(value=None)
        twinned = _twin(value32, value64)
        if twinned is None:
            found.apart.append(name)
        else:
            found.outputs[output64.call, output64.label] = twinned
        return output64._replace(value=None)

    with kept_for_reuse(), reader.float64_twin(model) as twin_model:  # its many large blocks reused, not faulted in anew
        _, grads64 = reader.run(twin_model, _float64(inputs), grads32 is not None, reduce)
        for name, grad64 in (grads64 or {}).items():
            if grads32 is not None and name in grads32 and grads32[name].shape == grad64.shape:
                twinned = _twin(grads32[name], grad64)
                if twinned is None:
                    found.apart.append(f"grad {name}")
                else:
                    found.grads[name] = twinned
        del grads64
    return found


def _float64(inputs: Inputs) -> Inputs:
    """The inputs with every floating array in float64 (exactly: they are float32 values)."""
    return map_inputs(inputs, lambda x: np.asarray(x).astype(np.float64) if is_float_dtype(np.asarray(x).dtype) else x)
