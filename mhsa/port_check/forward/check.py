"""check_port: the order of a port check. Read both models, pair their parameters (or stop with a
proposed name map), copy the weights or keep the port's, lint the settings, run both on one
batch, compare every output and gradient, then hint and probe. copy_weights: the same pairing,
then the copy, for a user who has no converter yet."""

from __future__ import annotations

import functools
import json
import os
import sysconfig
import traceback
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mhsa.port_check.core import cotangents, memory, progress
from mhsa.port_check.core.findings import Hint, LintDifference, Note, Untied
from mhsa.port_check.core.records import NORMS, PortCheckError, PortReport, Transfer, map_name
from mhsa.port_check.core.structure import (
    RANKS,
    Inputs,
    Output,
    Traced,
    as_inputs,
    cast_floats,
    describe_inputs,
    dtype_name,
    numpy_inputs,
    split_arrays,
)
from mhsa.port_check.forward import derived, precision, weights
from mhsa.port_check.forward.boundaries import boundaries, upstream
from mhsa.port_check.forward.hints import Side, hints, run_probes
from mhsa.port_check.forward.pairing import Pulling, Sides, pair_parameters
from mhsa.port_check.forward.rows import call_paths, compare_arrays, gradient_rows, output_rows, rejudge
from mhsa.port_check.readers import reader_of
from mhsa.port_check.readers.protocol import ModuleInfo
from shared.config import DTYPES
from shared.malloc import hand_back, kept_for_reuse
from shared.tolerances import tolerance

# bytes of the port's gradients let go between two hand_backs (shared/malloc.py) while the
# reference's are taken: a 1B model's layer is 240 MB a side
HAND_BACK = 64 * 1024 * 1024
# the part of the memory left that a float64 run may be expected to take: the rest for what the
# estimate leaves out (the run's activations, the framework's own buffers)
FITS = 0.9
# the module types every reader names alike: two paired modules of two of them differ in type (a lint finding)
NEUTRAL = ("Linear", "Embedding", "Conv", "Dropout", "GELU") + NORMS


def transfer_weights(source: Any, target: Any, name_map: dict | None = None, copy: bool | None = True, inputs=None) -> tuple[Any, Transfer]:
    """Pair the reference's parameters with the port's (forward/pairing.py) and copy them into the
    port (copy=True), compare the port's own (False: each that differs named with how), or decide by
    the port's values (None). inputs: what both models are called with (a Linen model knows its
    layers only while called; the structure rule reads call order), as check_port takes them.
    Returns (target, Transfer); raises PortCheckError where a reference parameter stays unpaired."""
    (source_name, source_reader), (target_name, target_reader) = reader_of(source), reader_of(target)
    source_params, target_params = source_reader.parameters(source), target_reader.parameters(target)
    given = numpy_inputs(as_inputs(inputs)) if inputs is not None else None
    types: tuple[dict, dict] = ({}, {})
    if given is not None or not isinstance(target, tuple):  # torch and NNX know their layers without a call; Linen only while called
        types = (_types(source_reader.describe(source, given or Inputs())), _types(target_reader.describe(target, given or Inputs())))
    orders = (lambda: (_order(source_reader, source, given, source_params), _order(target_reader, target, given, target_params))) if given else None
    report = _pairing(source_params, target_params, types, orders, name_map, (source_name, target_name))
    _aliases(report, source_reader.tied(source))
    refuse_unpaired(report)
    if _decide(report, source_params, target_params, copy, source_reader.frozen(source)):
        target = target_reader.load_parameters(target, weights.arrays_to_copy(report, source_params, target_params))
    return target, report


def _aliases(pairing: Transfer, tied: dict[str, str]) -> list[str]:
    """The reference's second names of a tied weight (an lm_head that is the embedding) left unpaired
    while the first is paired: one parameter, paired once; taken off the parameters left, and returned."""
    paired = set(pairing.paired)
    aliases = [name for name in pairing.reference_left if name in tied and tied[name] in paired]
    pairing.reference_left = [name for name in pairing.reference_left if name not in aliases]
    return aliases


def _types(desc: dict[str, ModuleInfo]) -> dict[str, str]:
    return {path: info.kind for path, info in desc.items()}


