"""The "trajectories" section of `mhsa parity`: every backend's real trainer from the same weights
and batches.

- Two backends with the "train_check" capability (torch, jax) are compared as `mhsa port-check
  --train` compares a port: mhsa.port_check.training.check.check_training trains each one's
  training_setup (the model, optimizer and loss train() uses, train()'s batches, built from the
  backend's public functions) and compares
  the loss, every gradient, every Adam moment and every parameter at each of the run's first
  CHECKED_STEPS steps, held to tolerances derived from the two trainers' own float32 errors
  (float64: fixed). One row: the first step and tensor where they part, or else the value
  closest to its tolerance.
- Every other pair (each against numpy_ref) compares the loss at each step of the trainers'
  runs; in float32 each step has its own tolerance, derived from the reference trainer's own
  error by that step (its float32 run against its float64 twin: reference_twins,
  step_tolerances). In float64 also the final weights.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from mhsa import registry
from mhsa.parity.lanes import Lanes
from mhsa.parity.rows import Row, pair_key, pairs, reference, stepwise_row
from mhsa.parity.runs import lane, reference_twins, trained
from mhsa.port_check.core.training_records import TrainReport
from mhsa.port_check.report.findings import line
from shared import training, weights
from shared.config import ModelConfig, TrainConfig
from shared.tolerances import adam_step_rounding, max_abs_diff, stepwise, tolerance

SECTION = "trajectory"
CHECKED = "train_check"  # the capability of a trainer check_training can compare (shared.protocol)
# the steps of the run check_training compares: each of them trains four models (each trainer in
# float32 and in float64) and compares every tensor, so it takes the first ones, where Adam's bias
# correction moves most (half of the default run's first epoch, keeping `mhsa parity` within 1.3x
# of its time without this row); the loss rows hold each trainer to numpy_ref's over the whole run
CHECKED_STEPS = 32


def trajectory_rows(config, dtype, seed, epochs, cache: dict | None = None) -> list[Row]:
    """The trainers compared step by step, from the same init and batches (the module's docstring)."""
    return trajectory_section(config, dtype, seed, epochs, cache=cache)()


def trajectory_section(config, dtype, seed, epochs, cache: dict | None = None, lanes: Lanes | None = None) -> Callable[[], list[Row]]:
    """trajectory_rows in two steps: every trainer, every training check and in float32 the
    reference's float64 twins are submitted to `lanes` now; the returned function waits for the
    runs and builds the rows."""
    train_config = TrainConfig(epochs=epochs, seed=seed, dtype=dtype)
    futures = {name: trained(name, config, train_config, cache=cache, lanes=lanes) for name in registry.names("train")}
    tolerances = step_tolerances(config, train_config, cache=cache, lanes=lanes)
    checks = {(a, b): checked_training(a, b, config, train_config, lanes=lanes) for a, b in checked_pairs()}

    def rows() -> list[Row]:
        runs = {name: future.result() for name, future in futures.items()}
        steps = len(next(iter(runs.values())).losses)
        compared = [(a, b) for a, b in pairs() if a in runs and b in runs and (a, b) not in checks]
        gaps = {pair_key(a, b): np.abs(np.subtract(runs[a].losses, runs[b].losses)) if (a, b) in compared else None for a, b in pairs()}
        tols, errors, note = tolerances()
        row = stepwise_row(SECTION, f"loss at each of {steps} steps", gaps, tols, errors, note=note)
        if not row.passed:
            row.name += f", first beyond tolerance at step {row.step}"
        # the training checks first: where two trainers part, they name the first step and tensor
        found = [training_row(*pair, future.result(), steps) for pair, future in checks.items()] + [row]
        if dtype == "float64":
            final = {name: registry.get(name).model.to_exchange(run.model) for name, run in runs.items()}
            worst = {
                pair_key(a, b): max(max_abs_diff(final[a][k], final[b][k]) for k in final[a]) if (a, b) in compared else None for a, b in pairs()
            }
            found.append(Row(SECTION, f"weights after {steps} steps", worst, tol=tolerance("stage", dtype)))
        return found

    return rows


def checked_pairs() -> list[tuple[str, str]]:
    """The pairs of trainers compared by check_training: both with the "train_check" capability,
    the first of the pair the reference (torch), the second the port (jax)."""
    able = registry.names(CHECKED)
    return [(a, b) for a, b in pairs() if a in able and b in able]


def checked_training(a: str, b: str, config: ModelConfig, train_config: TrainConfig, lanes: Lanes | None = None) -> Future:
    """A Future of compare_trainings(a, b, ...) over the run's first CHECKED_STEPS steps,
    submitted to a lane of its own."""
    steps = min(CHECKED_STEPS, train_config.epochs * train_config.steps_per_epoch)
    return (lanes or Lanes(inline=True)).submit(lane(f"{a}-{b} trainings"), compare_trainings, a, b, config, train_config, steps)


def compare_trainings(a: str, b: str, config: ModelConfig, train_config: TrainConfig, steps: int) -> TrainReport:
    """check_training of a's trainer (the reference) against b's (the port), each as its
    training_setup gives it, from the initial weights train(init="shared") starts from, over the
    first `steps` steps of train_config's run."""
    from mhsa.port_check.training.check import check_training  # imports torch and JAX: here, not at `mhsa parity --help`

    arrays = weights.init_weights(config, train_config.seed, train_config.dtype)
    reference_setup, port_setup = (training_setup(name, config, train_config, arrays) for name in (a, b))
    # without the lint's probes (optax run on known gradients, compiled once per scenario): both
    # optimizers are the project's own, and a setting that differs shows in the moments at step 0
    return check_training(reference_setup, port_setup, steps, dtype=train_config.dtype, probes=False)


def training_setup(name: str, config: ModelConfig, train_config: TrainConfig, arrays: dict[str, np.ndarray]) -> dict:
    """Backend `name`'s train() run as check_training takes it, from its public functions:
    {"model": model.from_exchange(arrays), "optimizer": the Adam of train.new_optimizer (an
    nnx.Optimizer as the optax transformation it steps with), "loss": model.cross_entropy on
    (logits, x, y), "inputs": every batch train() sees, in order, each (x, y) int (B, T),
    "model_inputs": 1 (the model takes x)}. The check trains copies; nothing here is stepped."""
    backend = registry.get(name)
    model = backend.model.from_exchange(arrays, config)
    optimizer = backend.train.new_optimizer(model, train_config)
    inputs = [batch for batches in training.epochs(config, train_config) for batch in batches]

    def loss(logits, x, y):  # the check calls the model on x itself, then this on its logits
        return backend.model.cross_entropy(logits, y)

    return {"model": model, "optimizer": getattr(optimizer, "tx", optimizer), "loss": loss, "inputs": inputs, "model_inputs": 1}


def training_row(a: str, b: str, report: TrainReport, steps: int) -> Row:
    """The row of one training check (a's trainer against b's), in their column only: the first
    value beyond its tolerance, the step and tensor where the trainings part, or else the value
    closest to its tolerance; its step counted from 0, as the loss rows count theirs. `steps`:
    the run's, of which the check may have compared the first CHECKED_STEPS only. A setting the
    optimizer lint finds different, a module setting that differs or a parameter left
    uncompared fails the row too (Row.problems)."""
    shown = report.first_failure or max((summary.worst for summary in report.summaries), key=lambda row: row.closeness)
    span = f"{report.steps} steps" if report.steps == steps else f"the first {report.steps} of {steps} steps"
    uncompared = [f"{report.uncompared} parameter(s) not compared"] if report.uncompared else []
    row = Row(
        SECTION,
        f"trainings at each of {span}",
        {pair_key(*pair): None for pair in pairs()} | {pair_key(a, b): shown.abs_diff},
        tol=shown.tol,
        note=f"{SECTION}: the {a} and {b} trainings, their loss, every gradient, Adam moment and parameter at each step, are compared "
        f"as `mhsa port-check --train` compares them; {report.tolerance_note}",
        step=shown.step - 1,
        at=shown.label,
        derived_elsewhere=report.dtype != "float64",
        problems=tuple([line(finding, report.sides) for finding in [*report.config_lint, *report.lint]] + uncompared),
    )
    if report.first_failure is not None:
        row.name += f", the trainings part at step {row.step}: {shown.label}"
    return row


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
