"""The rows of `mhsa diff` in colour on a terminal (rich): Python colours, and a background
on every line that differs (yellow changed, red left only, green right only); long lines
wrap as in plain text (render_text.wrap), continuation lines start with a dim '↪'.
"""

from __future__ import annotations

from mhsa.diff.align import Row, changed_ranges, summary, titles_differ
from mhsa.diff.render_text import (
    CONTINUED,
    Piece,
    columns,
    marker,
    physical_lines,
    shown,
)

# colours on a terminal: backgrounds dark enough for light text
STYLES = {
    "changed": "on #3d3500",
    "mark": "on #7a6000",  # the words that differ inside a changed line
    "left-only": "on #4a1e1e",
    "right-only": "on #1c3d1c",
    "section": "bold #e4e4ff on #2a2a55",
    "missing": "italic #9a9aba on #2a2a55",
    "section-differs": "#ffe680",
    "same-marker": "dim",
    "changed-marker": "bold yellow",
    "left-only-marker": "bold red",
    "right-only-marker": "bold green",
    "section-marker": "bold #e4e4ff on #2a2a55",
    "lineno": "dim",
    "name": "bold underline",
}
# with only 16 colours the dark backgrounds above would all become black
STYLES_16 = {
    "changed": "black on yellow",
    "mark": "bold underline black on bright_yellow",
    "left-only": "white on red",
    "right-only": "black on green",
    "section": "bold white on blue",
    "missing": "italic white on blue",
    "section-differs": "bold black on yellow",
    "section-marker": "bold white on blue",
}


def _rich_lines(lines: list[str]) -> list:
    """Each line as a rich Text with Python colours; the whole file is lexed at once so
    that strings spanning lines are coloured right."""
    from rich.syntax import Syntax
    from rich.text import Text

    code = "\n".join(lines)
    parts = Syntax(code, "python", theme="ansi_dark", background_color="default").highlight(code).split("\n", allow_blank=True)
    return [parts[i] if i < len(parts) and parts[i].plain == line else Text(line) for i, line in enumerate(lines)]


def render_rich(
    rows: list[Row],
    console,
    width: int,
    left_name: str,
    right_name: str,
    left_lines: list[str],
    right_lines: list[str],
    labels: tuple[str, str] = ("left", "right"),
) -> None:
    """Print the rows on `console`; `labels` name the sides in the summary ('torch', 'jax')."""
    from rich.text import Text

    colour = {"left": _rich_lines(left_lines), "right": _rich_lines(right_lines)}
    styles = STYLES if console.color_system in ("256", "truecolor") else {**STYLES, **STYLES_16}
    nw, cw = columns(rows, width)
    names = (left_name, right_name)

    def cell(row: Row, side: str, piece: Piece | None) -> Text:
        text = shown(row, side, names)
        lineno = row.left_lineno if side == "left" else row.right_lineno
        if piece is None or text is None:
            body = Text()
        elif row.kind == "section":
            body = Text(text[piece.begin : piece.end])
        elif row.kind != "same" and styles is not STYLES:
            body = Text(text[piece.begin : piece.end])  # 16 colours: no token colours on a highlight
        else:
            assert lineno is not None, row  # a line row has a line number wherever it has text
            body = colour[side][lineno - 1][piece.begin : piece.end]
        lead = piece.lead if piece is not None and text is not None else ""
        if lead:
            body = Text(lead[: -len(CONTINUED)]) + Text(CONTINUED, style="dim") + body
        body.pad_right(max(0, cw - body.cell_len))
        if row.kind == "section":
            present = (row.left if side == "left" else row.right) is not None
            body.stylize(styles["section"] if present else styles["missing"])
            if titles_differ(row):
                body.stylize(styles["section-differs"])
        elif piece is not None and row.kind != "same":
            body.stylize(styles[row.kind])
            if row.kind == "changed" and row.left is not None and row.right is not None:
                for begin, end in changed_ranges(row.left, row.right)[side == "right"]:
                    begin, end = max(begin, piece.begin), min(end, piece.end)
                    if begin < end:
                        body.stylize(styles["mark"], len(lead) + begin - piece.begin, len(lead) + end - piece.begin)
        return body

    head = Text(" " * (nw + 1))
    head.append(left_name, style=styles["name"])
    head.pad_right(max(0, nw + 1 + cw + 3 + nw + 1 - head.cell_len))
    head.append(right_name, style=styles["name"])
    console.print(head, no_wrap=True, crop=False)
    for row, first, lp, rp in physical_lines(rows, cw, names):
        if row.kind == "section" and first:
            console.print()
        ln = str(row.left_lineno) if first and row.left_lineno and row.kind != "section" else ""
        rn = str(row.right_lineno) if first and row.right_lineno and row.kind != "section" else ""
        line = Text()
        line.append(f"{ln:>{nw}} ", style=styles["lineno"])
        line.append_text(cell(row, "left", lp))
        line.append(f" {marker(row) if row.kind != 'same' else '│'} ", style=styles[f"{row.kind}-marker"])
        line.append(f"{rn:>{nw}} ", style=styles["lineno"])
        line.append_text(cell(row, "right", rp))
        console.print(line, no_wrap=True, crop=False)
    console.print()
    console.print(Text(summary(rows, labels), style="bold"))