def _pairing(source_params, target_params, types, orders, name_map, sides) -> Transfer:
    """pairing.pair_parameters, the map's own mistakes (a name it gives that no parameter has) one PortCheckError line."""
    try:
        found = Sides(source_params, target_params, types[0], types[1], order=orders or (lambda: ([], [])))
        return pair_parameters(found, name_map, sides)
    except ValueError as error:
        raise PortCheckError(str(error)) from None


def refuse_unpaired(report: Transfer) -> None:
    """A PortCheckError naming the reference's parameters that no group pairs (or that several could):
    no verdict is given on weights the check did not pair (the port's unpaired ones would keep their
    own values, and the rows would be noise)."""
    stop = stopped_reason(report)
    if stop:
        raise PortCheckError(stop)


def _some(names: list[str], shown: int = 4) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def stopped_reason(report: Transfer) -> str:
    """One sentence on the reference's parameters left unpaired or ambiguous, '' when every one is paired."""
    a, b = report.sides
    parts = []
    if report.reference_left:
        verb = "pairs" if len(report.reference_left) == 1 else "pair"
        parts.append(f"{_count(report.reference_left)} of the reference ({a}) {verb} with none of the port's ({b}): {_some(report.reference_left)}")
    misfits = [pair for pair in report.mismatched if not pair.layouts]
    if misfits:
        shown = [f"'{pair.reference}' {pair.shape} vs '{pair.port}' {pair.port_shape}" for pair in misfits]
        parts.append(f"{_count(shown)} of the reference fit no transform of the port's of that name: {_some(shown, 3)}")
    open_layouts = [pair for pair in report.mismatched if pair.layouts]
    if open_layouts:
        shown = [f"'{pair.reference}' {pair.shape} as '{pair.port}' {pair.port_shape}" for pair in open_layouts]
        parts.append(
            f"{_count(shown)} of the reference fit the port's of that name in several layouts, and the port's values hold none "
            f"of them (a map entry ending in .T takes the transposed one): {_some(shown, 3)}"
        )
    if report.transposed_only:
        shown = [f"'{pair.reference}' {pair.shape} fits '{pair.port}' only transposed" for pair in report.transposed_only]
        parts.append(f"{_count(shown)} of standard layers fit only transposed (is the port's layer built with its sizes swapped?): {_some(shown, 3)}")
    if report.ambiguous:
        shown = [f"{name} -> {' or '.join(options)}" for name, options in report.ambiguous]
        parts.append(f"{len(shown)} could pair several ways: {_some(shown, 3)}")
    return "; ".join(parts)


def _count(names: list[str]) -> str:
    return f"{len(names)} parameter{'' if len(names) == 1 else 's'}"


def _decide(report: Transfer, source_params, target_params, copy: bool | None, frozen: frozenset[str]) -> bool:
    """Whether to copy (weights.decide), the values compared unless a copy is forced; frozen: the reference's untrained parameters."""
    tables = weights.tables(source_params, frozen)
    tol = tolerance("weights", _dtype_of(source_params))
    evidence = 0 if copy else weights.compare_values(report, source_params, target_params, tol, keep=copy is False, no_evidence=tables)
    return weights.decide(report, evidence, weights.informative_count(report, source_params, tables), copy)


def lint(source_desc: dict[str, ModuleInfo], target_desc: dict[str, ModuleInfo], name_map=None) -> list[LintDifference]:
    """Each paired module whose type or settings differ, before any number is computed."""
    findings = []
    for path, info in source_desc.items():
        other = target_desc.get(map_name(path, name_map))
        if other is None:
            continue
        kind, theirs = info.kind, other.settings
        if kind != other.kind and kind in NEUTRAL and other.kind in NEUTRAL:
            findings.append(LintDifference(path, kind, "type", kind, other.kind))
            continue
        for key, value in info.settings.items():
            if key in theirs and value is not None and theirs[key] is not None and value != theirs[key]:
                findings.append(LintDifference(path, kind, key, value, theirs[key], _same(kind, key, info.settings, theirs)))
    return findings


def _same(kind: str, key: str, info: dict, other: dict) -> tuple | None:
    """A 'SAME' padding's (kernel_size, stride, dilation), whose padding depends on the input's size (core/padding.py)."""
    same = next((side for side in (info, other) if side.get(key) == "SAME"), None)
    if kind == "Conv" and key == "padding" and same is not None and all(k in same for k in ("kernel_size", "stride", "dilation")):
        return same["kernel_size"], same["stride"], same["dilation"]
    return None


