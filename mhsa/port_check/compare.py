"""check_port: the order of a port check. Read both models, pair their parameters (or stop with a
proposed name map), copy the weights or keep the port's, lint the settings, run both on one
batch, compare every output and gradient, then hint and probe."""

from __future__ import annotations

import os
import sysconfig
import traceback
from typing import Any

import numpy as np

from mhsa.freed_memory import kept_for_reuse
from mhsa.port_check import derived, names, precision, weights
from mhsa.port_check.hints import Side, hints, run_probes
from mhsa.port_check.padding import explain_same
from mhsa.port_check.records import NORMS, WHY, PortCheckError, PortReport, Transfer, backend_of, map_name
from mhsa.port_check.rows import call_paths, gradient_rows, output_rows
from mhsa.port_check.structure import RANKS, Inputs, as_inputs, describe_inputs, dtype_name, is_float_dtype, map_inputs, numpy_inputs
from shared.config import DTYPES
from shared.tolerances import tolerance


def transfer_weights(source: Any, target: Any, name_map: dict[str, str] | None = None, copy: bool | None = True) -> tuple[Any, Transfer]:
    """Pair the reference's parameters with the port's by name (through name_map) and shape, and
    copy them into the port (copy=True), or compare the port's own (copy=False: every parameter
    that differs is named with how), or decide by the port's values (copy=None: weights.py).
    Returns (target, Transfer)."""
    (source_name, source_reader), (target_name, target_reader) = backend_of(source), backend_of(target)
    source_params, target_params = source_reader.parameters(source), target_reader.parameters(target)
    types: tuple[dict, dict] = ({}, {})
    if not isinstance(target, tuple):  # torch and NNX know their layers without a call; Linen only while called
        types = (source_reader.describe(source, Inputs()), target_reader.describe(target, Inputs()))
    report = weights.pair_parameters(source_params, target_params, *types, name_map, (source_name, target_name))
    return _settle(report, target, target_reader, source_params, target_params, copy), report


def _settle(report: Transfer, target, target_reader, source_params, target_params, copy: bool | None):
    """Compare the values (unless a copy is forced), decide, copy if so; returns the port."""
    if _decide(report, source_params, target_params, copy):
        return target_reader.load_parameters(target, weights.arrays_to_copy(report, source_params))
    return target


def _decide(report: Transfer, source_params, target_params, copy: bool | None) -> bool:
    """Compare the values (unless a copy is forced) and decide whether to copy (weights.py)."""
    dtype = _dtype_of(source_params)
    evidence = 0 if copy else weights.compare_values(report, source_params, target_params, tolerance("weights", dtype), keep=copy is False)
    if weights.decide(report, evidence, weights.informative_count(report, source_params), copy):
        report.differing = []
        return True
    return False


def lint(source_desc: dict, target_desc: dict, sides: tuple[str, str], name_map=None) -> list[str]:
    """One line per paired module whose type or settings differ, before any number is computed."""
    findings = []
    for path, info in source_desc.items():
        other = target_desc.get(map_name(path, name_map))
        if other is None:
            continue
        kind = info["type"]
        where = path or "(the model)"
        if kind != other["type"] and "type" in info and _neutral(kind) and _neutral(other["type"]):
            findings.append(f"{where}: {kind} in {sides[0]}, {other['type']} in {sides[1]}")
            continue
        for key, value in info.items():
            if key in ("type", "dtypes") or key not in other or value is None or other[key] is None or value == other[key]:
                continue
            why = _why(kind, key, info, other)
            if key in ("bias", "active"):
                side = sides[0] if value else sides[1]
                findings.append(f"{where}: {kind} {key} in {side} only" + (f" ({why})" if why else ""))
            else:
                findings.append(f"{where}: {kind} {key} {value!r} in {sides[0]}, {other[key]!r} in {sides[1]}" + (f" ({why})" if why else ""))
    return findings


def _why(kind: str, key: str, info: dict, other: dict) -> str:
    """What the lint says about a setting beyond its two values: WHY's line, or for a 'SAME'
    padding that depends on the input's size, what it pads on which size (padding.py)."""
    same = next((side for side in (info, other) if side.get(key) == "SAME"), None)
    if kind == "Conv" and key == "padding" and same is not None and all(k in same for k in ("kernel_size", "stride", "dilation")):
        return explain_same(same["kernel_size"], same["stride"], same["dilation"])
    return WHY.get((kind, key), "")


