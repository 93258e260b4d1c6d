"""A parity report: every section in order, each built as its backends' work finishes, and the
report as markdown tables with the verdict."""

from __future__ import annotations

from mhsa import registry
from mhsa.parity import data_parallel
from mhsa.parity.decode import decode_section
from mhsa.parity.lanes import Lanes
from mhsa.parity.rows import FD, Report, Row, pair_key, pairs
from mhsa.parity.stages import stage_and_gradient_section
from mhsa.parity.trajectory import trajectory_section
from shared.config import ModelConfig


def build_report(
    config: ModelConfig,
    dtype="float32",
    seed=0,
    mask=None,
    epochs=3,
    samples=6,
    adapters=None,
    progress=None,
    decode=True,
    dp=0,
    runs: dict | None = None,
) -> Report:
    """Every section of the report in order. progress(index, total, section), if given, is
    called as each section starts (`mhsa parity` shows it on stderr in a terminal).

    Every section's work is submitted at the start, one lane per backend (mhsa.lanes):
    the sections are then put together in order, each as its jobs finish.
    dp >= 2 adds the data-parallel section (needs epochs > 0, and mhsa.data_parallel.prepare(dp)
    called before JAX starts). runs: trained runs (see trained()) to reuse and add to, shared by
    the sections that need the same one, and by the caller's other reports if it passes its own."""
    runs = {} if runs is None else runs
    title = (
        f"mhsa parity · {dtype} · seed {seed} · vocab_size={config.vocab_size} d_model={config.d_model} "
        f"n_heads={config.n_heads} max_len={config.max_len} bias={config.bias} · "
        f"{'padding mask (B, 1, 1, T) and causal' if mask is not None else 'causal mask only'}"
    )
    report = Report(title)
    with Lanes() as lanes:
        sections = [
            ("stages and gradients", stage_and_gradient_section(config, dtype, seed, mask=mask, samples=samples, adapters=adapters, lanes=lanes))
        ]
        if epochs > 0:
            sections.append((f"trajectories ({epochs} epochs per trainer)", trajectory_section(config, dtype, seed, epochs, cache=runs, lanes=lanes)))
        if decode:
            sections.append(("decode with the KV cache", decode_section(config, dtype, seed, lanes=lanes)))
        if dp >= 2 and epochs > 0:
            report.headers.update(data_parallel.columns(registry.names("dp"), dp))
            sections.append((f"data-parallel (dp={dp} against dp=1)", data_parallel.start(config, dtype, seed, epochs, dp, cache=runs, lanes=lanes)))
        for index, (section, rows) in enumerate(sections):
            if progress is not None:
                progress(index, len(sections), section)
            report.rows += rows()
    return report


def columns(report: Report) -> list[str]:
    """The pair columns, then the finite-difference column where some row has it."""
    keys = [pair_key(a, b) for a, b in pairs()]
    return keys + ([FD] if any(FD in row.diffs for row in report.rows) else [])


def header(key: str) -> str:
    return f"{registry.names()[0]} vs {FD}" if key == FD else key.replace("-", " vs ")


def format_report(report: Report) -> str:
    """The report as markdown: one table for the sections compared pair by pair, then one per
    section with columns of its own (data-parallel), the notes and the verdict."""
    first = report.first_failure
    main = columns(report)
    tables: list[tuple[list[str], list[Row]]] = []
    for row in report.rows:
        keys = main if set(row.diffs) <= set(main) else list(row.diffs)
        if tables and tables[-1][0] == keys:
            tables[-1][1].append(row)
        else:
            tables.append((keys, [row]))
    lines = [report.title]
    for keys, rows in tables:
        lines += [""] + _table(keys, rows, first, lambda key: report.headers.get(key) or header(key))
    lines.append("")
    notes = sorted({row.note for row in report.rows if row.note})
    lines += [f"note: {note}" for note in notes]
    if first is None:
        lines.append(f"PASS: all {len(report.rows)} comparisons within the tolerances of docs/DESIGN.md")
    else:
        pair = first.failing_pair()
        assert pair is not None  # a row that fails has a failing pair
        failures = sum(not row.passed for row in report.rows)
        lines.append(
            f"FAIL: first difference at {first.section} '{first.name}': {report.headers.get(pair) or header(pair)} "
            f"{first.diffs[pair]:.2e} > {first.tol:.0e} ({failures} of {len(report.rows)} comparisons fail)"
        )
    return "\n".join(lines)


def _table(keys: list[str], rows: list[Row], first: Row | None, header_of) -> list[str]:
    # one markdown table; a blank row between sections
    widths = [max(14, len(header_of(key))) for key in keys]
    width = max(len(_row_name(row)) for row in rows)
    head = f"| {'compared':<{width}} | " + " | ".join(f"{header_of(key):>{w}}" for key, w in zip(keys, widths)) + " | tolerance | result |"
    rule = "|" + "-" * (width + 2) + "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|----------:|--------|"
    lines = [head, rule]
    section = None
    for row in rows:
        if row.section != section and section is not None:
            lines.append(f"| {'':<{width}} | " + " | ".join(" " * w for w in widths) + " |           |        |")
        section = row.section
        cells = " | ".join(f"{_cell(row.diffs.get(key)):>{w}}" for key, w in zip(keys, widths))
        result = "PASS" if row.passed else "FAIL"
        marker = "  <- the implementations part here" if row is first else ""
        lines.append(f"| {_row_name(row):<{width}} | {cells} | {row.tol:>9.0e} | {result}   |{marker}")
    return lines


def _row_name(row: Row) -> str:
    return f"grad {row.name}" if row.section == "gradient" else row.name


def _cell(diff: float | None) -> str:
    return "—" if diff is None else f"{diff:.2e}"