def _untied(tied: dict[str, str], pairing: Transfer) -> list[Untied]:
    """Each tied reference parameter whose port counterparts are two parameters."""
    port_of = {name: group.port_names() for group in pairing.groups for name in group.reference}
    return [Untied(name, shared) for name, shared in tied.items() if name in port_of and shared in port_of and port_of[name] != port_of[shared]]


def one_line(error: BaseException) -> str:
    """'ValueError: first line of the message (at path/to/model.py:42)': an error of the user's
    code in one line, located at the innermost frame outside the libraries and this package."""
    message = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    if len(message) > 300:
        message = message[:297] + "..."
    libraries = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the port checker's package, its readers included
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


@dataclass
class Paired:
    """Both models ready to compare: each Side and the parameters its forward pass reads, the report
    begun (title, notes, the pairing), the reference's tied parameters and the check's dtype."""

    report: PortReport
    source: Side
    target: Side
    params: tuple[dict, dict]
    tied: dict[str, str]
    asked: str


def pair_models(source, target, inputs, *, target_inputs=None, name_map=None, dtype: str | None = "float32") -> Paired | PortReport:
    """check_port's first half, shared with copy_weights: cast both models to `dtype`, trace them on
    the inputs, read the parameters each forward pass reads and pair them (forward/weights.py).
    Paired, or a stopped PortReport (its proposed map said) where names leave no single pairing."""
    (source_name, source_reader), (target_name, target_reader) = reader_of(source), reader_of(target)
    sides = (source_name, target_name)
    raw_inputs = as_inputs(inputs)
    inputs = numpy_inputs(raw_inputs)
    target_inputs = inputs if target_inputs is None else numpy_inputs(as_inputs(target_inputs))
    notes: list[Note] = []
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
        low = sorted(name for name in {dtype_name(array.dtype) for array in split_arrays(raw_inputs)[0]} if RANKS.get(name, 3) < 2)
        if low:  # inputs below float32 (bfloat16, float16): cast up, exactly; said in a note
            notes.append(Note("inputs cast", tuple(low), dtype))
        source, changed = _running(f"casting the reference ({source_name}) to {dtype}", source_reader.cast, source, dtype)
        target, changed_target = _running(f"casting the port ({target_name}) to {dtype}", target_reader.cast, target, dtype)
        if changed or changed_target:
            notes.append(Note("dtype set", tuple(changed + changed_target), dtype))
        inputs, target_inputs = cast_floats(inputs, dtype), cast_floats(target_inputs, dtype)
    running_source = f"running the reference ({source_name}) on the inputs ({describe_inputs(inputs)})"
    running_target = f"running the port ({target_name}) on the inputs ({describe_inputs(target_inputs)})"
    with kept_for_reuse():  # a trace runs the model too (shared/malloc.py)
        progress.stage("tracing the reference")
        source_traced = _running(running_source, source_reader.trace, source, inputs)
        progress.stage("tracing the port")
        try:
            target_traced = target_reader.trace(target, target_inputs)
        except Exception as error:  # the user's model failing on the inputs: said in one line
            raise _port_fails(
                error, (running_source, running_target), Side(source, source_reader, inputs, {}), target, target_reader, name_map
            ) from error
    progress.stage("pairing the weights")
    source_params = _read(source_reader.parameters(source), source_traced, "reference", notes)
    target_params = _read(target_reader.parameters(target), target_traced, "port", notes)
    asked = dtype or _dtype_of(source_params)
    for side, params, model in ((f"the reference ({source_name})", source_params, source), (f"the port ({target_name})", target_params, target)):
        if not params:
            raise PortCheckError(f"{side} ({_type_name(model)}) has no floating-point parameters: there is nothing to port")
    source_desc = _running(running_source, source_reader.describe, source, inputs, source_traced)
    target_desc = _running(running_target, target_reader.describe, target, target_inputs, target_traced)

    def orders() -> tuple[list[str], list[str]]:
        return _order(source_reader, source, inputs, source_params, source_traced), _order(
            target_reader, target, target_inputs, target_params, target_traced
        )

    types = (_types(source_desc), _types(target_desc))
    pairing = _pairing(source_params, target_params, types, orders, name_map, sides)
    tied = source_reader.tied(source)
    aliases = _aliases(pairing, tied)
    if pairing.unpaired and source_traced.read is None and source_traced.complete is not None:
        # a parameter left over (not a tied weight's second name): is it one the forward pass reads? (eager torch knows once it has run)
        source_traced = _running(running_source, source_traced.complete)
        source_params = _read(source_reader.parameters(source), source_traced, "reference", notes)
        pairing = _pairing(source_params, target_params, types, orders, name_map, sides)
        aliases = _aliases(pairing, tied)
    if aliases:
        notes.append(Note("tied", tuple((name, tied[name]) for name in aliases)))
    title = f"mhsa port-check · {_type_name(source)} ({source_name}) vs {_type_name(target)} ({target_name}) · {asked}"
    report = PortReport(title, sides, pairing, notes=notes, name_map={**(name_map or {}), **pairing.renamed})
    if stopped_reason(pairing):  # no verdict from weights the check did not pair: the user decides, the lint saying what may be why
        report.lint = [*lint(source_desc, target_desc, report.name_map), *pairing.lost]
        return _stopped(report, name_map)
    source_side = Side(source, source_reader, inputs, source_desc, traced=source_traced)
    target_side = Side(target, target_reader, target_inputs, target_desc, traced=target_traced)
    return Paired(report, source_side, target_side, (source_params, target_params), tied, asked)


