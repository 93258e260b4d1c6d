"""A training port report as text, in the forward check's style: the lints, the weights, one table
row per step (kept short: the steps around the first failure), the first failing step in detail
(its forward rows at the reference's weights, its gradients, the rows that part) and the verdict."""

from __future__ import annotations

from mhsa.comparison import RESULT, table
from mhsa.port_check.core.training_records import TrainReport, TrainRow
from mhsa.port_check.report.findings import differences, line
from mhsa.port_check.report.forward import group_line

AROUND = 2  # steps shown before and after the first failing one
DETAIL = 12  # rows of the failing step shown beyond its gradients


def format_train_report(report: TrainReport) -> str:
    a, b = report.sides
    lines = [report.title, ""]
    lines += differences("configuration lint", [line(finding, report.sides) for finding in report.config_lint])
    lines += differences("optimizer lint", [line(finding) for finding in report.lint])
    lines += [f"  note: {line(note)}" for note in report.lint_notes]
    lines += ["optimizer settings:"] + [f"  {line(setting)}" for setting in report.settings]
    t = report.transfer
    lines.append(f"weights: {len(t.paired)} parameters copied {a} -> {b} before step 1")
    if t.renamed:
        lines.append(f"  modules under other names in {b}: " + ", ".join(f"{reference} -> {port}" for reference, port in t.renamed.items()))
    lines += [f"  transform: {group_line(group)}" for group in t.groups if group.moved]
    lines += [f"  not copied ({why}): {name}" for why, names in _not_copied(report).items() for name in names]
    lines += [f"  {line(moment)}" for moment in report.only_one_side]
    lines.append(report.tolerance_note)
    lines.append("")
    if report.rows:
        lines += _step_table(report)
        if any(row.by_port and row.step in _steps_shown(report) for row in report.rows):
            lines.append("* the port's own float32 error (its float32 run against its float64 run), larger than the reference's, sets the tolerance")
        lines.append("")
    first = report.first_failure
    if first is not None:
        lines += _detail(report, first)
        lines.append("")
    lines.append(_verdict(report))
    return "\n".join(lines)


def _not_copied(report: TrainReport) -> dict[str, list[str]]:
    """The port's parameters that pair with none of the reference's: they train from their own values."""
    return {f"{report.sides[1]}'s, paired with none of {report.sides[0]}'s": list(report.transfer.port_left)}


def _steps_shown(report: TrainReport) -> list[int]:
    first = report.first_failure
    if first is None:
        return sorted({1, 2, report.steps} & set(range(1, report.steps + 1)))
    return list(range(max(1, first.step - AROUND), min(report.steps, first.step + AROUND) + 1))


def _step_table(report: TrainReport) -> list[str]:
    """One row per step shown: both losses and the step's first failing row (else its closest to
    its tolerance); one line for each run of steps not shown."""
    a, b = report.sides
    chosen = {step: report.summaries[step - 1].first_failure or report.summaries[step - 1].worst for step in _steps_shown(report)}
    skipped = {start: _skipped(report, start, end) for start, end in _gaps(list(chosen), report.steps)}
    width = max(len("compared"), *(len(row.label) for row in chosen.values()), *(len(text) for text in skipped.values()))
    columns = [("step", 4, ">"), ("loss " + a, 13, ">"), ("loss " + b, 13, ">"), ("compared", width, "<")]
    columns += [("max abs", 9, ">"), ("own error", 9, ">"), ("tolerance", 9, ">"), RESULT]
    body: list[tuple[list[str], str]] = []
    for step in range(1, report.steps + 1):
        if step in skipped:
            body.append((["...", "", "", skipped[step], "", "", "", ""], ""))
        elif step in chosen:
            row, (ours, theirs) = chosen[step], report.summaries[step - 1].losses
            marker = "  <- the trainings part here" if row is report.first_failure else ""
            body.append(([str(step), f"{ours:.8g}", f"{theirs:.8g}", row.label, *_cells(row), "PASS" if row.passed else "FAIL"], marker))
    return table(columns, body)


def _gaps(shown: list[int], steps: int) -> list[tuple[int, int]]:
    """The runs of steps not shown, as (first, last)."""
    return [(before + 1, after - 1) for before, after in zip([0, *shown], [*shown, steps + 1]) if after > before + 1]


def _cells(row: TrainRow) -> tuple[str, str, str]:
    """(max abs, the own error that sets the tolerance (Comparison.error_cell), tolerance)."""
    return f"{row.abs_diff:>9.2e}", f"{row.error_cell():>9}", f"{row.tol:>9.2e}"


