"""Rows of a parity report as one markdown table: a column per compared pair (the gaps), the
reference's own float32 error where the tolerance is derived from it, the tolerance and the
result. `mhsa parity` prints a table per section; `python -m mhsa.parity.data_parallel` one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mhsa.parity.rows import Row, reference


def reference_header() -> str:
    """The column of the reference's own float32 error (itself in float32 against float64)."""
    return f"{reference()} own error"


def table(keys: Sequence[str], rows: Sequence[Row], header_of: Callable[[str], str], first: Row | None = None) -> list[str]:
    """The lines of one table: `keys` are the gap columns (Row.diffs keys), named by header_of;
    the reference's error column only where some row's tolerance is derived; `first` (the
    report's first failing row) is marked."""
    derived = any(row.reference_error is not None for row in rows)
    headers = [header_of(key) for key in keys] + ([reference_header()] if derived else [])
    widths = [max(8, len(header)) for header in headers]
    width = max(len(_row_name(row)) for row in rows)
    lines = [
        f"| {'compared':<{width}} | " + " | ".join(f"{header:>{w}}" for header, w in zip(headers, widths)) + " | tolerance | result |",
        "|" + "-" * (width + 2) + "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|----------:|--------|",
    ]
    for row in rows:
        values = [row.diffs.get(key) for key in keys] + ([row.reference_error] if derived else [])
        cells = " | ".join(f"{_cell(value):>{w}}" for value, w in zip(values, widths))
        marker = "  <- the implementations part here" if row is first else ""
        lines.append(f"| {_row_name(row):<{width}} | {cells} | {row.tol:>9.1e} | {'PASS' if row.passed else 'FAIL'}   |{marker}")
    return lines


def verdict(row: Row, header_of: Callable[[str], str]) -> str:
    """'<column> <gap> > <tolerance>' for a failing row's first failing column; else its first
    problem (a row whose gaps pass can fail on a setting that differs)."""
    key = row.failing_pair()
    if key is None:
        assert row.problems, f"{row.name} does not fail"
        return row.problems[0]
    return f"{header_of(key)} {row.diffs[key]:.2e} > {row.tol_of(key):.1e}"


def _row_name(row: Row) -> str:
    name = f"grad {row.name}" if row.section == "gradient" else row.name
    # a row over steps shows one step's numbers (and a row over tensors one tensor's): say which
    # (a failing row's name says it already)
    if row.step is None or not row.passed:
        return name
    return f"{name} (at step {row.step}: {row.at})" if row.at else f"{name} (at step {row.step})"


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.2e}"