def check_port(source, target, inputs, *, target_inputs=None, name_map=None, transfer=None, dtype="float32", grads=False, probes=True) -> PortReport:
    """Compare a reference model and its port on one batch.

    source: the reference (a torch.nn.Module); target: the port (an nnx.Module, a Linen (module,
    variables) pair, or an eqx.Module: readers.READERS). inputs: what `source` is called with
    (structure.as_inputs: an array, a tuple of positional arguments, a dict of keyword arguments, or
    (args, kwargs)), also given to the port unless target_inputs is. name_map: {reference prefix:
    port prefix} for names that do not correspond. transfer: None checks the port as it is when it
    holds converted weights and copies the reference's into a fresh port (forward/weights.py); True
    always copies; False never does. dtype: "float32" or "float64", both models and floating inputs
    cast (None: as they are). grads: also compare d <r, output> / d every parameter, r a fixed
    random direction (core/cotangents.py). probes: on a failing output, re-run with likely causes
    switched. Raises PortCheckError (one line) when the check cannot run: a model without
    parameters, or one that fails on the inputs."""
    paired = pair_models(source, target, inputs, target_inputs=target_inputs, name_map=name_map, dtype=dtype)
    if isinstance(paired, PortReport):  # stopped: names that do not correspond
        return paired
    report, source, target, asked = paired.report, paired.source, paired.target, paired.asked
    (source_params, target_params), pairing = paired.params, report.transfer
    progress.stage("checking the port's weights")
    copy = _decide(pairing, source_params, target_params, transfer, source.reader.frozen(source.model))
    report.lint = [*lint(source.desc, target.desc, report.name_map), *_untied(paired.tied, pairing), *pairing.lost]
    arrays = weights.arrays_to_copy(pairing, source_params, target_params)  # the reference's weights in the port's layout (views where they can be)
    target.differing = _fixes(pairing, arrays, target_params)
    del paired, target_params  # views of the port's weights: a fresh port's initial values go once overwritten (if no one else holds them)
    if copy:
        progress.stage("copying the reference's weights into the port")
        target.model = target.reader.load_parameters(target.model, arrays)
    order = list(source_params)
    del source_params, arrays
    _compare(report, source, target, asked, report.name_map, grads, probes, order)
    return report


def _fixes(pairing: Transfer, arrays: dict, target_params: dict) -> dict[str, dict[str, np.ndarray]]:
    """{reference parameter that differs: {port name: the port's array with the reference's values
    in that parameter's place}}, for the probe that loads them (a stacked array keeps its other layers)."""
    found: dict[str, dict[str, np.ndarray]] = {}
    for difference in pairing.differing:
        group = difference.group
        if group is None:
            continue
        found[difference.name] = {}
        for name in group.port:
            if group.index is None:
                found[difference.name][name] = arrays[name]
            else:
                value = np.array(target_params[name], copy=True)
                value[group.index] = arrays[name][group.index]
                found[difference.name][name] = value
    return found


