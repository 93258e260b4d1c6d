"""docs/DESIGN.md's parity tolerances (max absolute difference) and the one way they are checked.

A float32 comparison is held to a tolerance derived from the reference's own error there:
the reference implementation in float32 against the same reference in float64, with the same
weights (the float32 ones, cast up) and inputs. Two independent float32 computations of the
same thing each carry about the reference's rounding, so their gap can reach about twice it;
K = 6 leaves room for implementations that round less kindly than the reference (see K). The
error is never taken as less than one float32 rounding of the largest value compared (the
floor), so an exact stage (an embedding lookup, whose reference error is 0) or a value the
reference happens to round exactly still allows a few roundings:

    error = reference_error(ref32, ref64)             # max |ref32 - ref64|
    tol = derived(error, scale(ref64))                # K * max(error, UNIT_ROUNDOFF * max |ref64|)
    errors, tols = stepwise(ref32, ref64, running=True)   # per step of a trajectory (steps,)

Fixed tolerances (TOLERANCES, tolerance()) remain for float64, which has no higher-precision
twin, and wherever the reference cannot run in float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

# measured on a prototype: float32 trajectories within 2.2e-5 over 192 steps, float64 within 3e-15
TOLERANCES = {
    "float32": {"stage": 1e-5, "weights": 1e-6, "grad": 1e-5, "trajectory": 1e-4},
    "float64": {"stage": 1e-10, "weights": 1e-12, "grad": 1e-10, "trajectory": 1e-10},
}

# the gap between two float32 implementations, in units of the reference's own float32 error:
# about 2 if each carried the reference's rounding, but another faithful implementation can round
# a few times less kindly (torch's and JAX's K projection of a decode prefill: 4x numpy_ref's
# error), and a small tensor's largest error is a noisy sample. Measured over 5790 comparisons
# (every derived row of 200 reports: 8 configs, 25 seeds; benchmarks/tolerance_ratios.py): median
# 1.5, 99th percentile 3.5, largest 4.8. K = 6 stays above them and still fails a bug ten times
# the rounding (tests/tools/test_parity.py: a softmax with eps 1e-6 in its denominator)
K = 6.0
# one rounding of float32, relative: a float32 result is within this fraction of the exact value
UNIT_ROUNDOFF = float(np.finfo(np.float32).eps) / 2  # 2**-24


def tolerance(kind: str, dtype: str) -> float:
    """The fixed tolerance of docs/DESIGN.md: kind 'stage' (intermediates, outputs, logits,
    loss), 'weights', 'grad' or 'trajectory'."""
    return TOLERANCES[dtype][kind]


def stage_kind(name: str) -> str:
    return "weights" if name == "weights" else "stage"


def finite_gap(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| of two arrays of one shape in one float64 pass (each input cast as the
    subtraction reads it), or inf where a NaN or an infinity is in sight: max_abs_diff's rules
    settle those; 0.0 for empty arrays."""
    if a.size == 0:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, float64 extremes: inf below
        gap = float(np.max(np.abs(np.subtract(a, b, dtype=np.float64))))
    return gap if gap < math.inf else math.inf  # a NaN is not < inf