def _untied(tied: dict[str, str], target_params, sides, name_map) -> list[str]:
    """One line per tied reference parameter whose port counterparts are two parameters."""
    findings = []
    for name, shared in tied.items():
        mapped, other = map_name(name, name_map), map_name(shared, name_map)
        if mapped != other and mapped in target_params and other in target_params:
            findings.append(
                f"{name}: tied to {shared} in {sides[0]}, a parameter of its own in {sides[1]} "
                "(untied: equal once copied, they part as soon as either is trained; --grads shows it)"
            )
    return findings


def _neutral(kind: str) -> bool:
    return kind in ("Linear", "Embedding", "Conv", "Dropout", "GELU") + NORMS


def one_line(error: BaseException) -> str:
    """'ValueError: first line of the message (at path/to/model.py:42)': an error of the user's
    code in one line, located at the innermost frame outside the libraries and this package."""
    message = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    if len(message) > 300:
        message = message[:297] + "..."
    libraries = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    ours = os.path.dirname(os.path.abspath(__file__))
    where = ""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = os.path.abspath(frame.filename)
        if not path.startswith(ours) and not any(path.startswith(library) for library in libraries) and "site-packages" not in path:
            shown = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
            where = f" (at {shown}:{frame.lineno})"
            break
    return f"{type(error).__name__}: {message}{where}"


def _running(what: str, function, *args, also: str = "") -> Any:
    """function(*args); an error of the user's model (any Exception) becomes one PortCheckError
    line saying what was being done, the error, where, and `also` (a likely cause)."""
    try:
        return function(*args)
    except PortCheckError:
        raise
    except Exception as error:
        raise PortCheckError(f"{what} failed: {one_line(error)}" + (f"; {also}" if also else "")) from error


def _cast_inputs(inputs: Inputs, dtype: str | None) -> Inputs:
    def cast(x):
        x = np.asarray(x)
        return x.astype(dtype) if dtype is not None and is_float_dtype(x.dtype) else x

    return map_inputs(inputs, cast)


def _low_precision_inputs(inputs: Inputs, asked: str) -> list[str]:
    """The input dtypes below float32 (bfloat16, float16): cast up, exactly; said in a note."""
    found: list[str] = []
    map_inputs(inputs, lambda x: found.append(dtype_name(x.dtype)) if is_float_dtype(x.dtype) and RANKS.get(dtype_name(x.dtype), 3) < 2 else None)
    return sorted(set(found))


