"""Tolerances of the port check through training, derived from the two sides' own errors.

A float32 comparison of the port against the reference, at one step and one tensor, is held to
K times the larger of the two sides' own float32 errors there: each side's float32 run against
its own float64 run (same weights, same batches), the largest difference over the tensor's
elements. Two independent float32 computations each carry rounding of that size, so a faithful
port sits within a small multiple of it; a bug does not, since it is in both of the port's runs.

The reference's error alone is not enough through training: optax computes Adam's bias
correction 1 - b2**t in float32 (1.3e-5 off for b2 = 0.999, where torch computes it in Python
floats), so a faithful optax.adam port moves each parameter 7e-6 of its update away from torch at
every step, up to 570x the reference's own error over 20 steps of tests/tools/port_check_train's
MLP; and a scalar row (the loss) has one element, whose rounding can be small by chance on one
side. The larger of the two errors covers both; the port's float64 run costs one compilation more.

K, the floor and the derivation are shared/tolerances.py's, as `mhsa parity` and the forward
port check hold them: K times the error, never less than K float32 roundings of the tensor's
largest value (an exact stage). The forward rows shown at the first failing step are the
forward check's own (the reference's error alone: whole tensors at one set of weights, with no
optimizer in between). A float64 check has no higher precision to derive from: its rows hold
docs/DESIGN.md's float64 trajectory tolerance, fixed, and say so.
"""

from __future__ import annotations

from shared import tolerances
from shared.tolerances import reference_error, scale, tolerance


def derived(value, value64, dtype: str) -> tuple[float, float | None]:
    """(tolerance, own error) from one side's own error: its `dtype` value against its float64
    value (value64 is ignored for a float64 check, whose tolerance is fixed: the error is then
    None). A row takes the larger of the two sides' tolerances."""
    if dtype == "float64":
        return tolerance("trajectory", "float64"), None
    error = reference_error(value, value64)
    return tolerances.derived(error, scale(value64)), error
