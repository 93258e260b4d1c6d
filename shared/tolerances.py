"""docs/DESIGN.md's parity tolerances (max absolute difference) and the one way they are checked."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

# measured on a prototype: float32 trajectories within 2.2e-5 over 192 steps, float64 within 3e-15
TOLERANCES = {
    "float32": {"stage": 1e-5, "weights": 1e-6, "grad": 1e-5, "trajectory": 1e-4},
    "float64": {"stage": 1e-10, "weights": 1e-12, "grad": 1e-10, "trajectory": 1e-10},
}


def tolerance(kind: str, dtype: str) -> float:
    """kind: 'stage' (intermediates, outputs, logits, loss), 'weights', 'grad' or 'trajectory'."""
    return TOLERANCES[dtype][kind]


def stage_kind(name: str) -> str:
    return "weights" if name == "weights" else "stage"


def max_abs_diff(a: ArrayLike, b: ArrayLike) -> float:
    """max |a - b|, where equal infinities count as equal and a NaN on one side only is inf."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"cannot compare shapes {a.shape} and {b.shape}")
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    diff = np.where(same, 0.0, np.abs(a - b))
    diff = np.where(np.isnan(diff), np.inf, diff)
    return float(diff.max()) if diff.size else 0.0


def assert_close(name: str, actual: ArrayLike, expected: ArrayLike, tol: float) -> float:
    """Raise AssertionError naming the tensor, the max difference and the tolerance."""
    diff = max_abs_diff(actual, expected)
    if not diff <= tol:
        raise AssertionError(f"{name}: max abs difference {diff:.3e} exceeds tolerance {tol:.0e}")
    return diff
