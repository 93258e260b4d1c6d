"""shared.tolerances: the reference's own float32 error, the tolerance derived from it (K times
it, floored at one float32 rounding of the values compared), per step, and Adam's step error
from float32 scalars; max_abs_diff as every other caller uses it."""

import math

import numpy as np
import pytest

from shared.tolerances import UNIT_ROUNDOFF, K, adam_step_rounding, derived, max_abs_diff, reference_error, scale, stepwise

INF, NAN = math.inf, math.nan


def test_the_reference_error_is_the_float32_run_against_its_float64_twin():
    rng = np.random.default_rng(3)
    a64, b64 = rng.standard_normal((3, 5)), rng.standard_normal((5, 7))
    a32, b32 = a64.astype(np.float32), b64.astype(np.float32)
    exact = a32.astype(np.float64) @ b32.astype(np.float64)  # the same inputs, cast up
    error = reference_error(a32 @ b32, exact)
    assert 0 < error == np.abs((a32 @ b32) - exact).max()
    assert derived(error, scale(exact)) == K * max(error, UNIT_ROUNDOFF * scale(exact))


@pytest.mark.parametrize(
    "ref32, ref64, expected",
    [
        ([1.0, NAN], [1.0, 2.0], INF),  # a NaN on one side only
        ([1.0, NAN], [1.0, NAN], 0.0),  # NaN where the float64 run is NaN too
        ([INF, -INF], [INF, -INF], 0.0),  # equal infinities
        ([INF, 1.0], [3.0e38, 1.0], INF),  # the float32 run overflowed
        ([], [], 0.0),
        (np.zeros((0, 3)), np.zeros((0, 3)), 0.0),
    ],
    ids=["one-sided-nan", "nan-both", "equal-inf", "overflow", "empty", "empty-2d"],
)
def test_reference_error_keeps_max_abs_diffs_rules_for_nan_inf_and_empty(ref32, ref64, expected):
    assert reference_error(ref32, ref64) == max_abs_diff(ref32, ref64) == expected


