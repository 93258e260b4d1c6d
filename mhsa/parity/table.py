"""Rows of a parity report as one markdown table: a column per compared pair (the gaps), the
reference's own float32 error where the tolerance is derived from it, the tolerance and the
result. `mhsa parity` prints a table per section; `python -m mhsa.parity.data_parallel` one."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence

from mhsa import comparison
from mhsa.comparison import RESULT
from mhsa.parity.rows import Row, reference

WIDTH = 120  # `mhsa parity`'s default line width: a report reads in a terminal or a diff without scrolling sideways
MIN_WIDTH = WIDTH  # the narrowest the tables fit: a gradient's name beside five gap columns, the tolerance and the result takes 115
NAME_FLOOR = 12  # the name column never narrows below this: a table with more columns than the width holds runs wider
MARKER = "<- the implementations part here"


def reference_header() -> str:
    """The column of the reference's own float32 error (itself in float32 against float64)."""
    return f"{reference()} own error"


def short_header(header: str) -> str:
    """A header shortened to fit a narrow table: 'torch vs numpy' -> 'torch-numpy', 'numpy own
    error' -> 'numpy err' (the report's notes spell out each one it uses)."""
    return header.replace(" vs ", "-").replace(" own error", " err")


def table(
    keys: Sequence[str],
    rows: Sequence[Row],
    header_of: Callable[[str], str],
    first: Row | None = None,
    width: int | None = None,
    short: bool = False,
) -> list[str]:
    """The lines of one table: `keys` are the gap columns (Row.diffs keys), named by header_of
    (shortened by short_header if `short`); the reference's error column only where some row's
    tolerance is derived; `first` (the report's first failing row) is marked. Within `width`
    (None: no limit) a row's name wraps onto lines of its own with the other cells empty, and
    the marker joins the name where it does not fit after the row."""
    derived = any(row.reference_error is not None for row in rows)
    headers = [header_of(key) for key in keys] + ([reference_header()] if derived else [])
    if short:
        headers = [short_header(header) for header in headers]
    widths = [max(8, len(header)) for header in headers]
    fixed = 5 + sum(w + 3 for w in widths) + len("tolerance | result |")  # every cell but the name's
    longest = max(len(_row_name(row)) for row in rows)
    room = longest if width is None else max(NAME_FLOOR, min(longest, width - fixed))
    marker_fits = width is None or fixed + room + 2 + len(MARKER) <= width
    full = {id(row): _row_name(row) + ("" if row is not first or marker_fits else f" {MARKER}") for row in rows}
    if width is not None and not marker_fits:  # the marker joins the name: the column widens for it where the width allows
        room = max(NAME_FLOOR, min(max(map(len, full.values())), width - fixed))
    names = {key: _wrap(name, room) if len(name) > room else [name] for key, name in full.items()}
    room = max(len(line) for wrapped in names.values() for line in wrapped)
    columns = [("compared", room, "<"), *((header, w, ">") for header, w in zip(headers, widths)), ("tolerance", 9, ">"), RESULT]
    body: list[tuple[list[str], str]] = []
    for row in rows:
        values = [row.diffs.get(key) for key in keys] + ([row.reference_error] if derived else [])
        head, *rest = names[id(row)]
        result = [*map(_cell, values), f"{row.tol:.1e}", "PASS" if row.passed else "FAIL"]
        body.append(([head, *result], f"  {MARKER}" if row is first and marker_fits else ""))
        body += [([line, *[""] * len(result)], "") for line in rest]
    return comparison.table(columns, body)


def wrap(text: str, width: int | None, indent: str = "  ") -> list[str]:
    """`text` as lines of at most `width` characters (None: one line), each after the first indented."""
    if width is None:
        return [text]
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False) or [""]


def _wrap(name: str, room: int) -> list[str]:
    # a continuation is indented: it reads as the row above's name, not a row of its own
    return textwrap.wrap(name, room, subsequent_indent="  ", break_on_hyphens=False)


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
