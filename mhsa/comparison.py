"""The table every comparison of the tools prints as: `mhsa parity`'s sections, `mhsa port-check`'s
rows and `--train`'s steps, each a markdown table of cells that its rows fill."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Column = tuple[str, int, str]  # header, width, alignment ("<" or ">")
RESULT: Column = ("result", 6, "<")  # PASS, FAIL, ...: every table's last column


def table(columns: Sequence[Column], rows: Iterable[tuple[Sequence[str], str]]) -> list[str]:
    """The header, the rule (a right-aligned column's ends in ':') and one line per row, (cells,
    suffix): each cell padded to its column's width (a longer one widens its line only), then the
    suffix (a marker, a note) after the last bar. Empty cells make a blank line of the table."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(f"{cell:{align}{width}}" for cell, (_, width, align) in zip(cells, columns)) + " |"

    rule = "|" + "|".join("-" * (width + 2) if align == "<" else "-" * (width + 1) + ":" for _, width, align in columns) + "|"
    return [line([header for header, _, _ in columns]), rule, *(line(cells) + suffix for cells, suffix in rows)]
