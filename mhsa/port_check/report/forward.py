"""A port report as text: lint, weights, precision and notes, one table row per output and
gradient (the first failing row marked), hints and probes below, one verdict line."""

from __future__ import annotations

import json

from mhsa.comparison import RESULT, table
from mhsa.port_check.core.records import PortReport, Row, Transfer
from mhsa.port_check.report.findings import differences, line
from shared.tolerances import K

SHOWN = 12  # parameters listed per kind of misfit; the rest are counted


def format_report(report: PortReport) -> str:
    """The report as text (see the module's docstring); a stopped check shows the proposed name map instead of a table."""
    lines = [report.title, ""]
    a, b = sides = report.sides
    if report.stopped:
        lint = differences("configuration lint", [line(finding, sides) for finding in report.lint]) if report.lint else []
        return "\n".join(lines + lint + _weights(report.transfer, listed=False) + _stopped(report))
    lines += differences("configuration lint", [line(finding, sides) for finding in report.lint])
    lines += _weights(report.transfer)
    lines += [f"precision: {line(finding, sides)}" for finding in report.precision]
    lines += [f"note: {line(note, sides)}" for note in report.notes]
    lines.append("")
    if report.rows:
        lines += _table(report)
        lines.append("")
    both = [name for name in report.unmatched_source if name in report.unmatched_target]  # a module both call, its calls unpaired
    if both:
        lines.append(f"called in {a} and in {b}, but their calls pair by number and these do not (a call more on one side?): " + ", ".join(both))
    only = [name for name in report.unmatched_source if name not in both]
    if only:
        lines.append(f"no counterpart in {b} (compared only through the next matched output): " + ", ".join(only))
    only = [name for name in report.unmatched_target if name not in both]
    if only:
        lines.append(f"no counterpart in {a}: " + ", ".join(only))
    lines += [f"hint: {line(hint, sides)}" for hint in report.hints]
    lines += [line(probe, sides) for probe in report.probes]
    lines.append("note: max rel = max |difference| / max |reference output|; a row passes on max abs <= tolerance")
    lines += _tolerance_notes(report)
    lines.append(_verdict(report))
    return "\n".join(lines)


def _listed(items: list[str]) -> list[str]:
    return items[:SHOWN] + ([f"  ... and {len(items) - SHOWN} more"] if len(items) > SHOWN else [])


def _weights(t: Transfer, listed: bool = True) -> list[str]:
    a, b = t.sides
    paired = len(t.paired)
    lines = []
    if listed and t.copied:
        lines += [f"weights: {_count(paired, 'parameter')} copied {a} -> {b}", f"  {t.decision}"]
    elif listed:
        lines += [f"weights: {_count(paired, 'parameter')} paired, {len(t.differing)} differ ({b}'s own weights checked)", f"  {t.decision}"]
        lines += _listed(
            [f"  differs: {name}: {how}" + ("" if how.startswith("differs by") else f" (max abs {diff:.2e})") for name, diff, how, _ in t.differing]
        )
    else:
        unpaired = len(dict.fromkeys(t.unpaired))
        lines.append(f"weights: {paired} of {paired + unpaired} parameters of {a} paired with {b}'s, {unpaired} not")
    lines += [f"  layout: {line}" for line in t.layouts]
    lines += _listed([f"  transform: {line}" for line in group_lines(t.groups)])
    if t.renamed:
        renamed = [f"{reference} -> {port}" for reference, port in t.renamed.items()]
        lines.append(
            f"  modules under other names in {b}: "
            + ", ".join(renamed[:SHOWN])
            + (f" and {len(renamed) - SHOWN} more" if len(renamed) > SHOWN else "")
        )
    lines += _listed([f"  fits only transposed (not paired): {pair.reference} {pair.shape} -> {pair.port}" for pair in t.transposed_only])
    lines += _listed(
        [
            f"  {pair.layouts} layouts fit, the shapes do not say which (not paired): {pair.reference} {pair.shape} -> {pair.port} {pair.port_shape}"
            if pair.layouts
            else f"  shape mismatch (not paired): {pair.reference} {pair.shape} -> {pair.port} {pair.port_shape}"
            for pair in t.mismatched
        ]
    )
    lines += _listed([f"  paired with none of {b}'s: {name}" for name in t.reference_left])
    lines += _listed([f"  could pair several ways: {name} -> {' or '.join(options)}" for name, options in t.ambiguous])
    lines += _listed(
        [f"  {b}'s, paired with none of {a}'s: {name}" + (" (keeps its own values)" if listed and t.copied else "") for name in t.port_left]
    )
    return lines


