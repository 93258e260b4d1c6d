"""A parity report: every section in order, each built as its backends' work finishes, and the
report as markdown tables with the verdict."""

from __future__ import annotations

from mhsa import registry
from mhsa.parity import data_parallel
from mhsa.parity.decode import decode_section
from mhsa.parity.lanes import Lanes
from mhsa.parity.rows import FD, Report, Row, pair_key, pairs, reference
from mhsa.parity.stages import stage_and_gradient_section
from mhsa.parity.table import WIDTH, reference_header, short_header, table, verdict, wrap
from mhsa.parity.trajectory import trajectory_section
from shared.config import ModelConfig
from shared.tolerances import K


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
    """Every gap column in the order the tables show them: the pairs, the finite difference,
    then the columns of sections with their own (data-parallel)."""
    keys = [pair_key(a, b) for a, b in pairs()] + [FD]
    for row in report.rows:
        keys += [key for key in row.diffs if key not in keys]
    return [key for key in keys if any(key in row.diffs for row in report.rows)]


def header(key: str) -> str:
    return f"{reference()} f64 vs FD" if key == FD else key.replace("-", " vs ")


def format_report(report: Report, width: int | None = WIDTH) -> str:
    """The report as markdown: a table per section (stages, gradients, trajectories, decode,
    data-parallel), each with the columns its rows use, then the notes and the verdict. Every
    line fits in `width` characters (None: no limit): a table too wide with its full headers
    takes the short ones (a note spells each out), a long name wraps within its column, and the
    title, notes and verdict wrap."""
    first = report.first_failure
    order = columns(report)

    def header_of(key: str) -> str:
        return report.headers.get(key) or header(key)

    sections: list[list[Row]] = []
    for row in report.rows:
        if sections and sections[-1][0].section == row.section:
            sections[-1].append(row)
        else:
            sections.append([row])
    lines = wrap(report.title, width)
    shortened: dict[str, str] = {}
    for rows in sections:
        keys = [key for key in order if any(key in row.diffs for row in rows)]
        lines.append("")
        full = table(keys, rows, header_of, first)  # the full headers only where no name has to wrap beside them
        if width is None or max(map(len, full)) <= width:
            lines += full
            continue
        lines += table(keys, rows, header_of, first, width, short=True)
        names = [header_of(key) for key in keys] + ([reference_header()] if any(row.reference_error is not None for row in rows) else [])
        shortened.update({short_header(name): name for name in names if short_header(name) != name})
    lines.append("")
    notes = sorted({row.note for row in report.rows if row.note} | set(tolerance_notes(report.rows)))
    if shortened:
        notes.insert(0, "columns shortened to fit: " + ", ".join(f"{short} is {name}" for short, name in shortened.items()))
    for note in notes:
        lines += wrap(f"note: {note}", width, indent=" " * 6)
    if first is None:
        lines.append(f"PASS: all {len(report.rows)} comparisons within their tolerances")
    else:
        failures = sum(not row.passed for row in report.rows)
        lines += wrap(
            f"FAIL: first difference at {first.section} '{first.name}': {verdict(first, header_of)} "
            f"({failures} of {len(report.rows)} comparisons fail)",
            width,
        )
    return "\n".join(lines)


def tolerance_notes(rows: list[Row]) -> list[str]:
    """What the tolerance column means: derived from the reference's own error, or fixed."""
    notes = []
    if any(row.reference_error is not None for row in rows):
        notes.append(
            f"tolerance: {K:g} x {reference_header()} ({reference()} in float32 against {reference()} in float64, the same weights "
            f"cast up and inputs), and at least {K:g} float32 roundings of the largest value compared; a row over steps shows "
            "one step, named in the row: the first beyond its tolerance, or else the one closest to it"
        )
    if any(row.reference_error is None and not row.derived_elsewhere and row.tol > 0 for row in rows):
        notes.append(
            "tolerance: a row without the reference's error holds docs/DESIGN.md's fixed tolerance "
            "(float64, which has no higher-precision twin, or a comparison the reference cannot make)"
        )
    return notes