def check_port(source, target, inputs, *, target_inputs=None, name_map=None, transfer=None, dtype="float32", grads=False, probes=True) -> PortReport:
    """Compare a reference model and its port on one batch.

    source: the reference (a torch.nn.Module); target: the port (an nnx.Module, or a Linen
    (module, variables) pair). inputs: what `source` is called with (structure.as_inputs: an
    array, a tuple of positional arguments, a dict of keyword arguments, or (args, kwargs)),
    also given to the port unless target_inputs is. name_map: {reference prefix: port prefix}
    for module paths and parameter names whose structures do not correspond. transfer: None
    checks the port as it is when it holds converted weights and copies the reference's into a
    fresh port (weights.py); True always copies; False never does. dtype: "float32" or
    "float64", both models and floating inputs cast (None: as they are). grads: also compare
    d sum(output) / d every parameter. probes: on a failing output, re-run with likely causes
    switched. Raises PortCheckError (one line) when the check cannot run: a model without
    parameters, or one that fails on the inputs.
    """
    (source_name, source_reader), (target_name, target_reader) = backend_of(source), backend_of(target)
    sides = (source_name, target_name)
    raw_inputs = as_inputs(inputs)
    inputs = numpy_inputs(raw_inputs)
    target_inputs = inputs if target_inputs is None else numpy_inputs(as_inputs(target_inputs))
    notes = []
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
        low = _low_precision_inputs(raw_inputs, dtype)
        if low:
            notes.append(f"inputs: {', '.join(low)} arrays cast to {dtype} (exactly: every such value is a {dtype} value)")
        source, changed = _running(f"casting the reference ({source_name}) to {dtype}", source_reader.cast, source, dtype)
        target, changed_target = _running(f"casting the port ({target_name}) to {dtype}", target_reader.cast, target, dtype)
        if changed or changed_target:
            notes.append(f"compute dtype set to {dtype} as asked: " + ", ".join(changed + changed_target))
        inputs, target_inputs = _cast_inputs(inputs, dtype), _cast_inputs(target_inputs, dtype)
    source_params, target_params = source_reader.parameters(source), target_reader.parameters(target)
    asked = dtype or _dtype_of(source_params)
    _require_parameters(f"the reference ({source_name})", source_params, source)
    _require_parameters(f"the port ({target_name})", target_params, target)
    source_desc = _running(f"running the reference ({source_name}) on the inputs ({describe_inputs(inputs)})", source_reader.describe, source, inputs)
    target_desc = _running(
        f"running the port ({target_name}) on the inputs ({describe_inputs(target_inputs)})", target_reader.describe, target, target_inputs
    )
    pairing = weights.pair_parameters(source_params, target_params, source_desc, target_desc, name_map, sides)
    tied = source_reader.tied(source)
    aliases = [name for name in pairing.unconsumed_source if name in tied and any(s == tied[name] for s, *_ in pairing.filled)]
    if aliases:  # a tied weight is one parameter: paired once, under its first name
        pairing.unconsumed_source = [name for name in pairing.unconsumed_source if name not in aliases]
        notes.append(f"tied in {source_name}: " + ", ".join(f"{name} is {tied[name]}" for name in aliases) + " (one parameter, paired once)")
    title = f"mhsa port-check · {_type_name(source)} ({source_name}) vs {_type_name(target)} ({target_name}) · {asked}"
    report = PortReport(title, sides, pairing, notes=notes)
    if pairing.unconsumed_source and pairing.unconsumed_target:
        orders = (_order(source_reader, source, inputs, source_params), _order(target_reader, target, target_inputs, target_params))
        proposal, lines = names.propose_map(pairing, source_params, target_params, *orders, name_map)
        if proposal or not (pairing.filled or pairing.transposed_only or pairing.mismatched):
            return _stopped(report, proposal, lines, name_map)
    copy = _decide(pairing, source_params, target_params, transfer)
    report.lint = lint(source_desc, target_desc, sides, name_map) + _untied(tied, target_params, sides, name_map)
    del target_params  # views of the port's weights: a fresh port's initial values go once overwritten (if no one else holds them)
    if copy:
        target = target_reader.load_parameters(target, weights.arrays_to_copy(pairing, source_params))
    flipped_of = {name: flipped for name, _, _, flipped in pairing.filled}
    mapped_of = {name: mapped for name, mapped, _, _ in pairing.filled}
    differing = {name: (mapped_of[name], source_params[name].T if flipped_of[name] else source_params[name]) for name, _, _ in pairing.differing}
    del source_params
    _compare(
        report,
        Side(source, source_reader, inputs, source_desc),
        Side(target, target_reader, target_inputs, target_desc, differing),
        asked,
        name_map,
        grads,
        probes,
    )
    return report


def _require_parameters(side: str, params: dict, model) -> None:
    if not params:
        raise PortCheckError(f"{side} ({_type_name(model)}) has no floating-point parameters: there is nothing to port")


def _compare(report: PortReport, source: Side, target: Side, asked: str, name_map, grads: bool, probes: bool) -> None:
    """Run both models (the reference in float64 too, for float32's tolerances), fill the rows,
    the precision findings, the hints and the probes."""
    sides, pairing = report.sides, report.transfer
    doing = "running and differentiating" if grads else "running"  # one forward (and backward) pass per side
    with kept_for_reuse():  # each run reuses the large blocks it frees, handed back after it (mhsa/freed_memory.py)
        source_outputs, source_grads = _running(
            f"{doing} the reference ({sides[0]}) on the inputs ({describe_inputs(source.inputs)})",
            source.reader.run,
            source.model,
            source.inputs,
            grads,
        )
    if asked == "float32":  # before the port runs: its outputs and the float64 copy are never held together
        source.derived = _derive(report, source, source_outputs, source_grads)
    with kept_for_reuse():
        target_outputs, target_grads = _running(
            f"{doing} the port ({sides[1]}) on the inputs ({describe_inputs(target.inputs)})",
            target.reader.run,
            target.model,
            target.inputs,
            grads,
            also=_shape_advice(pairing),
        )
    tolerances = source.derived or derived.Derived()
    report.rows, report.unmatched_source, report.unmatched_target, skipped = output_rows(
        source_outputs, target_outputs, source.desc, target.desc, asked, sides, name_map, tolerances.outputs
    )
    if skipped:
        shown = ", ".join(f"'{name}' ({kind})" for name, kind in skipped[:4]) + (f" and {len(skipped) - 4} more" if len(skipped) > 4 else "")
        report.notes.append(f"not compared, as they are not floating-point arrays: {shown}")
    for outputs, desc, side in ((source_outputs, source.desc, sides[0]), (target_outputs, target.desc, sides[1])):
        report.precision += precision.findings(outputs, asked, desc, side)
    floors = [
        *precision.floors(source_outputs, asked, source.desc).values(),
        *precision.floors(target_outputs, asked, target.desc).values(),
        RANKS[asked],
    ]
    if report.precision:
        report.precision[0] += f"; {precision.consequence(min(floors), asked)}"
    if grads:
        transposed = frozenset(name for name, _, _, flipped in pairing.filled if flipped)
        report.rows += gradient_rows(source_grads, target_grads, min(floors), sides, name_map, transposed, asked, tolerances.grads)
    del target_outputs, target_grads, source_grads  # compared: a large model's outputs are not held any longer
    paths = call_paths(source_outputs)
    del source_outputs
    report.hints = hints(report.rows, paths, source.desc, sides, asked, pairing.differing)
    first = report.first_failure
    if probes and first is not None and first.section == "output":
        report.probes, probed = run_probes(report.rows, paths, source, target, sides, asked, name_map)
        if probed is not None:  # the gap is explained: read the hints again off what remains
            report.hints = hints(probed, paths, source.desc, sides, asked, pairing.differing)
            if report.hints:
                report.hints.insert(0, "read with the switches of the probes that close a gap (below) in place:")


