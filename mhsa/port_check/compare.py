"""Run both models, copy the weights, lint the settings, compare every output and gradient, probe."""

from __future__ import annotations

import os

import numpy as np

from mhsa.port_check.records import (
    NORMS,
    WHY,
    PortReport,
    Row,
    Transfer,
    backend_of,
    map_name,
)
from shared.config import DTYPES
from shared.tolerances import max_abs_diff, tolerance


def _as_tuple(inputs) -> tuple:
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def transfer_weights(source, target, name_map=None, copy=True):
    """Copy the reference's parameters into the port by name (through name_map), shape-checked.
    Returns (target, Transfer). copy=False leaves the port's weights as they are and lists the
    parameters whose values differ (and whether the port holds the transpose)."""
    _, source_port = backend_of(source)
    _, target_port = backend_of(target)
    source_params, target_params = source_port.parameters(source), target_port.parameters(target)
    report, arrays = Transfer(copied=copy), {}
    for name, value in source_params.items():
        mapped = map_name(name, name_map)
        if mapped not in target_params:
            report.unconsumed_source.append(name)
            continue
        expected = target_params[mapped].shape
        if value.shape == expected:
            report.filled.append((name, mapped, value.shape))
            arrays[mapped] = value
        elif value.ndim == 2 and value.T.shape == expected:
            report.transposed_only.append((name, mapped, value.shape))
        else:
            report.mismatched.append((name, mapped, value.shape, expected))
    consumed = {mapped for _, mapped, *_ in report.filled + report.transposed_only + report.mismatched}
    report.unconsumed_target = [name for name in target_params if name not in consumed]
    if copy:
        target = target_port.load_parameters(target, arrays)
    else:
        dtype = str(next(iter(source_params.values())).dtype) if source_params else "float32"
        tol = tolerance("stage", dtype if dtype in DTYPES else "float32")
        for name, mapped, _ in report.filled:
            diff = max_abs_diff(source_params[name], target_params[mapped])
            if diff > tol:
                value = source_params[name]
                transposed = value.ndim == 2 and value.shape[0] == value.shape[1] and max_abs_diff(value.T, target_params[mapped]) <= tol
                report.differing.append((name, diff, "the port holds its transpose: a kernel copied without transposing" if transposed else ""))
    return target, report


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
            if key == "type" or key not in other or value is None or other[key] is None or value == other[key]:
                continue
            why = WHY.get((kind, key), "")
            if key in ("bias", "active"):
                what = {"bias": "bias", "active": "active"}[key]
                side = sides[0] if value else sides[1]
                findings.append(f"{where}: {kind} {what} in {side} only" + (f" ({why})" if why else ""))
            else:
                findings.append(f"{where}: {kind} {key} {value!r} in {sides[0]}, {other[key]!r} in {sides[1]}" + (f" ({why})" if why else ""))
    return findings


def _neutral(kind: str) -> bool:
    return kind in ("Linear", "Embedding", "Conv", "Dropout", "GELU") + NORMS


def _keyed(calls) -> list[tuple[tuple[str, int], np.ndarray]]:
    """(path, output) in call order -> ((path, call number), output)."""
    seen: dict[str, int] = {}
    keyed = []
    for path, value in calls:
        seen[path] = seen.get(path, -1) + 1
        keyed.append(((path, seen[path]), value))
    return keyed


def _diffs(a, b) -> tuple[float, float, str]:
    """(max abs, max abs / max |reference|, note); a channels-first reference output is compared
    channels-last where only that makes the shapes agree (Conv: torch NCL, Flax NLC)."""
    a, b = np.asarray(a), np.asarray(b)
    note = ""
    if a.shape != b.shape:
        if a.ndim >= 3 and np.moveaxis(a, 1, -1).shape == b.shape:
            a, note = np.moveaxis(a, 1, -1), "compared channels-last"
        else:
            return float("inf"), float("inf"), f"shape {a.shape} vs {b.shape}"
    diff = max_abs_diff(a, b)
    scale = float(np.max(np.abs(a))) if a.size else 0.0
    return diff, diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf")), note


