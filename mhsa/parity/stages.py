"""The "stages and gradients" section of `mhsa parity`: every named stage of every backend's real
forward pass (its trace) and the loss, then the gradient of every parameter from each backend's
own loss_and_grads, the reference's also held against a float64 finite difference."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mhsa import registry
from mhsa.parity.adapters import ADAPTERS, central_difference
from mhsa.parity.lanes import Lanes
from mhsa.parity.rows import FD, Row, pair_key, pairs, reference
from mhsa.parity.runs import inputs, lane64
from shared.tolerances import derived, max_abs_diff, reference_error, scale, stage_kind, tolerance
from shared.trace import STAGES
from shared.weights import init_weights


def stage_and_gradient_rows(config, dtype, seed, mask=None, samples=6, adapters=None) -> list[Row]:
    """One row per named stage and the loss, then one per parameter gradient.

    Gradients come from each backend's own loss_and_grads (autodiff, or numpy_ref's
    hand-written backward); the reference backend's gradient is also held against a
    fourth-order finite difference of numpy_ref's loss in float64 at `samples` coordinates
    of every parameter, an independent check that no backend's gradient can share a bug with.
    A backend without gradients is compared through the finite difference alone."""
    return stage_and_gradient_section(config, dtype, seed, mask=mask, samples=samples, adapters=adapters)()


def stage_and_gradient_section(config, dtype, seed, mask=None, samples=6, adapters=None, lanes: Lanes | None = None) -> Callable[[], list[Row]]:
    """stage_and_gradient_rows in two steps: each backend's forward and gradients, the
    reference's again in float64 (float32 only: what the tolerances are derived from) and the
    finite differences are submitted to `lanes` (one lane per backend, one for the float64
    reference) now; the returned function waits for them and builds the rows."""
    adapters = adapters or ADAPTERS
    lanes = lanes or Lanes(inline=True)
    names = registry.names()
    ref = reference()
    with_grads = registry.names("grads")
    arrays = init_weights(config, seed, dtype)
    arrays64 = {name: value.astype(np.float64) for name, value in arrays.items()}
    tokens, targets = inputs(config, seed)
    outputs = {
        name: lanes.submit(name, _forward_and_grads, adapters[name], name in with_grads, tokens, targets, arrays, config, mask) for name in names
    }
    twin = None
    if dtype == "float32":  # the same weights, cast up, and inputs: the reference's own error
        twin = lanes.submit(lane64(ref), _forward_and_grads, adapters[ref], ref in with_grads, tokens, targets, arrays64, config, mask)

    # the coordinates in backward order (read-out first, embeddings last), the order the
    # gradients are computed in: the first row that fails is the parameter nearest to where
    # the backward passes part
    rng = np.random.default_rng(seed)
    coords = {name: [tuple(int(rng.integers(0, size)) for size in value.shape) for _ in range(samples)] for name, value in reversed(arrays.items())}
    estimates = lanes.submit(lane64(ref), _finite_differences, arrays64, coords, tokens, targets, config, mask)

    def rows() -> list[Row]:
        traces, losses, grads = {}, {}, {}
        for name, future in list(outputs.items()) + ([(TWIN, twin)] if twin is not None else []):
            traces[name], loss_and_grads = future.result()
            if loss_and_grads is not None:
                losses[name], grads[name] = loss_and_grads
        return _stage_rows(traces, losses, dtype) + _gradient_rows(grads, coords, estimates.result(), samples, dtype)

    return rows


TWIN = "reference float64"  # the reference's float64 run, beside the backends in traces, losses and grads


def _forward_and_grads(adapter, with_grads: bool, tokens, targets, arrays, config, mask):
    """One backend's trace of every named stage (name -> array) and, if it has them, its
    (loss, gradients) from its own loss_and_grads."""
    trace: dict[str, np.ndarray] = {}
    adapter.forward(tokens, arrays, config, mask=mask, trace=trace)
    return trace, adapter.loss_and_grads(tokens, targets, arrays, config, mask=mask) if with_grads else None


def _finite_differences(arrays64, coords, tokens, targets, config, mask) -> dict[str, np.ndarray]:
    """name -> (samples,): the reference loss's float64 finite difference at each coordinate."""
    return {name: np.array([central_difference(arrays64, name, c, tokens, targets, config, mask) for c in at]) for name, at in coords.items()}


def _tolerance(found: dict, kind: str, dtype: str, key=None) -> tuple[float, float | None]:
    """(tolerance, the reference's own error) of one comparison: derived from the reference's
    float32 value against its float64 twin's in `found` (traces, losses or grads, selected by
    key), or fixed (float64, or no twin) with no error."""
    ref = reference()
    if dtype != "float32" or TWIN not in found or ref not in found:
        return tolerance(kind, dtype), None
    ref32, ref64 = (found[ref], found[TWIN]) if key is None else (found[ref][key], found[TWIN][key])
    error = reference_error(ref32, ref64)
    return derived(error, scale(ref64)), error


def _stage_rows(traces, losses, dtype) -> list[Row]:
    """One row per named stage, then the loss: every pair's max |a - b|."""
    rows = []
    for stage in STAGES:
        diffs: dict[str, float | None] = {pair_key(a, b): max_abs_diff(traces[a][stage], traces[b][stage]) for a, b in pairs()}
        tol, error = _tolerance(traces, stage_kind(stage), dtype, stage)
        rows.append(Row("stage", stage, diffs, tol=tol, reference_error=error))
    tol, error = _tolerance(losses, "stage", dtype)
    diffs = {pair_key(a, b): abs(losses[a] - losses[b]) if a in losses and b in losses else None for a, b in pairs()}
    rows.append(Row("stage", "loss", diffs, tol=tol, reference_error=error))
    return rows


def _gradient_rows(grads, coords, estimate, samples, dtype) -> list[Row]:
    """One row per parameter in `coords`' (backward) order: every pair's max |a - b| of the
    gradients, and the reference's float64 gradient against the finite difference at the
    coordinates, held to float64's gradient tolerance."""
    ref = reference()
    exact = TWIN if TWIN in grads else ref  # the reference's float64 gradient
    fd_tol = tolerance("grad", "float64")
    rows = []
    for name, at in coords.items():
        diffs: dict[str, float | None] = {}
        for a, b in pairs():
            if a in grads and b in grads:
                diffs[pair_key(a, b)] = max_abs_diff(grads[a][name], grads[b][name])
            else:  # one side has no gradient of its own: both against the finite difference
                known = grads.get(a, grads.get(b))
                diffs[pair_key(a, b)] = max_abs_diff([known[name][c] for c in at], estimate[name]) if known else None
        if exact in grads:
            diffs[FD] = max_abs_diff([grads[exact][name][c] for c in at], estimate[name])
            note = f"{FD}: {ref}'s float64 gradient against a float64 finite difference at {samples} coords per parameter, held to {fd_tol:.0e}"
        else:
            note = f"{ref} has no gradient of its own: the others are held against a float64 finite difference at {samples} coords"
        tol, error = _tolerance(grads, "grad", dtype, name)
        rows.append(Row("gradient", name, diffs, tol=tol, note=note, reference_error=error, tols={FD: fd_tol}))
    return rows