def copy_weights(reference, port, inputs, *, port_inputs=None, name_map: dict[str, str] | None = None) -> tuple[Any, Transfer]:
    """Your port holding the reference's weights, paired and laid out as the check pairs them
    (forward/weights.py), and what was done.

    reference: a torch.nn.Module; port: an nnx.Module (changed in place and returned) or a Linen
    (module, variables) pair (a new pair is returned). inputs: one batch, as check_port takes it
    (port_inputs for the port's own), on which both models are traced: to read which variables the
    port's forward pass reads (a converter's leftover is not paired) and, where names differ, to
    propose a map by call order. Returns (port, Transfer: .filled every pair, .layouts those
    inferred, .reference_left and .port_left what stayed unpaired, the port's keeping
    their values, .port_unread what the port never reads). Raises PortCheckError, in one line with
    the proposed name map, where the names leave more than one pairing or none."""
    paired = pair_models(reference, port, inputs, target_inputs=port_inputs, name_map=name_map, dtype=None)
    if isinstance(paired, PortReport):  # parameters left unpaired: the user decides
        known = f"; the map so far: name_map={json.dumps(paired.proposed_map)}" if paired.proposed_map else ""
        raise PortCheckError(f"{stopped_reason(paired.transfer)}, so nothing was copied: pass a name_map that pairs them{known}")
    transfer, target = paired.report.transfer, paired.target
    if target.traced.read is not None:
        transfer.port_unread = [name for name in target.reader.parameters(target.model) if name not in target.traced.read]
    transfer.copied, transfer.decision = True, "copied by copy_weights"
    return target.reader.load_parameters(target.model, weights.arrays_to_copy(transfer, *paired.params)), transfer


def _port_fails(error: Exception, running: tuple[str, str], source: Side, target, target_reader, name_map) -> PortCheckError:
    """One line for a port that fails on the inputs (`running`: each side's run, as the line names
    it): the reference's own failure when it fails too, else the port's, with the misfit shapes."""
    if isinstance(error, PortCheckError):
        return error
    _running(running[0], source.reader.run, source.model, source.inputs)
    types = (
        _types(source.reader.describe(source.model, source.inputs)),
        {} if isinstance(target, tuple) else _types(target_reader.describe(target, Inputs())),
    )
    try:
        pairing = _pairing(source.reader.parameters(source.model), target_reader.parameters(target), types, None, name_map, ("reference", "port"))
    except PortCheckError:  # the map's own mistake: the port's failure is the news here
        pairing = Transfer()
    advice = _shape_advice(pairing)  # the misfits alone: no layout line of the pairing is said
    return PortCheckError(f"{running[1]} failed: {one_line(error)}" + (f"; {advice}" if advice else ""))


def _read(params: dict, traced, side: str, notes: list[Note]) -> dict:
    """The parameters the forward pass reads (all of them when the reader cannot tell); the rest
    named in one note: a converter's leftovers are not parameters of the model."""
    if traced.read is None:
        return params
    unread = [name for name in params if name not in traced.read]
    if unread:
        notes.append(Note("unread", tuple(unread), side=side))
    return {name: value for name, value in params.items() if name in traced.read}


