"""The "trajectories" section of `mhsa parity`: the loss at every step of every backend's real
trainer, from the same weights and batches; in float64 also the final weights.

In float32 each step has its own tolerance, derived from the reference trainer's own error by
that step (its float32 run against its float64 twin: reference_twins, step_tolerances)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mhsa import registry
from mhsa.parity.lanes import Lanes
from mhsa.parity.rows import Row, pair_key, pairs, reference, stepwise_row
from mhsa.parity.runs import reference_twins, trained
from shared.config import TrainConfig
from shared.tolerances import adam_step_rounding, max_abs_diff, stepwise, tolerance

SECTION = "trajectory"


def trajectory_rows(config, dtype, seed, epochs, cache: dict | None = None) -> list[Row]:
    """The loss at every step of every backend's trainer, from the same init and batches; in
    float64 also the final weights."""
    return trajectory_section(config, dtype, seed, epochs, cache=cache)()


def trajectory_section(config, dtype, seed, epochs, cache: dict | None = None, lanes: Lanes | None = None) -> Callable[[], list[Row]]:
    """trajectory_rows in two steps: every trainer (and in float32 the reference's float64
    twins) is submitted to `lanes` now; the returned function waits for the runs and builds the rows."""
    train_config = TrainConfig(epochs=epochs, seed=seed, dtype=dtype)
    futures = {name: trained(name, config, train_config, cache=cache, lanes=lanes) for name in registry.names("train")}
    tolerances = step_tolerances(config, train_config, cache=cache, lanes=lanes)

    def rows() -> list[Row]:
        runs = {name: future.result() for name, future in futures.items()}
        steps = len(next(iter(runs.values())).losses)
        gaps = {pair_key(a, b): np.abs(np.subtract(runs[a].losses, runs[b].losses)) if a in runs and b in runs else None for a, b in pairs()}
        tols, errors, note = tolerances()
        row = stepwise_row(SECTION, f"loss at each of {steps} steps", gaps, tols, errors, note=note)
        if not row.passed:
            row.name += f", first beyond tolerance at step {row.step}"
        found = [row]
        if dtype == "float64":
            final = {name: registry.get(name).model.to_exchange(run.model) for name, run in runs.items()}
            worst = {
                pair_key(a, b): max(max_abs_diff(final[a][k], final[b][k]) for k in final[a]) if a in final and b in final else None
                for a, b in pairs()
            }
            found.append(Row(SECTION, f"weights after {steps} steps", worst, tolerance("stage", dtype)))
        return found

    return rows


def step_tolerances(config, train_config: TrainConfig, cache: dict | None = None, lanes: Lanes | None = None):
    """The per-step tolerances of the loss of a training run like train_config's, in two steps:
    the reference's runs are submitted now; the returned function gives (tolerances (steps,),
    the reference's errors (steps,) or None, a note).

    float32: the reference trainer's float32 run against its float64 twin, and the twin's
    response to a step off by float32's hold on Adam's scalars, whichever is further by each
    step (the running largest: shared.tolerances.stepwise). float64, or a reference that cannot
    train: docs/DESIGN.md's fixed trajectory tolerance."""
    ref = reference()
    if train_config.dtype != "float32" or ref not in registry.names("train"):
        fixed = tolerance("trajectory", train_config.dtype)
        note = "" if train_config.dtype != "float32" else f"{SECTION}: {ref} cannot train, so no float64 twin: fixed tolerance {fixed:.0e}"
        return lambda: (fixed, None, note)
    own = trained(ref, config, train_config, cache=cache, lanes=lanes)
    twin, nudged = reference_twins(config, train_config, cache=cache, lanes=lanes)
    rounding = adam_step_rounding(train_config.lr, train_config.betas)

    def found():
        errors, tols = stepwise(own.result().losses, twin.result().losses, running=True, responses=[nudged.result().losses])
        note = (
            f"{SECTION}: the error by each step is {ref}'s float32 loss against its float64 twin's, or the twin's move when every "
            f"Adam step is {rounding:.1e} smaller (float32's hold on lr and betas, as optax's bias correction has it), the larger"
        )
        return tols, errors, note

    return found