def max_abs_diff(a: ArrayLike, b: ArrayLike) -> float:
    """max |a - b|, where equal infinities count as equal and a NaN on one side only is inf."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"cannot compare shapes {a.shape} and {b.shape}")
    gap = finite_gap(a, b)
    if gap < math.inf:
        return gap
    a, b = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN (equal infinities are `same` already)
        diff = np.where(same, 0.0, np.abs(a - b))
    diff = np.where(np.isnan(diff), np.inf, diff)
    return float(diff.max())


def reference_error(ref32: ArrayLike, ref64: ArrayLike) -> float:
    """The reference's own float32 error: max |ref32 - ref64| (max_abs_diff's rules: inf where
    one side only is NaN or they differ by an infinity; 0 for empty arrays)."""
    return max_abs_diff(ref32, ref64)


def scale(ref64: ArrayLike) -> float:
    """max |ref64| over its finite values (0 when there are none): what the floor is relative to."""
    values = np.asarray(ref64)
    if values.size == 0:
        return 0.0
    largest = np.max(np.abs(values))  # exact in any float dtype; NaN or inf sends it to the filter below
    if np.isfinite(largest):
        return float(largest)
    values = np.abs(values.astype(np.float64, copy=False))
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else 0.0


def derived(error: float, scale: float) -> float:
    """K * max(error, UNIT_ROUNDOFF * scale): the tolerance of a float32 comparison whose
    reference has float32 error `error` on values up to `scale` in magnitude.

    An infinite reference error (reference_error's for a float32 run that overflowed or became
    NaN where its float64 twin did not) derives nothing: the tolerance is 0, and only identical
    values pass. A NaN or negative error, or a scale that is not finite, is a ValueError."""
    if not (error >= 0 and 0 <= scale < math.inf):
        raise ValueError(f"derived: need error >= 0 and a finite scale >= 0, got error={error!r}, scale={scale!r}")
    if error == math.inf:
        return 0.0
    return K * max(error, UNIT_ROUNDOFF * scale)


def stepwise(
    ref32: Sequence[ArrayLike], ref64: Sequence[ArrayLike], running: bool = False, responses: Sequence[Sequence[ArrayLike]] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """(errors, tolerances), both (steps,), for the per-step values of the reference in float32
    and in float64 (a value per step: a loss, or an array whose shape may change from step to
    step): each step's reference_error and derived tolerance.

    running=True takes each step's error as the largest up to that step: for a training run,
    whose rounding accumulates in the weights while the loss, one number, can cross the exact
    curve (an error near 0 at a step says nothing about the weights there). responses: more
    float64 runs of the reference, each with one input moved by a rounding float32 cannot
    resolve (adam_step_rounding): where one of them moves further from ref64 than ref32 does,
    that is the step's error."""
    errors = np.zeros(len(ref64))
    for run in (ref32, *responses):
        if len(run) != len(ref64):
            raise ValueError(f"stepwise: every run needs one value per step, got {len(run)} and {len(ref64)} steps")
        errors = np.maximum(errors, [reference_error(a, b) for a, b in zip(run, ref64)])
    if running and errors.size:
        errors = np.maximum.accumulate(errors)
    tolerances = np.array([derived(float(error), scale(b)) for error, b in zip(errors, ref64)], dtype=np.float64)
    return errors, tolerances


def adam_step_rounding(lr: float, betas: tuple[float, float]) -> float:
    """The relative error of a float32 Adam step from its scalars alone: a float32 optimizer
    holds lr, b1 and b2 rounded to float32, and where it mixes a rounded beta with the exact
    one (optax: the moment update takes 1 - b2 from the Python float, the bias correction
    1 - b2**t from b2 rounded) the bias correction, near 0 in the first steps, magnifies the
    rounding by 1 / (1 - b): |fl(lr) - lr| / lr + |fl(b1) - b1| / (1 - b1) + |fl(b2) - b2| / (2 (1 - b2)),
    the last halved by the square root of v. 6.7e-6 for lr 1e-2 and betas (0.9, 0.999); 0 for
    values float32 holds exactly. A reference whose scalars are float64 (numpy_ref's, torch's)
    never feels it: the trajectory's reference runs once more in float64 with its step this much
    smaller, and the response joins its error."""
    b1, b2 = betas
    if not (lr > 0 and 0 <= b1 < 1 and 0 <= b2 < 1):
        raise ValueError(f"adam_step_rounding: need lr > 0 and betas in [0, 1), got lr={lr!r}, betas={betas!r}")

    def rounding(value: float) -> float:
        return abs(float(np.float32(value)) - value)

    return rounding(lr) / lr + rounding(b1) / (1 - b1) + rounding(b2) / (2 * (1 - b2))


def assert_close(name: str, actual: ArrayLike, expected: ArrayLike, tol: float) -> float:
    """Raise AssertionError naming the tensor, the max difference and the tolerance."""
    diff = max_abs_diff(actual, expected)
    if not diff <= tol:
        raise AssertionError(f"{name}: max abs difference {diff:.3e} exceeds tolerance {tol:.0e}")
    return diff