def _compare(report: PortReport, source: Side, target: Side, asked: str, name_map, grads: bool, probes: bool, order=()) -> None:
    """Run both models (in the other dtype too where forward/derived.py needs it); fill the rows,
    findings, hints, probes. order: the reference's parameter names, the gradient rows' order.

    With gradients, one whole set of them is held at a time beside the two models: the port's,
    pulled back into the reference's names as its run hands them over; then the reference's, each
    compared with the port's as backward gives it and kept in its place (its forward ran first,
    its backward kept for then: the port's gradients take their direction from its outputs); then
    the twin's, each reduced against the reference's as it comes."""
    sides, pairing = report.sides, report.transfer
    doing = "running and differentiating" if grads else "running"
    progress.stage(f"{doing} the reference", _calls(source.traced))
    direction_of_reference = cotangents.reference if grads else None
    # with gradients its backward kept for after the port's run (the function `differentiate`)
    source_outputs, differentiate = _run(f"{doing} the reference ({sides[0]})", source, direction_of_reference, later=grads)
    last = max((output.call for output in source_outputs if output.path == ""), default=None)  # the model's own output: its last call
    direction = cotangents.PortDirection([output for output in source_outputs if output.call == last]) if grads else None
    if asked == "float32" and not grads:  # before the port runs: its outputs and the float64 twin are never held together
        source.derived = _derive(report, source, source_outputs, None, None)
    progress.stage(f"{doing} the port", _calls(target.traced))
    pulled: dict[str, np.ndarray] = {}  # the port's gradients in the reference's names and layouts, through each group (core/transforms.py)
    taker = Pulling(pairing.groups, pulled.__setitem__) if grads else None
    target_outputs, _ = _run(f"{doing} the port ({sides[1]})", target, direction, None, target.traced, taker, also=_shape_advice(pairing))
    del taker
    if direction is not None and direction.left_out:
        report.notes.append(Note("left out", tuple(direction.left_out)))
    source_grads: dict[str, np.ndarray] = {}
    compared: dict[str, tuple] = {}
    if grads:
        progress.stage("differentiating the reference", _calls(source_outputs))
        compared, source_grads = _gradients_against(source, differentiate, pulled, sides, order)
        if asked == "float32":
            source.derived = _derive(report, source, source_outputs, source_grads, direction_of_reference)
    if asked == "float64" and _falls_to_float32(source_outputs, target_outputs, source.desc, target.desc):  # the reference's float32 error there
        progress.stage("the reference in float32, for its own error", _calls(source_outputs))
        source.derived = _measured(report, source, "float32", source_outputs, source_grads or None, direction_of_reference, Note("no float32"))
    progress.stage("comparing the outputs")
    tolerances = source.derived or derived.Derived()
    report.rows, report.unmatched_source, report.unmatched_target, skipped = output_rows(
        source_outputs, target_outputs, source.desc, target.desc, asked, sides, name_map, tolerances.outputs
    )
    absent = tuple((name, why) for name, why in skipped if why.startswith("None in "))  # a note for these, one for the non-floats
    other = tuple((name, kind) for name, kind in skipped if not kind.startswith("None in "))
    report.notes += [Note(kind, pairs) for kind, pairs in (("not floats", other), ("none", absent)) if pairs]
    for outputs, desc, side in ((source_outputs, source.desc, sides[0]), (target_outputs, target.desc, sides[1])):
        report.precision += precision.findings(outputs, asked, desc, side)
    floors = _floors(source_outputs, target_outputs, asked, source.desc, target.desc)
    if report.precision:
        report.precision[0] = replace(report.precision[0], judged_at=precision.dtype_of(min(floors)) or "")
    rounding = precision.rounding(source_outputs, asked, sides[0]) + precision.rounding(target_outputs, asked, sides[1])
    if rounding:
        lowest = min(precision.leaf_floor(output) for output in source_outputs + target_outputs)
        rounding[0] = replace(rounding[0], judged_at=precision.dtype_of(lowest) or "")
        report.precision += rounding
        floors.append(lowest)
    if grads:
        progress.stage("comparing the gradients")
        frozen = source.reader.frozen(source.model)
        if frozen & set(source_grads):  # a parameter the reference does not train has no gradient to compare
            report.notes.append(Note("frozen", tuple(sorted(frozen & set(source_grads)))))
            compared = {name: found for name, found in compared.items() if name not in frozen}
            source_grads = {name: grad for name, grad in source_grads.items() if name not in frozen}
        zero = tolerances.zero if source.derived is not None else derived.zero_gradients(source_grads)
        del source_grads
        port_of = {name: group.port_names() for group in pairing.groups for name in group.reference}
        report.rows += gradient_rows(compared, min(floors), port_of, tolerances.grads, zero)
    if any(row.failed and row.status == "" and (asked == "float32" or row.reference_error is not None) for row in report.rows):
        _port_errors(report, target, target_outputs, direction, asked)
    boundaries(report.rows, source_outputs, target_outputs)
    del target_outputs  # compared: a large model's outputs are not held any longer
    paths, feeds = call_paths(source_outputs), upstream(source_outputs)
    del source_outputs
    report.hints = hints(report.rows, paths, source.desc, asked, pairing.differing, feeds)
    first = report.first_failure
    if probes and first is not None and first.section == "output":
        progress.stage("probes: re-running with likely causes switched")
        report.probes, probed = run_probes(report.rows, paths, source, target, sides, asked, name_map)
        if probed is not None:  # the gap is explained: read the hints again off what remains
            report.hints = hints(probed, paths, source.desc, asked, pairing.differing, feeds)
            if report.hints:
                report.hints.insert(0, Hint("probed"))


