"""The port check through training: train the reference (torch) and its port (Flax NNX or Equinox,
with optax) from the same weights on the same batches for N steps, each side once more in float64,
and compare every step: the loss, every gradient, every optimizer moment and every parameter after
the update, each held to a tolerance derived from the two sides' own float32 errors
(mhsa/comparison.py: held). The first row beyond its tolerance, in the order a step computes them,
is where the two trainings part; at that step the per-module forward rows, at the reference's
weights of that step on that step's batch, say whether the forward pass parted first.

    from mhsa.port_check.training.check import check_training
    from mhsa.port_check.report.training import format_train_report
    report = check_training(torch_side, flax_side, steps=20)
    print(format_train_report(report))

Each side is the mapping a `--train` factory returns: "model", "optimizer" (a torch.optim.Optimizer
over that model's parameters / an optax GradientTransformation), "loss" ((output, *batch) -> scalar,
in its own framework), "inputs" (a list of batches, tuples of arrays, cycled over the steps);
optionally "model_inputs" (the model takes the first that many arrays of a batch; default all) and
torch's "scheduler" (stepped after the optimizer) and "clip" (clip_grad_norm_'s max norm, applied
before optimizer.step).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from mhsa.comparison import held
from mhsa.port_check.core import progress
from mhsa.port_check.core.findings import OneSided, Summed
from mhsa.port_check.core.records import PortCheckError, PortReport
from mhsa.port_check.core.structure import as_inputs
from mhsa.port_check.core.training_records import MOMENTS, StepRecord, StepSummary, TrainReport, TrainRow
from mhsa.port_check.forward import weights
from mhsa.port_check.forward.check import check_port, lint, transfer_weights
from mhsa.port_check.forward.pairing import pull
from mhsa.port_check.readers import reader_of, trainer_of
from mhsa.port_check.readers.torch import training as train_torch
from mhsa.port_check.training import lint as train_lint
from shared.config import DTYPES
from shared.tolerances import K, max_abs_diff, reference_error, scale, tolerance

REQUIRED = ("model", "optimizer", "loss", "inputs")
OPTIONAL = ("model_inputs", "scheduler", "clip")
# what each factory gives: the reference is torch's, the port any JAX library's with a trainer (readers.TRAINERS)
OPTIMIZERS = {"reference": "a torch.optim.Optimizer", "port": "an optax GradientTransformation"}


def check_setup(setup, which: str) -> dict:
    """A factory's mapping, checked: `which` is "reference" (torch) or "port" (Flax NNX, Equinox). Returns it
    as a dict with "inputs" a list of tuples of arrays; raises ValueError naming what is wrong."""
    if not isinstance(setup, Mapping):
        raise ValueError(
            f"the {which} factory returned {type(setup).__name__}; with --train it must return a mapping with the keys {', '.join(REQUIRED)}"
        )
    missing = [key for key in REQUIRED if key not in setup]
    unknown = [str(key) for key in setup if key not in REQUIRED + OPTIONAL]
    if missing or unknown:
        what = f"lacks {', '.join(missing)}" if missing else f"has unknown key(s) {', '.join(unknown)}"
        raise ValueError(f"the {which} factory's mapping {what}; expected {', '.join(REQUIRED)} and optionally {', '.join(OPTIONAL)}")
    try:
        name, trainer = trainer_of(setup["model"])
    except TypeError as error:
        raise ValueError(str(error)) from None
    if (name == "torch") != (which == "reference"):
        raise ValueError(
            f"the {which} factory's model is a {name} model; the training check takes a torch reference and a Flax NNX port or an Equinox one"
        )
    if not trainer.owns(setup["optimizer"]):
        raise ValueError(f"the {which} factory's 'optimizer' must be {OPTIMIZERS[which]}; got {type(setup['optimizer']).__name__}")
    if not callable(setup["loss"]):
        raise ValueError(f"the {which} factory's 'loss' must be a callable (output, *batch) -> scalar")
    checked = dict(setup, inputs=_batches(setup["inputs"], which))
    model_inputs = setup.get("model_inputs")
    if model_inputs is not None and (
        isinstance(model_inputs, bool) or not isinstance(model_inputs, int) or not 1 <= model_inputs <= len(checked["inputs"][0])
    ):
        raise ValueError(f"the {which} factory's 'model_inputs' must be an integer from 1 to the arrays in a batch; got {model_inputs!r}")
    trainer.check_setup(checked)
    return checked


def _batches(inputs, which: str) -> list[tuple]:
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise ValueError(f"the {which} factory's 'inputs' must be a non-empty list of batches, each a tuple of arrays")
    batches = []
    for index, batch in enumerate(inputs):
        batch = batch if isinstance(batch, (tuple, list)) else (batch,)
        arrays = tuple(np.asarray(x) for x in batch)
        if not arrays or any(not (np.issubdtype(a.dtype, np.number) or a.dtype == bool) for a in arrays):
            raise ValueError(f"the {which} factory's batch {index} must be a tuple of numeric arrays")
        batches.append(arrays)
    if len({len(batch) for batch in batches}) != 1:
        raise ValueError(f"the {which} factory's batches must all hold the same number of arrays")
    return batches


def check_training(reference, port, steps: int, *, dtype: str = "float32", name_map=None, probes: bool = True) -> TrainReport:
    """Train both sides `steps` steps from the reference's weights and compare every step.
    reference, port: the factories' mappings (see the module docstring). dtype: "float32" (the
    tolerances derived from each side's float64 run) or "float64" (fixed ones). name_map: {reference
    prefix: port prefix}. probes: run the optimizer lint's probes (else only list the settings)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer; got {steps!r}")
    reference, port = check_setup(reference, "reference"), check_setup(port, "port")
    if len(reference["inputs"]) != len(port["inputs"]):
        raise ValueError(f"the factories give {len(reference['inputs'])} and {len(port['inputs'])} batches; the training check pairs them one to one")
    (ref_name, ref_reader), (port_name, port_reader) = reader_of(reference["model"]), reader_of(port["model"])
    ref32 = train_torch.Trainer(reference, dtype)
    ref64 = train_torch.Trainer(reference, "float64") if dtype != "float64" else None
    progress.stage("pairing the weights")
    try:  # every reference parameter paired, or no training is compared (forward/check.py: refuse_unpaired)
        port_model, transfer = transfer_weights(ref32.model, port_reader.cast(port["model"], dtype)[0], name_map, inputs=_model_inputs(reference, 0))
    except PortCheckError as error:
        raise ValueError(str(error)) from None
    name_map = {**(name_map or {}), **transfer.renamed}
    _, port_trainer = trainer_of(port["model"])
    port32 = port_trainer.Trainer(port, port_model, dtype)
    port64 = port_trainer.Trainer(port, port_model, "float64") if dtype != "float64" else None
    sides = (ref_name, port_name)
    first_ref, first_port = _model_inputs(reference, 0), _model_inputs(port, 0)
    report = TrainReport(
        title=f"mhsa port-check --train {steps} · {type(reference['model']).__name__} ({ref_name}, {type(reference['optimizer']).__name__}) "
        f"vs {type(port['model']).__name__} ({port_name}, optax) · {dtype}",
        sides=sides,
        dtype=dtype,
        steps=steps,
        transfer=transfer,
        tolerance_note=_tolerance_note(dtype),
        config_lint=[
            *lint(ref_reader.describe(ref32.model, as_inputs(first_ref)), port_reader.describe(port_model, as_inputs(first_port)), name_map),
            *transfer.lost,
            *(Summed(group.reference, group.port_names()) for group in transfer.groups if not group.exact),  # they train apart
        ],
    )
    progress.stage("the optimizers' settings")
    report.lint, report.lint_notes, report.settings = train_lint.optimizer_lint(reference, port, port_model, steps, name_map, probes)
    before, failed_before = train_torch.snapshot(ref32.model), None
    for step in range(1, steps + 1):
        progress.stage(f"training step {step} of {steps}")
        index = (step - 1) % len(reference["inputs"])
        ref, other = ref32.step(reference["inputs"][index]), port32.step(port["inputs"][index])
        own = (ref64.step(reference["inputs"][index]), port64.step(port["inputs"][index])) if ref64 and port64 else None
        rows = step_rows(step, (ref, other), own, transfer.groups)
        report.summaries.append(StepSummary.of(step, (ref.loss, other.loss), rows))
        if step == 1:  # the kinds of moment one side keeps and the other does not
            ours, theirs = {moment for moment, _ in ref.moments}, {moment for moment, _ in other.moments}
            report.only_one_side = [OneSided(moment, sides[0]) for moment in sorted(ours - theirs)] + [
                OneSided(moment, sides[1]) for moment in sorted(theirs - ours)
            ]
            report.rows += rows
        if failed_before is None and any(not row.passed for row in rows):
            failed_before = (before, step)
            report.rows += rows if step > 1 else []
        before = ref.params
    if failed_before is not None:
        weights, step = failed_before
        report.forward = forward_rows(ref32, port_model, weights, (reference, port), step, dtype, name_map)
    return report


