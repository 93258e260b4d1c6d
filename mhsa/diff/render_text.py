"""Plain text (what `mhsa diff` prints into a pipe), and the wrapping the terminal shares.

Each row is `lineno code M lineno code`, M = | same, * changed, < left only, > right only,
= section header. A line wider than its column wraps at a space or between punctuation,
never inside a name (unless a single name is wider than the column), and every
continuation line starts with `↪`, hung at the line's indent: nothing is cut off.
"""

from __future__ import annotations

from typing import NamedTuple

from mhsa.diff.align import MARKERS, Row, summary, titles_differ

CONTINUED = "↪ "  # starts every continuation line
BREAK_AFTER = ",([{:;="  # a line may wrap after one of these, or before a '.'


class Piece(NamedTuple):
    """One screen line's share of a row's text: lead + text[begin:end]; more = the line
    goes on below; lead = '' on the first piece, indent + '↪ ' on a continuation."""

    begin: int
    end: int
    more: bool
    lead: str = ""


def cell_width(text: str) -> int:
    from rich.cells import cell_len

    return cell_len(text)


def wrap(text: str, width: int) -> list[Piece]:
    """Cut text into pieces that fit `width` cells with their lead. Nothing is dropped:
    the pieces' texts joined are `text`."""
    if cell_width(text) <= width:
        return [Piece(0, len(text), False)]
    hang = min(len(text) - len(text.lstrip(" #")), width // 2)  # code or comment indent
    lead = " " * hang + CONTINUED
    pieces: list[Piece] = []
    begin, room = 0, width
    while cell_width(text[begin:]) > room:
        end = _break(text, begin, _fit(text, begin, room))
        pieces.append(Piece(begin, end, True, lead if pieces else ""))
        begin, room = end, width - cell_width(lead)
    pieces.append(Piece(begin, len(text), False, lead if pieces else ""))
    return pieces


def _fit(text: str, begin: int, room: int) -> int:
    """The first index from `begin` on that no longer fits in `room` cells."""
    from rich.cells import get_character_cell_size

    end, used = begin, 0
    while end < len(text) and used + get_character_cell_size(text[end]) <= room:
        used += get_character_cell_size(text[end])
        end += 1
    return max(end, begin + 1)  # a character wider than the column still moves on


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _break(text: str, begin: int, limit: int) -> int:
    """Where the piece starting at `begin` ends (text[begin:limit] fits): after a space in
    its second half, else after a comma or bracket (or before a '.') there, else after any
    space, else between any two characters that are not both part of a name, else (one name
    wider than the column) at the limit."""
    if limit >= len(text):
        return len(text)
    half = begin + (limit - begin) // 2

    def content(k: int) -> bool:  # the piece would hold more than indentation
        return bool(text[begin:k].strip())

    space = text.rfind(" ", begin, limit)
    if space >= half and content(space):
        return space + 1
    for k in range(limit, half, -1):
        if (text[k - 1] in BREAK_AFTER or text[k] == ".") and content(k):
            return k
    if space >= begin and content(space):
        return space + 1
    for k in range(limit, begin, -1):
        if not (_word(text[k - 1]) and _word(text[k])) and content(k):
            return k
    return limit


def folder(name: str) -> str:
    """'torch_impl' for the column name 'torch_impl/attention.py'."""
    return name.split("/", 1)[0]


def shown(row: Row, side: str, names: tuple[str, str] = ("left", "right")) -> str | None:
    """The text a row shows on one side: the line, or for a header '## title' (for a
    section the other file lacks, '## (not in FOLDER)', the folder of names[side])."""
    text = row.left if side == "left" else row.right
    if row.kind != "section":
        return text
    if text is not None:
        return f"## {text}"
    return f"## (not in {folder(names[0] if side == 'left' else names[1])})"


def columns(rows: list[Row], width: int) -> tuple[int, int]:
    """(line-number width, code-column width) for a total width."""
    numbers = [n for row in rows for n in (row.left_lineno, row.right_lineno) if n]
    nw = max(3, len(str(max(numbers, default=0))))
    return nw, max(10, (width - 2 * nw - 5) // 2)


def physical_lines(rows: list[Row], cw: int, names: tuple[str, str] = ("left", "right")):
    """(row, first, left piece or None, right piece or None) for every screen line."""
    for row in rows:
        left, right = shown(row, "left", names), shown(row, "right", names)
        lp = wrap(left, cw) if left is not None else []
        rp = wrap(right, cw) if right is not None else []
        for k in range(max(len(lp), len(rp))):
            yield row, k == 0, lp[k] if k < len(lp) else None, rp[k] if k < len(rp) else None


def render_plain(rows: list[Row], width: int, left_name: str, right_name: str, labels: tuple[str, str] = ("left", "right")) -> str:
    """Plain text, no escapes; `labels` name the sides in the summary ('torch', 'jax')."""
    names = (left_name, right_name)
    nw, cw = columns(rows, width)
    out = [f"{'':>{nw}} {_pad(left_name, cw)}   {'':>{nw}} {right_name}"]
    for row, first, lp, rp in physical_lines(rows, cw, names):
        if row.kind == "section" and first:
            out.append("")
        ln = str(row.left_lineno) if first and row.left_lineno and row.kind != "section" else ""
        rn = str(row.right_lineno) if first and row.right_lineno and row.kind != "section" else ""
        left = _cut(shown(row, "left", names), lp)
        right = _cut(shown(row, "right", names), rp)
        out.append(f"{ln:>{nw}} {_pad(left, cw)} {marker(row)} {rn:>{nw}} {right}".rstrip())
    out += ["", summary(rows, labels)]
    return "\n".join(out) + "\n"


def marker(row: Row) -> str:
    """The middle column: | same, * changed (or a header worded differently), < >, = header."""
    return MARKERS["changed"] if row.kind == "section" and titles_differ(row) else MARKERS[row.kind]


def _cut(text: str | None, piece: Piece | None) -> str:
    if text is None or piece is None:
        return ""
    return piece.lead + text[piece.begin : piece.end]


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - cell_width(text))