def _derive(report: PortReport, source: Side, outputs, grads) -> derived.Derived | None:
    """The float32 rows' tolerances from the reference's float64 run (derived.py); None, with a
    note, when the reference cannot run in float64: its rows then hold the fixed tolerances."""
    try:
        found = derived.from_float64_run(source.reader, source.model, source.inputs, outputs, grads)
    except Exception as error:  # a model that cannot compute in float64: said, and checked all the same
        report.notes.append(f"the reference cannot run in float64 ({one_line(error)}): its float32 rows hold the fixed tolerances of docs/DESIGN.md")
        return None
    if found.fixed:
        report.notes.append(f"the reference computes {_some(found.fixed)} in float32 even in float64: those rows hold the fixed tolerance")
    if found.apart:
        report.notes.append(
            f"the reference's float64 run differs from its float32 run by more than rounding at {_some(found.apart)} "
            f"(over {derived.NOT_A_TWIN:g} of the largest value: a random layer in train mode?): those rows hold the fixed tolerance"
        )
    return found


def _some(names: list[str], shown: int = 4) -> str:
    """ "'a', 'b' and 3 more": the first few of a list of row names, each once."""
    names = list(dict.fromkeys(names))
    return ", ".join(f"'{name}'" for name in names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _shape_advice(pairing: Transfer) -> str:
    """What to add to a failed run of the port: the shapes the pairing already found not to fit."""
    misfits = [f"'{s}' {ss} vs '{m}' {ts}" for s, m, ss, ts in pairing.mismatched] + [
        f"'{s}' {shape} fits '{m}' only transposed" for s, m, shape in pairing.transposed_only
    ]
    if not misfits:
        return ""
    shown = "; ".join(misfits[:3]) + (f" and {len(misfits) - 3} more" if len(misfits) > 3 else "")
    return f"the port's weights do not fit the reference's ({shown}): is it built with the reference's sizes?"


def _order(reader, model, inputs, params) -> list[str]:
    """Module paths in call order (first calls), or in parameter order when the model does not run."""
    try:
        outputs = reader.capture(model, inputs)
    except Exception:  # the names are the problem being reported; the order is a nicety
        outputs = []
    order = [output.path for output in outputs]
    order += [name.rpartition(".")[0] for name in params]
    return list(dict.fromkeys(order))


def _stopped(report: PortReport, proposal: dict, lines: list[str], name_map) -> PortReport:
    pairing, (a, b) = report.transfer, report.sides
    left = f"{len(pairing.unconsumed_source)} parameter(s) of {a} have no counterpart in {b}, and {len(pairing.unconsumed_target)} of {b} none in {a}"
    if proposal:
        report.stopped = (
            f"names do not correspond: {left}. Nothing was compared: the port's unpaired parameters would keep "
            "their own values, and the rows would be noise."
        )
    else:
        report.stopped = (
            f"names do not correspond and no structure pairs them: {left}, and no parameter shares a name. "
            "Nothing was compared. Write a name map (JSON {reference prefix: port prefix}) and give it with --map."
        )
    report.proposed_map = {**(name_map or {}), **proposal}
    report.map_lines = lines
    return report


def _dtype_of(params) -> str:
    dtype = str(next(iter(params.values())).dtype) if params else "float32"
    return dtype if dtype in DTYPES else "float32"


def _type_name(model) -> str:
    return type(model[0]).__name__ if isinstance(model, tuple) else type(model).__name__