def test_max_abs_diff_stays_what_its_other_callers_rely_on():
    assert max_abs_diff([1.0, 2.0], [1.5, 1.0]) == 1.0
    assert max_abs_diff(np.float32(1.0), 1.0) == 0.0  # scalars and mixed dtypes compare in float64
    assert max_abs_diff([NAN], [0.0]) == INF and max_abs_diff([INF], [-INF]) == INF
    with pytest.raises(ValueError, match=r"cannot compare shapes \(2,\) and \(3,\)"):
        max_abs_diff([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="cannot compare shapes"):
        reference_error(np.zeros((2, 3)), np.zeros((3, 2)))


def _by_the_rules(a, b) -> float:
    """max_abs_diff element by element, as its docstring states the rules."""
    gaps = [0.0 if (x == y or (math.isnan(x) and math.isnan(y))) else (INF if math.isnan(x) or math.isnan(y) else abs(x - y)) for x, y in zip(a, b)]
    return max(gaps, default=0.0)


@pytest.mark.parametrize("seed", range(40))
def test_max_abs_diff_and_scale_follow_their_rules_on_any_mix_of_nan_infinities_and_extremes(seed):
    rng = np.random.default_rng(seed)
    specials = np.array([NAN, INF, -INF, 0.0, -0.0, 3.0e38, -3.0e38, 1e-45, 1.7e308, -1.7e308])
    a, b = (rng.standard_normal(9) for _ in range(2))
    for x in (a, b):
        picked = rng.random(9) < 0.4
        x[picked] = rng.choice(specials, picked.sum())
    shared_places = rng.random(9) < 0.3  # equal values, NaN and infinities in the same places
    b[shared_places] = a[shared_places]
    for dtype in (np.float64, np.float32):
        with np.errstate(over="ignore"):  # float64 extremes become float32 infinities
            x, y = a.astype(dtype), b.astype(dtype)
        assert max_abs_diff(x, y) == _by_the_rules(x.astype(float).tolist(), y.astype(float).tolist()), (x, y)
        finite = np.abs(x[np.isfinite(x)]).astype(float)
        assert scale(x) == (finite.max() if finite.size else 0.0), x
    same = a.copy()
    assert max_abs_diff(a, same) == 0.0  # equal arrays with NaN and infinities in the same places


def test_an_exact_stage_is_held_to_the_floor_of_one_rounding_per_side():
    # an embedding lookup: the float32 rows are exactly the float64 rows, the error is 0
    table = np.random.default_rng(4).standard_normal((11, 5)).astype(np.float32)
    ids = np.array([3, 0, 10])
    error = reference_error(table[ids], table.astype(np.float64)[ids])
    assert error == 0.0
    tol = derived(error, scale(table[ids]))
    assert tol == K * UNIT_ROUNDOFF * np.abs(table[ids]).max() > 0
    # one rounding of the largest value on each side passes; a wrong row does not
    largest = float(np.abs(table[ids]).max())
    assert np.spacing(np.float32(largest)) <= tol < 1e-3 * largest


def test_the_floor_follows_the_values_not_a_fixed_number():
    # gradients of 1e-4 and activations of 1e3 each get one rounding of their own size
    assert derived(0.0, 1e-4) == pytest.approx(K * UNIT_ROUNDOFF * 1e-4)
    assert derived(0.0, 1e3) == pytest.approx(K * UNIT_ROUNDOFF * 1e3)
    assert derived(1e-6, 1.0) == K * 1e-6  # an error above the floor is what counts
    assert derived(0.0, 0.0) == 0.0  # all zeros: only zeros pass


def test_a_reference_that_is_not_finite_derives_no_tolerance():
    assert derived(INF, 1.0) == 0.0  # only identical values pass: nothing is excused by an overflow
    for error, size in [(NAN, 1.0), (-1e-7, 1.0), (1e-7, NAN), (1e-7, INF), (1e-7, -1.0)]:
        with pytest.raises(ValueError, match="derived: need error >= 0 and a finite scale >= 0"):
            derived(error, size)


def test_scale_is_the_largest_finite_magnitude():
    assert scale([-3.0, 2.0, NAN, INF, -INF]) == 3.0
    assert scale([]) == 0.0 and scale([NAN, INF]) == 0.0
    assert scale(np.float32(-2.5)) == 2.5


def test_stepwise_derives_each_step_and_the_running_largest_for_a_training_run():
    ref64 = np.array([4.0, 2.0, 1.0, 0.5])
    ref32 = ref64 + np.array([1e-7, -3e-6, 1e-9, 2e-7])  # crosses the exact curve at step 2
    errors, tols = stepwise(ref32, ref64)
    np.testing.assert_allclose(errors, [1e-7, 3e-6, 1e-9, 2e-7], rtol=1e-6)
    np.testing.assert_allclose(tols, [K * max(e, UNIT_ROUNDOFF * v) for e, v in zip(errors, ref64)])
    running, _ = stepwise(ref32, ref64, running=True)
    np.testing.assert_allclose(running, [1e-7, 3e-6, 3e-6, 3e-6], rtol=1e-6)
    # a response run that moves further than the float32 run sets the error from there on
    nudged = ref64 + np.array([0.0, 1e-6, 5e-6, 0.0])
    with_response, _ = stepwise(ref32, ref64, running=True, responses=[nudged])
    np.testing.assert_allclose(with_response, [1e-7, 3e-6, 5e-6, 5e-6], rtol=1e-6)


def test_stepwise_takes_steps_of_changing_shape_and_refuses_runs_of_other_lengths():
    # a decode: the prefill's (2, 3) logits, then one position per step
    ref64 = [np.ones((2, 3)), np.full((1, 3), 8.0)]
    ref32 = [np.ones((2, 3)) + 1e-7, np.full((1, 3), 8.0)]
    errors, tols = stepwise(ref32, ref64)
    np.testing.assert_allclose(errors, [1e-7, 0.0], atol=1e-15)
    assert tols[1] == K * UNIT_ROUNDOFF * 8.0
    with pytest.raises(ValueError, match="every run needs one value per step, got 1 and 2 steps"):
        stepwise(ref32[:1], ref64)
    with pytest.raises(ValueError, match="got 3 and 2 steps"):
        stepwise(ref32, ref64, responses=[ref64 + ref64[:1]])
    assert stepwise([], [])[0].shape == (0,)


def test_stepwise_after_an_overflow_holds_every_later_step_to_identical_values():
    errors, tols = stepwise([1.0, INF, 1.0], [1.0, 3e38, 1.0], running=True)
    assert list(errors) == [0.0, INF, INF] and tols[0] > 0 and list(tols[1:]) == [0.0, 0.0]


def test_adam_step_rounding_is_the_step_a_float32_beta_moves_in_the_bias_correction():
    # optax's first step: v_hat = (1 - b2) g^2 / (1 - b2**1), b2 rounded to float32 in the
    # denominator only; the step lr * m_hat / sqrt(v_hat) moves by this fraction
    b2 = 0.999
    moved = 1 - math.sqrt((1 - b2) / (1 - float(np.float32(b2))))
    assert adam_step_rounding(0.5, (0.5, b2)) == pytest.approx(abs(moved), rel=1e-3)
    # every term adds; values float32 holds exactly cost nothing
    assert adam_step_rounding(1e-2, (0.9, 0.999)) > adam_step_rounding(0.5, (0.5, 0.999)) > 0
    assert adam_step_rounding(0.5, (0.5, 0.75)) == 0.0
    for lr, betas in [(0.0, (0.9, 0.999)), (1e-3, (0.9, 1.0)), (1e-3, (-0.1, 0.9)), (NAN, (0.9, 0.999))]:
        with pytest.raises(ValueError, match="adam_step_rounding: need lr > 0 and betas in"):
            adam_step_rounding(lr, betas)