def _model_inputs(setup: dict, index: int) -> tuple:
    return setup["inputs"][index][: setup.get("model_inputs")]


def _tolerance_note(dtype: str) -> str:
    if dtype == "float64":
        return "tolerance: fixed (a float64 check has no higher precision to derive one from): docs/DESIGN.md's float64 trajectory tolerance"
    return (
        f"tolerance: {K:g} x the larger of the two sides' own float32 errors at that step and tensor (each side's float32 run "
        f"against its float64 run, same weights and batches); at least {K:g} float32 roundings of the tensor's largest value"
    )


def step_rows(step: int, records: tuple[StepRecord, StepRecord], own: tuple[StepRecord, StepRecord] | None, groups) -> list[TrainRow]:
    """One step's rows, in the order a step computes them: loss, gradients, moments, parameters.
    records: (reference, port) in the check's dtype; own: the same in float64 (None if float64);
    groups: the pairing (core/transforms.py). The port's values are read in the reference's names
    through each group: gradients through every one (a sum's gradient is each term's), moments and
    parameters through those whose values pull back; a summed group's parameters are compared as
    the port holds them, the reference's pushed into its layout (their moments are not comparable)."""
    ref, port = records
    rows = [_row(step, "loss", "", "", (ref.loss, port.loss), (own[0].loss, own[1].loss) if own else None)]
    theirs = [_as_reference(port, groups)] + ([_as_reference(own[1], groups)] if own else [])
    for kind, field in (("grad", "grads"), ("moment", "moments"), ("param", "params")):
        ours, pulled = getattr(ref, field), getattr(theirs[0], field)
        for key in _ordered(kind, ours, ref.params):
            if key not in pulled:
                continue
            pair64 = (getattr(own[0], field)[key], getattr(theirs[1], field)[key]) if own else None
            name, moment = (key[1], key[0]) if kind == "moment" else (key, "")
            rows.append(_row(step, kind, name, moment, (ours[key], pulled[key]), pair64))
    for group in groups:  # summed: as the port holds them
        if group.exact:
            continue
        expected = group.push([ref.params[name] for name in group.reference])
        expected64 = group.push([own[0].params[name] for name in group.reference]) if own else []
        held, held64 = (weights.held(group, record.params) if record else [] for record in (port, own[1] if own else None))
        for n, name in enumerate(group.port_names().split(", ")):
            rows.append(_row(step, "param", name, "", (expected[n], held[n]), (expected64[n], held64[n]) if own else None))
    return rows


