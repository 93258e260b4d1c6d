"""A port report as text: lint, weights, one table row per output and gradient, the verdict."""

from __future__ import annotations

from mhsa.port_check.records import PortReport


def format_report(report: PortReport) -> str:
    """The report as text: lint, weights, one table row per output (then gradient), verdict."""
    a, b = report.sides
    lines = [report.title, ""]
    lines.append("configuration lint: " + ("no differences" if not report.lint else f"{len(report.lint)} difference(s)"))
    lines += [f"  {finding}" for finding in report.lint]
    t = report.transfer
    if t.copied:
        lines.append(f"weights: {len(t.filled)} parameters copied {a} -> {b}")
    else:
        lines.append(f"weights: {len(t.filled)} parameters compared ({b}'s own weights kept), {len(t.differing)} differ")
        lines += [f"  differs: {name} by {diff:.2e}" + (f": {why}" if why else "") for name, diff, why in t.differing]
    lines += [f"  fits only transposed (not copied): {s} {shape} -> {m}" for s, m, shape in t.transposed_only]
    lines += [f"  shape mismatch (not copied): {s} {ss} -> {m} {ts}" for s, m, ss, ts in t.mismatched]
    lines += [f"  unconsumed in {a}: {name}" for name in t.unconsumed_source]
    lines += [f"  unconsumed in {b}: {name}" for name in t.unconsumed_target]
    lines.append("")
    if report.rows:
        first = report.first_failure
        names = [row.name if row.section == "output" else f"grad {row.name}" for row in report.rows]
        width = max(len("compared"), *(len(name) for name in names))
        kind_width = max(len("type"), *(len(row.kind) for row in report.rows))
        lines.append(f"| {'compared':<{width}} | {'type':<{kind_width}} |   max abs |   max rel | tolerance | result |")
        lines.append(f"|{'-' * (width + 2)}|{'-' * (kind_width + 2)}|----------:|----------:|----------:|--------|")
        section = report.rows[0].section
        for name, row in zip(names, report.rows):
            if row.section != section:
                lines.append(f"| {'':<{width}} | {'':<{kind_width}} |           |           |           |        |")
                section = row.section
            marker = "  <- the models part here" if row is first else ""
            note = f"  ({row.note})" if row.note else ""
            lines.append(
                f"| {name:<{width}} | {row.kind:<{kind_width}} | {row.abs_diff:>9.2e} | {row.rel_diff:>9.2e} | "
                f"{row.tol:>9.0e} | {'PASS' if row.passed else 'FAIL'}   |{marker}{note}"
            )
        lines.append("")
    if report.unmatched_source:
        lines.append(f"no counterpart in {b} (compared only through the next matched output): " + ", ".join(report.unmatched_source))
    if report.unmatched_target:
        lines.append(f"no counterpart in {a}: " + ", ".join(report.unmatched_target))
    lines += [f"hint: {hint}" for hint in report.hints]
    lines += report.probes
    lines.append("note: max rel = max |difference| / max |reference output|; a row passes on max abs <= tolerance")
    first = report.first_failure
    outputs = sum(row.section == "output" for row in report.rows)
    if first is None and not report.lint:
        lines.append(f"PASS: all {len(report.rows)} comparisons ({outputs} outputs) within the tolerances of docs/DESIGN.md")
    elif first is None:
        lines.append(f"FAIL: every output agrees on this batch, but {len(report.lint)} setting(s) differ (lint above)")
    else:
        failures = sum(not row.passed for row in report.rows)
        lines.append(
            f"FAIL: the models part at {first.section} '{first.name}' ({first.kind or 'parameter'}): "
            f"{first.abs_diff:.2e} > {first.tol:.0e} ({failures} of {len(report.rows)} comparisons fail)"
        )
    return "\n".join(lines)
