"""Tolerances of the port check through training, derived from the reference's own error.

A float32 comparison of the port against the reference is held to K times the reference's own
float32 error at that step and that tensor: the largest |reference in float32 - reference in
float64| over the tensor's elements, both runs from the same weights on the same batches. Two
independent float32 computations each carry rounding of that size, so a faithful port sits
within a small multiple of it; a bug does not. Where the reference's own error is (nearly)
zero, an exact stage, the floor is FLOOR_ULPS units in the last place of the tensor's largest
value. A float64 check has no higher precision to derive from: its rows hold a fixed tolerance,
docs/DESIGN.md's trajectory tolerance, and say so.
"""

from __future__ import annotations

import numpy as np

from shared.tolerances import max_abs_diff, tolerance

K = 4  # the same constant as issue 31's part 1 (shared/tolerances.py, once it lands there)
FLOOR_ULPS = 2


def derived(reference, reference64, dtype: str) -> tuple[float, float | None]:
    """(tolerance, the reference's own error) for comparing a port's `dtype` value against
    `reference` (the reference's value in `dtype`); reference64 is the reference's float64
    value (ignored for a float64 check, whose tolerance is fixed: the error is then None)."""
    if dtype == "float64":
        return tolerance("trajectory", "float64"), None
    reference = np.asarray(reference)
    error = max_abs_diff(reference, reference64)
    scale = float(np.max(np.abs(reference64))) if np.size(reference64) else 0.0
    floor = FLOOR_ULPS * float(np.finfo(np.dtype(dtype)).eps) * scale
    return max(K * error, floor), error