def _gradients_against(side: Side, differentiate, port: dict[str, np.ndarray], sides: tuple[str, str], order) -> tuple[dict, dict]:
    """The reference's gradients from `differentiate` (its run's backward, kept), each compared
    (rows.compare_arrays) with the port's of that name as backward hands it over, the port's then
    let go: ({name: the comparison} in `order`, then in the order they came, {name: gradient})."""
    compared: dict[str, tuple] = {}
    kept: dict[str, np.ndarray] = {}
    freed = [0]  # bytes of the port's let go since memory was last handed back

    def compare(name: str, grad: np.ndarray) -> None:
        other = port.pop(name, None)
        if other is not None:
            compared[name] = compare_arrays(grad, other, sides)
            freed[0] += other.nbytes
            del other
        kept[name] = grad
        if freed[0] >= HAND_BACK:  # the port's framework allocated them on its own threads: this one cannot reuse that memory
            hand_back()
            freed[0] = 0

    with kept_for_reuse():
        _running(f"differentiating the reference ({sides[0]}) on the inputs ({describe_inputs(side.inputs)})", differentiate, compare)
    ranked = {name: index for index, name in enumerate(order)}
    return {name: compared[name] for name in sorted(compared, key=lambda name: ranked.get(name, len(ranked)))}, kept


def _run(doing: str, side: Side, *args, also: str = "", **keywords) -> tuple[list[Output], Any]:
    """side.reader.run(model, inputs, *args, **keywords) under kept_for_reuse; its failure one PortCheckError line (`doing`, `also`)."""
    run = functools.partial(side.reader.run, **keywords)
    with kept_for_reuse():
        return _running(f"{doing} on the inputs ({describe_inputs(side.inputs)})", run, side.model, side.inputs, *args, also=also)


def _calls(known: Traced | list[Output] | None) -> int | None:
    """How many module calls a run makes, from its outputs or a trace that knows them (None: unknown before it runs)."""
    outputs = known.outputs if isinstance(known, Traced) else known
    return None if outputs is None else len({output.call for output in outputs})


def _derive(report: PortReport, source: Side, outputs, grads, direction) -> derived.Derived | None:
    """The float32 rows' tolerances from the reference's float64 run (forward/derived.py); None, with a
    note, when the reference cannot run in float64: its rows then hold the fixed tolerances."""
    progress.stage("the reference in float64, for the tolerances", _calls(outputs))
    found = _measured(report, source, "float64", outputs, grads, direction, Note("no float64"))
    if found is None:
        return None
    if found.fixed:
        report.notes.append(Note("fixed", tuple(found.fixed)))
    if found.apart:
        active = tuple(path for path, info in source.desc.items() if info.kind == "Dropout" and info.settings.get("active"))
        report.notes.append(Note("apart", tuple(found.apart), why="dropout" if active else _why_apart(source, outputs), also=active))
    return found


def _why_apart(side: Side, outputs: list[Output]) -> str:
    """Why a deterministic-looking model's float64 run is no rounding twin of its float32 one, as
    far as can be told: "random" (two float32 runs differ: a random layer) or "deterministic"."""
    try:
        again, _ = side.reader.run(side.model, side.inputs)
    except Exception:  # the first run succeeded; a second that fails says nothing about randomness
        return "deterministic"
    first, second = ({(output.call, output.label): output.value for output in run if output.value is not None} for run in (outputs, again))
    moved = any(not np.array_equal(first[key], value, equal_nan=True) for key, value in second.items() if key in first)
    return "random" if moved else "deterministic"


def _floors(source_outputs, target_outputs, asked: str, source_desc, target_desc) -> list[int]:
    """The precision ranks either model's calls reach (forward/precision.py), RANKS[asked] among them."""
    source, target = precision.floors(source_outputs, asked, source_desc), precision.floors(target_outputs, asked, target_desc)
    return [*source.values(), *target.values(), RANKS[asked]]


def _falls_to_float32(source_outputs, target_outputs, source_desc, target_desc) -> bool:
    """Whether a float64 check judges some row at float32: an output, a module dtype or a step of either model below float64."""
    lowest = min(_floors(source_outputs, target_outputs, "float64", source_desc, target_desc))
    return lowest == 2 or any(precision.leaf_floor(output) == 2 for output in source_outputs + target_outputs)


def _measured(report: PortReport, side: Side, dtype: str, outputs, grads, direction, note: Note, pulling=None) -> derived.Derived | None:
    """A side's own float32 errors from its run in `dtype`, the other one (derived.from_twin_run);
    None, with `note` and the error, where it cannot run so (its rows keep their tolerances), or
    where a float64 run would need more memory than the machine has left (killed, it would end the
    check with no report)."""
    if dtype == "float64" and _refused(report, side, grads is not None, note):
        return None
    try:
        return derived.from_twin_run(dtype, side.reader, side.model, side.inputs, outputs, grads, direction, pulling)
    except Exception as error:  # a model that cannot compute in the other dtype: said, and checked all the same
        report.notes.append(replace(note, error=one_line(error)))
        return None