def _count(n: int, what: str) -> str:
    """'1 parameter', '12 parameters'."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def group_lines(groups) -> list[str]:
    """One line per group that moves anything, the layers of a stack in one line ('h.{i}.fc.weight
    (8, 8) -> h.fc.kernel[{i}] for each of the 3 layers: transposed, stacked on its first axis')."""
    lines: dict[str, list] = {}
    for group in groups:
        if not group.moved:
            continue
        if group.index is None:
            lines[group_line(group)] = []
            continue
        layer = str(group.index)
        pattern = tuple(".".join("{i}" if part == layer else part for part in name.split(".")) for name in group.reference)
        key = f"{', '.join(pattern)} {group.shapes[0]} -> {', '.join(name + '[{i}]' for name in group.port)}"
        lines.setdefault(key, []).append(group)
    found = []
    for key, members in lines.items():
        if not members:
            found.append(key)
            continue
        how = members[0].words().replace(f", stacked at index {members[0].index} of the port's first axis", "")
        layers = "the layer" if len(members) == 1 else f"each of the {len(members)} layers"
        found.append(f"{key} for {layers}: {how + ', ' if how != 'as it is' else ''}stacked on its first axis")
    return found


def group_line(group) -> str:
    """'attn.in_proj_weight (72, 24) -> attn.query.kernel, attn.key.kernel, attn.value.kernel: split in 3 ...'."""
    references = ", ".join(group.reference)
    shape = f" {group.shapes[0]}" if len(group.reference) == 1 else ""
    return f"{references}{shape} -> {group.port_names()}: {group.words()}"


def format_transfer(transfer: Transfer) -> str:
    """What copy_weights did, as the check's report shows a transfer: how many were copied, each
    layout inferred, what did not fit, what stayed unpaired and what the port never reads."""
    lines = _weights(transfer)
    lines += _listed([f"  {group_line(group)}" for group in transfer.groups])
    lines += _listed([f"  never read by {transfer.sides[1]}'s forward pass: {name}" for name in transfer.port_unread])
    return "\n".join(lines)


def _stopped(report: PortReport) -> list[str]:
    lines = [
        "",
        f"NOT CHECKED: {report.stopped}. Nothing was compared: the port's unpaired parameters would keep their own values, "
        "and the rows would be noise.",
    ]
    if report.map_lines:
        lines.append("each of these fits several of the port's; choose one and say it in a name map:")
        lines += [f"  {line}" for line in report.map_lines]
    if report.proposed_map:
        lines.append(f"the name map so far (yours and the modules found under other names), to extend: {json.dumps(report.proposed_map)}")
        lines.append(
            "--write-map FILE writes it; --map FILE reads it (docs/port-check.md, 'Name maps', says how a map splits, concatenates, sums and stacks)"
        )
    else:
        lines.append(
            "write a name map (docs/port-check.md, 'Name maps': prefixes, patterns, splits, sums, stacked layers) and give it with --map FILE"
        )
    return lines


def _result(row: Row) -> str:
    """PASS, FAIL, 'zero' (a gradient that is 0 in exact arithmetic, the port's rounding too),
    'split' (a difference the outputs reading it do not carry), 'skip' (below float32), 'dtype'."""
    if row.boundary:
        return "split"
    if row.status in ("unjudged", "dtype"):
        return {"unjudged": "skip", "dtype": "dtype"}[row.status]
    return ("zero" if row.zero else "PASS") if row.passed else "FAIL"


def _cells(row: Row) -> tuple[str, str, str]:
    """(max abs, max rel, result) as the table shows them."""
    result = _result(row)
    if row.status in ("shape", "nan", "dtype"):
        return {"shape": "shape", "nan": "NaN", "dtype": "dtype"}[row.status], "", result
    return f"{row.abs_diff:.2e}", f"{row.rel_diff:.2e}", result


def _table(report: PortReport) -> list[str]:
    """Per row: the gap (max abs), max rel, the reference's own float32 error where the
    tolerance is derived from it ("fixed" where it is not), the tolerance and the result."""
    first = report.first_failure
    names = [row.name if row.section == "output" else f"grad {row.name}" for row in report.rows]
    width = max(len("compared"), *(len(name) for name in names))
    kind_width = max(len("type"), *(len(row.kind) for row in report.rows))
    numbers = [(header, 9, ">") for header in ("max abs", "max rel", "ref error", "tolerance")]
    body: list[tuple[list[str], str]] = []
    for name, row, before in zip(names, report.rows, [None, *report.rows]):
        if before is not None and row.section != before.section:
            body.append(([""] * 7, ""))
        abs_cell, rel_cell, result = _cells(row)
        tol = tolerance_text(row) if row.status != "dtype" else ""
        suffix = ("  <- the models part here" if row is first else "") + (f"  ({row.note})" if row.note else "")
        body.append(([name, row.kind, abs_cell, rel_cell, row.error_cell(), tol, result], suffix))
    return table([("compared", width, "<"), ("type", kind_width, "<"), *numbers, RESULT], body)


def tolerance_text(row: Row) -> str:
    """'1e-05' for a fixed tolerance, '4.3e-07' for a derived one."""
    return f"{row.tol:.1e}" if row.reference_error is not None or row.by_port else f"{row.tol:.0e}"


def _tolerance_notes(report: PortReport) -> list[str]:
    """What the ref error and tolerance columns mean, for the kinds of row the table holds."""
    notes = []
    if any(row.reference_error is not None for row in report.rows):
        notes.append(
            f"note: ref error = the reference's own float32 error at that row ({report.sides[0]} in float32 against itself in "
            f"float64, the same weights cast up and inputs); tolerance = {K:g} x ref error, at least {K:g} float32 roundings "
            "of the largest value compared (shared/tolerances.py)"
        )
    if report.port_twin:
        marked = (
            f"the {report.port_sets} marked * take {report.sides[1]}'s (its float32 run against its float64 run)"
            if report.port_sets
            else "the reference's own error stays the larger at every row (none is marked *)"
        )
        notes.append(
            f"note: a row failed without the port's own error, so {report.sides[1]} ran in {report.port_twin} too: each float32 row is held "
            f"to {K:g} x the larger of the two sides' own errors (a fixed one widened to the port's), and {marked}"
        )
    zero = [row for row in report.rows if row.zero]
    if zero:
        notes.append(
            f"note: 'zero': {len(zero)} gradient(s) are 0 in exact arithmetic (the reference's float64 gradient there is rounding), "
            "so both sides' values are rounding; such a row fails only where the port's value is beyond its tolerance"
        )
    for row in report.rows:
        if row.boundary:
            notes.append(f"note: 'split' at '{row.name}': {row.boundary}")
    if any(row.reference_error is None and row.status in ("", "shape", "nan") for row in report.rows):
        notes.append(
            "note: a 'fixed' row holds docs/DESIGN.md's fixed tolerance: float64 has no higher-precision twin, "
            "or the reference has no float64 twin of that row (see the notes above)"
        )
    return notes


def _verdict(report: PortReport) -> str:
    first = report.first_failure
    outputs = sum(row.section == "output" for row in report.rows)
    failures = sum(row.failed for row in report.rows)
    if first is not None:
        if first.status == "":
            error, whose = (first.port_error, "the port's") if first.by_port else (first.reference_error, "the reference's")
            what = f"{first.abs_diff:.2e} > {tolerance_text(first)}" + (
                f" ({first.abs_diff / error:.1f}x {whose} own error {error:.1e})" if error else ""
            )
        else:
            what = first.note
        return (
            f"FAIL: the models part at {first.section} '{first.name}' ({first.kind or 'parameter'}): "
            f"{what} ({failures} of {len(report.rows)} comparisons fail; {_coverage(report)})"
        )
    if report.unjudged:
        judged = len(report.rows) - len(report.unjudged)
        return (
            f"NO VERDICT: {len(report.unjudged)} of {len(report.rows)} comparisons not judged, computed below float32 "
            f"(see precision above); the {judged} judged agree"
        )
    if not report.rows:
        return f"FAIL: no output of the reference has a counterpart in the port: nothing was compared ({_coverage(report)})"
    lowered = " (some at a lower precision's tolerance: see precision above)" if report.precision else ""
    derived = sum(row.reference_error is not None for row in report.rows)
    which = "the tolerances of docs/DESIGN.md"
    if derived:
        own = "the two sides' own errors" if report.port_twin else "the reference's own error"
        which = f"tolerances derived from {own}" + ("" if derived == len(report.rows) else " (or fixed: see the notes)")
    split = sum(bool(row.boundary) for row in report.rows)
    more = f", {split} split at another module boundary (notes above)" if split else ""
    warned = f"; warning: {len(report.lint)} setting(s) differ (lint above) that no output shows on this batch" if report.lint else ""
    return f"PASS: {_coverage(report)}, all {len(report.rows) - split} comparisons ({outputs - split} outputs) within {which}{lowered}{more}{warned}"


def _coverage(report: PortReport) -> str:
    """'41 of 41 parameters paired': how much of the reference the comparisons cover."""
    paired = len(report.transfer.paired)
    return f"{paired} of {paired + len(dict.fromkeys(report.transfer.unpaired))} parameters paired"