def _skipped(report: TrainReport, start: int, end: int) -> str:
    failing = sum(summary.failing > 0 for summary in report.summaries[start - 1 : end])
    what = f"steps {start}-{end}" if end > start else f"step {start}"
    return f"{what}: {failing} failing" if failing else f"{what}: all pass"


def _detail(report: TrainReport, first: TrainRow) -> list[str]:
    """The failing step: its forward rows at the reference's weights, gradients, failing update rows, and which part first."""
    lines = [f"step {first.step} in detail:"]
    forward = report.forward
    failing_output = None
    if forward is not None and forward.rows:
        lines.append(f"  {forward.title}:")
        failing_output = forward.first_failure
        width, kinds = max(len(row.name) for row in forward.rows), max(len(row.kind) for row in forward.rows)
        for row in forward.rows:
            marker = "  <- first failing output" if row is failing_output else ""
            result = "PASS" if row.passed else "FAIL"
            note = f"  ({row.note})" if row.note else ""
            lines.append(f"    {row.name:<{width}}  {row.kind:<{kinds}}  {row.abs_diff:>9.2e}  tolerance {row.tol:>8.2e}  {result}{note}{marker}")
        if forward.unmatched_source:
            lines.append(f"    no counterpart in {report.sides[1]}: " + ", ".join(forward.unmatched_source))
    rows = [row for row in report.rows if row.step == first.step]
    lines.append("  the step's rows (the loss and gradients at each side's own weights, then the update):")
    grads = [row for row in rows if row.kind == "grad"]
    if len(grads) > 2 * DETAIL:  # a large model: the failing gradients only
        grads = [row for row in grads if not row.passed][:DETAIL]
    update = [row for row in rows if row.kind in ("moment", "param") and not row.passed]
    shown = [row for row in rows if row.kind == "loss"] + grads + update[:DETAIL]
    width = max(len(row.label) for row in shown)
    lines += [f"    {row.label:<{width}}  {' | '.join(_cells(row))}  {'PASS' if row.passed else 'FAIL'}" for row in shown]
    hidden = {"gradients": sum(row.kind == "grad" for row in rows) - len(grads), "failing moments and parameters": len(update) - len(update[:DETAIL])}
    lines += [f"    ... and {count} more {what}" for what, count in hidden.items() if count > 0]
    lines.append("  " + _which_part(first, failing_output, rows))
    return lines


def _which_part(first: TrainRow, failing_output, rows: list[TrainRow]) -> str:
    if failing_output is not None:
        return (
            f"the forward pass parts first: at '{failing_output.name}' ({failing_output.kind or 'module'}) with both models "
            f"holding the reference's weights of step {first.step}; look at that module's code and settings"
        )
    grad = next((row for row in rows if row.kind in ("loss", "grad") and not row.passed), None)
    if grad is not None:
        return f"the forward pass agrees at every module; the {'loss' if grad.kind == 'loss' else 'backward pass'} parts first, at '{grad.label}'"
    if first.kind == "param" and not any(row.kind == "grad" and row.name == first.name for row in rows):
        why = (
            ": torch's BatchNorm keeps the unbiased batch variance (times N / (N - 1)) in running_var, Flax's the biased one it normalizes with"
            if first.name.endswith("running_var")
            else ""
        )
        return (
            f"the forward pass and every gradient agree; a statistic the forward pass keeps in train mode parts first, "
            f"at '{first.label}', not a parameter the optimizer updates{why}"
        )
    return f"the forward pass and every gradient agree; the update parts first, at '{first.label}': the optimizer (see the optimizer lint)"


def _verdict(report: TrainReport) -> str:
    first = report.first_failure
    kinds = {kind: sum(row.kind == kind and row.step == 1 for row in report.rows) for kind in ("grad", "moment", "param")}
    compared = f"the loss, {kinds['grad']} gradients, {kinds['moment']} moments and {kinds['param']} parameters"
    if first is not None:
        failures, compared = (sum(getattr(summary, key) for summary in report.summaries) for key in ("failing", "compared"))
        return (
            f"FAIL: the trainings part at step {first.step}, at {first.label}: {first.abs_diff:.2e} > {first.tol:.2e} "
            f"({failures} of {compared} comparisons over {report.steps} steps fail)"
        )
    if report.uncompared:
        return (
            f"FAIL: all {report.steps} steps agree on what was compared, but {report.uncompared} parameter(s) were not copied "
            "and so not compared (weights above): name them with --map {reference prefix: port prefix}"
        )
    settings = len(report.lint) + len(report.config_lint)
    if settings:
        return f"FAIL: all {report.steps} steps agree ({compared} at every step), but {settings} setting(s) differ (lint above)"
    return f"PASS: all {report.steps} steps agree: {compared} at every step, each within its tolerance"