def _as_reference(record: StepRecord, groups) -> StepRecord:
    """The port's step in the reference's names and layouts (pairing.pull), each kind of moment on its own."""
    moments: dict[tuple[str, str], np.ndarray] = {}
    for kind in {kind for kind, _ in record.moments}:
        of_kind = {name: value for (which, name), value in record.moments.items() if which == kind}
        moments.update({(kind, name): value for name, value in pull(groups, of_kind, exact_only=True).items()})
    return StepRecord(record.loss, pull(groups, record.grads), pull(groups, record.params, exact_only=True), moments)


def _ordered(kind: str, found: dict, params: dict) -> list:
    """Keys in the reference's parameter order; moments of one parameter in MOMENTS' order."""
    if kind != "moment":
        return list(found)
    order = {name: i for i, name in enumerate(params)}
    return sorted(found, key=lambda key: (order.get(key[1], len(order)), list(MOMENTS).index(key[0])))


def _row(step, kind, name, moment, pair, pair64) -> TrainRow:
    """One compared value: pair = (reference, port) in the check's dtype, pair64 = the same in
    float64 (None for a float64 check, whose rows hold the fixed float64 trajectory tolerance)."""
    ours, theirs = (np.asarray(value) for value in pair)
    same_shape = ours.shape == theirs.shape
    row = TrainRow(step, kind, name, moment, max_abs_diff(ours, theirs) if same_shape else float("inf"))
    if pair64 is None:
        row.tol = tolerance("trajectory", "float64")
        return row
    reference = (reference_error(ours, pair64[0]), scale(pair64[0]))
    port = (reference_error(theirs, pair64[1]), scale(pair64[1])) if same_shape else None
    row.reference_error, row.port_error = reference[0], None if port is None else port[0]
    row.tol, row.by_port = held(reference, port, 0.0)
    return row


def forward_rows(ref32, port_template, weights, setups, step, dtype, name_map) -> PortReport:
    """The forward check (check_port) at the reference's weights before the failing step, both
    models holding them, on that step's batch: which module parts first."""
    reference, port = setups
    index = (step - 1) % len(reference["inputs"])
    report = check_port(
        ref32.model_at(weights),
        port_template,
        _model_inputs(reference, index),
        target_inputs=_model_inputs(port, index),
        name_map=name_map,
        transfer=True,
        dtype=dtype,
        probes=False,
    )
    report.title = f"step {step}: the forward pass at the reference's weights before the step, on the step's batch"
    return report