def _refused(report: PortReport, side: Side, grads: bool, note: Note) -> bool:
    """Whether a side's float64 run would need more memory than the machine has left (killed, it
    would end the check with no report); if so, `note` says how much, and it is not started."""
    need, free = side.reader.float64_twin_bytes(side.model, grads), memory.available()
    if free is None or need <= FITS * free:
        return False
    report.notes.append(replace(note, error=f"its float64 run needs about {memory.size(need)} of memory, {memory.size(free)} are free"))
    return True


def _port_errors(report: PortReport, target: Side, outputs, direction, asked: str) -> None:
    """The port's own float32 errors, from its run in the other dtype, joined to the rows'
    tolerances (rows.rejudge); a note says so, or why they cannot be had. With gradients, the
    port's own are taken again first (let go once compared with the reference's), for its twin's to
    be reduced against as they come."""
    other = "float64" if asked == "float32" else "float32"
    groups = report.transfer.groups
    held: dict[str, np.ndarray] | None = None
    note = Note("port alone", dtype=other)
    if other == "float64" and _refused(report, target, direction is not None, note):  # before its gradients are taken again for nothing
        return
    if direction is not None:
        progress.stage("differentiating the port again, for its own error", _calls(outputs))
        held = {}
        unkept = lambda output: output._replace(value=None)  # noqa: E731  (its outputs are the first run's)
        _run(f"differentiating the port ({report.sides[1]})", target, direction, unkept, target.traced, Pulling(groups, held.__setitem__))
    progress.stage(f"the port in {other}, for its own error", _calls(outputs))
    found = _measured(report, target, other, outputs, held, direction, note, lambda each: Pulling(groups, each))
    del held
    if found is not None:
        target.derived = found
        report.port_twin = other
        report.port_sets = rejudge(report.rows, {**found.outputs, **found.grads})


def _shape_advice(pairing: Transfer) -> str:
    """What to add to a failed run of the port: the shapes the pairing already found not to fit."""
    misfits = [f"'{pair.reference}' {pair.shape} vs '{pair.port}' {pair.port_shape}" for pair in pairing.mismatched] + [
        f"'{pair.reference}' {pair.shape} fits '{pair.port}' only transposed" for pair in pairing.transposed_only
    ]
    if not misfits:
        return ""
    shown = "; ".join(misfits[:3]) + (f" and {len(misfits) - 3} more" if len(misfits) > 3 else "")
    return f"the port's weights do not fit the reference's ({shown}): is it built with the reference's sizes?"


def _order(reader, model, inputs, params, traced: Traced | None = None) -> list[str]:
    """Module paths in call order (first calls): from the trace where it has them, else from a run;
    then the modules never called, in parameter order (and all of them so when the model does not run)."""
    if traced is not None and traced.order is None and traced.outputs is None and traced.complete is not None:
        try:
            traced = traced.complete()
        except Exception:  # the order is a nicety; a model that fails says so where it runs
            traced = None
    if traced is not None and (traced.outputs is not None or traced.order is not None):
        paths = traced.order if traced.order is not None else [output.path for output in traced.outputs or []]
    else:
        try:
            paths = [output.path for output in reader.run(model, inputs)[0]] if inputs is not None else []
        except Exception:  # the names are the problem being reported; the order is a nicety
            paths = []
    return list(dict.fromkeys(paths + [name.rpartition(".")[0] for name in params]))


def _stopped(report: PortReport, name_map) -> PortReport:
    """The report of a check that pairs some reference parameter with nothing (or several ways): no
    verdict; the map found so far (the user's and the modules found under other names), to extend."""
    pairing = report.transfer
    report.stopped = stopped_reason(pairing)
    report.proposed_map = {**(name_map or {}), **pairing.renamed}
    report.map_lines = [f"{name} -> {' or '.join(options)}" for name, options in pairing.ambiguous]
    return report


def _dtype_of(params) -> str:
    dtype = str(next(iter(params.values())).dtype) if params else "float32"
    return dtype if dtype in DTYPES else "float32"


def _type_name(model) -> str:
    return type(model[0]).__name__ if isinstance(model, tuple) else type(model).__name__