def output_rows(source_calls, target_calls, source_desc, dtype, name_map=None):
    """(rows in the reference's call order, unmatched reference calls, unmatched port calls)."""
    source, target = _keyed(source_calls), dict(_keyed(target_calls))
    counts = {}
    for (path, _), _ in source:
        counts[path] = counts.get(path, 0) + 1
    rows, unmatched, used = [], [], set()
    tol = tolerance("stage", dtype)
    for position, ((path, call), value) in enumerate(source):
        key = (map_name(path, name_map), call)
        label = _label(path, call, counts[path])
        if key not in target:
            unmatched.append(label)
            continue
        used.add(key)
        kind = source_desc.get(path.split("[")[0], {}).get("type", "")
        abs_diff, rel_diff, note = _diffs(value, target[key])
        rows.append(Row("output", label, _label(*key, counts[path]), kind, abs_diff, rel_diff, tol, note, position))
    unmatched_target = [_label(path, call, 1 + max(c for p, c in target if p == path)) for path, call in target if (path, call) not in used]
    return rows, unmatched, unmatched_target


def _label(path: str, call: int, calls: int) -> str:
    name = path if path and not path.startswith("[") else f"(model output){path}"
    return f"{name} (call {call + 1})" if calls > 1 else name


def gradient_rows(source_grads, target_grads, dtype, name_map=None) -> list[Row]:
    tol = tolerance("grad", dtype)
    rows = []
    for name, value in source_grads.items():
        mapped = map_name(name, name_map)
        if mapped in target_grads:
            abs_diff, rel_diff, note = _diffs(value, target_grads[mapped])
            rows.append(Row("gradient", name, mapped, "", abs_diff, rel_diff, tol, note))
    return rows


def _path(label: str) -> str:
    """A row label back to its module path."""
    path = label.split(" (call ")[0]
    return "" if path.startswith("(model output)") else path.split("[")[0]


def _hints(report: PortReport, source_calls, source_desc) -> list[str]:
    """Where to look: the code between the first failing output and the last agreeing one, the
    reference modules without a counterpart that ran in between, and the same for the largest
    growth of the difference after the first failure (a second cause behind the first)."""
    first = report.first_failure
    if first is None or first.section != "output":
        return []
    outputs = [row for row in report.rows if row.section == "output"]
    at = outputs.index(first)
    last_good = next((row for row in reversed(outputs[:at]) if row.passed), None)
    hints = []
    if last_good is not None:
        parent = ".".join(os.path.commonprefix([_path(last_good.name).split("."), _path(first.name).split(".")]))
        hints.append(
            f"the difference enters between '{last_good.name}' (last agreeing output) and '{first.name}'"
            + (f": look at the code of '{parent}' that runs between those calls" if parent else "")
        )
    hints += _unmatched_between(report, source_calls, source_desc, last_good, first)
    jumps = [
        (row.abs_diff / before.abs_diff, before, row)
        for before, row in zip(outputs[at:], outputs[at + 1 :])
        if before.abs_diff > 0 and np.isfinite(row.abs_diff)
    ]
    if jumps:
        ratio, before, row = max(jumps, key=lambda jump: jump[0])
        if ratio >= 10:
            hints.append(f"the difference grows {ratio:.0f}x from '{before.name}' to '{row.name}': a second cause may sit between them")
            hints += _unmatched_between(report, source_calls, source_desc, before, row)
    return hints


def _unmatched_between(report, source_calls, source_desc, before, row) -> list[str]:
    """Reference modules without a counterpart called after row `before` (None: the start) and before `row`."""
    matched = {row.position for row in report.rows if row.section == "output"}
    start = before.position + 1 if before is not None else 0
    hints = []
    for position in range(start, row.position):
        path = source_calls[position][0]
        if path in source_desc and position not in matched:
            info = source_desc[path]
            settings = ", ".join(f"{key}={value!r}" for key, value in info.items() if key != "type")
            why = next((text for (kind, _), text in WHY.items() if kind == info["type"]), "")
            hints.append(
                f"'{path}' ({info['type']}{': ' + settings if settings else ''}) ran in {report.sides[0]} "
                f"just before '{row.name}' and has no counterpart in {report.sides[1]}" + (f"; {why}" if why else "")
            )
    return hints


def check_port(source, target, inputs, *, target_inputs=None, name_map=None, transfer=True, dtype="float32", grads=False, probes=True) -> PortReport:
    """Compare a reference model and its port on one batch.

    source: the reference (a torch.nn.Module); target: the port (an nnx.Module, or a Linen
    (module, variables) pair). inputs: an array or a tuple of arrays for `source(*inputs)`, also
    given to the port unless target_inputs is. name_map: {reference prefix: port prefix} for
    module paths and parameter names whose structures do not correspond. transfer: copy the
    reference's weights into the port (else compare them). dtype: "float32" or "float64", both
    models and floating inputs cast (None: as they are). grads: also compare d sum(output) / d
    every parameter. probes: on a failing output, re-run with likely causes switched.
    """
    (source_name, source_port), (target_name, target_port) = backend_of(source), backend_of(target)
    inputs = _as_tuple(inputs)
    target_inputs = inputs if target_inputs is None else _as_tuple(target_inputs)
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
        source, target = source_port.cast(source, dtype), target_port.cast(target, dtype)
        inputs = tuple(_cast(x, dtype) for x in inputs)
        target_inputs = tuple(_cast(x, dtype) for x in target_inputs)
    dtype = dtype or _dtype_of(source_port.parameters(source))
    target, transfer_report = transfer_weights(source, target, name_map, copy=transfer)

    sides = (source_name, target_name)
    source_desc, target_desc = source_port.describe(source, inputs), target_port.describe(target, target_inputs)
    title = f"mhsa port-check · {type(source).__name__} ({source_name}) vs {_type_name(target)} ({target_name}) · {dtype}"
    report = PortReport(title, sides, transfer_report, lint=lint(source_desc, target_desc, sides, name_map))

    source_calls = source_port.capture(source, inputs)
    target_calls = target_port.capture(target, target_inputs)
    report.rows, report.unmatched_source, report.unmatched_target = output_rows(source_calls, target_calls, source_desc, dtype, name_map)
    if grads:
        report.rows += gradient_rows(source_port.gradients(source, inputs), target_port.gradients(target, target_inputs), dtype, name_map)
    report.hints = _hints(report, source_calls, source_desc)
    if probes and report.first_failure is not None and report.first_failure.section == "output":
        report.probes = run_probes(
            report, (source, source_port, inputs), (target, target_port, target_inputs), source_desc, target_desc, name_map, dtype
        )
    return report


def _cast(x, dtype):
    x = np.asarray(x)
    return x.astype(dtype) if np.issubdtype(x.dtype, np.floating) else x


def _dtype_of(params) -> str:
    dtype = str(next(iter(params.values())).dtype) if params else "float32"
    return dtype if dtype in DTYPES else "float32"


def _type_name(model) -> str:
    return type(model[0]).__name__ if isinstance(model, tuple) else type(model).__name__


def run_probes(report, source_side, target_side, source_desc, target_desc, name_map, dtype) -> list[str]:
    """Re-run with one likely cause switched at a time and say whether the gap closes at the first
    failing output: matmul precision 'highest' (TF32 off); the first failing Linear's kernel
    transposed in the port, where it is square (otherwise the transfer report already names it);
    the first failing norm's eps set to the reference's, where the two differ."""
    source, source_port, inputs = source_side
    target, target_port, target_inputs = target_side
    first = report.first_failure
    failing = [row for row in report.rows if row.section == "output" and not row.passed]

    def verdict(what, source_calls, target_calls):
        rows, _, _ = output_rows(source_calls, target_calls, source_desc, dtype, name_map)
        row = next((r for r in rows if r.name == first.name), None)
        if row is None or not row.passed:
            diff = "no output" if row is None else f"{row.abs_diff:.2e}"
            return f"probe: {what}: does not close the gap ('{first.name}' still {diff})"
        rest = next((r for r in rows if not r.passed), None)
        after = "every output then agrees" if rest is None else f"the first failure moves to '{rest.name}'"
        return f"probe: {what}: closes the gap at '{first.name}' ({first.abs_diff:.2e} -> {row.abs_diff:.2e}); {after}"

    probes = []
    with source_port.highest_precision(), target_port.highest_precision():
        probes.append(
            verdict("matmul precision 'highest' (TF32 off) in both", source_port.capture(source, inputs), target_port.capture(target, target_inputs))
        )
    source_calls = source_port.capture(source, inputs)
    linear = next((row for row in failing if row.kind == "Linear"), None)
    switched = None if linear is None else target_port.switched(target, "transpose", _path(linear.target))
    if linear is not None and switched is not None:  # a square kernel: a transposed one has the right shape and wrong values
        what = f"the kernel of '{_path(linear.target)}' transposed in {report.sides[1]}"
        probes.append(verdict(what, source_calls, target_port.capture(switched, target_inputs)))
    norm = next((row for row in failing if row.kind in NORMS), None)
    if norm is not None:
        eps = source_desc.get(_path(norm.name), {}).get("eps")
        other = target_desc.get(_path(norm.target), {}).get("eps")
        switched = None if eps is None or eps == other else target_port.switched(target, "eps", _path(norm.target), eps)
        if switched is not None:
            what = f"the eps of '{_path(norm.target)}' set to {report.sides[0]}'s {eps!r} (was {other!r})"
            probes.append(verdict(what, source_calls, target_port.capture(switched, target_inputs)))
    return probes
