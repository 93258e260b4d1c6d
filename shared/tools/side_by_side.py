"""`mhsa diff`: torch_impl/X.py and jax_impl/X.py in two columns, aligned step by step.

Each file is split into sections: a preamble, one section per top-level class or function
(and per method inside a class), and one per section comment (`# 5. mask: ...`). Sections
are paired by their key (the comment text, or the class/function name, with torch
`forward` and flax `__call__` counted as the same method), in order; inside a pair the
lines are aligned with difflib. The same rows drive three renderings: plain text when
piped, rich colour on a terminal, and one self-contained HTML page (`--html FILE`).
"""

from __future__ import annotations

import argparse
import difflib
import html
import io
import os
import re
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import shared
from shared.files import write_atomically
from shared.tools.train_cli import int_at_least

NAMES = ("attention", "model", "train")
LEFT_DIR, RIGHT_DIR = "torch_impl", "jax_impl"
LEFT_LABEL, RIGHT_LABEL = "torch", "jax"

# a section comment: the stripped line is `# <N>. <words>`
SECTION_RE = re.compile(r"^#\s+(\d+)\.\s+(.+)$")
HEADER_RE = re.compile(r"^(?:async\s+def|def|class)\s+([A-Za-z_]\w*)")
KINDS = ("same", "changed", "left-only", "right-only", "section")
MARKERS = {"same": "|", "changed": "*", "left-only": "<", "right-only": ">", "section": "="}
MAX_PAIRING = 4000  # replaced blocks up to this many line pairs are paired by similarity
MIN_WIDTH = 40


@dataclass
class Section:
    """A run of consecutive lines: kind 'preamble', 'def' (class/function/method header
    and body up to its first section comment), 'step' (from a section comment) or 'code'
    (module-level statements after a definition)."""

    kind: str
    title: str  # what the header row shows
    scope: str  # enclosing 'Class.method' or 'function' as written, '' at module level
    start: int  # 1-based line number of lines[0]
    lines: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple:
        """What pairs a section with its mirror: same kind, same scope, same title."""
        scope = normal_scope(self.scope)
        if self.kind == "def":
            return ("def", self.title.split(" ", 1)[0], scope)
        if self.kind == "preamble":
            return ("preamble",)
        return (self.kind, scope, self.title)


class Row(NamedTuple):
    """One aligned row. kind 'section' is a header row whose texts are the section titles
    (None where the section exists on one side only) and whose numbers are first lines."""

    left: str | None
    right: str | None
    left_lineno: int | None
    right_lineno: int | None
    kind: str


def normal_scope(scope: str) -> str:
    """'Block.forward' (torch) and 'Block.__call__' (flax) are the same method."""
    head, dot, last = scope.rpartition(".")
    return f"{head}.__call__" if dot and last == "forward" else scope


# --- splitting -------------------------------------------------------------------------


def _scan(lines: list[str]) -> tuple[set[int], set[int]]:
    """(lines where a statement starts, lines that hold only a comment), 1-based.

    tokenize keeps text inside strings and continuation lines (a closing `):` at column 0)
    from looking like code or comments; if the file does not tokenize, every line counts.
    """
    starts: set[int] = set()
    comments: set[int] = set()
    at_start = True
    try:
        for tok in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline):
            if tok.type == tokenize.NEWLINE:
                at_start = True
            elif tok.type == tokenize.COMMENT:
                if not tok.line[: tok.start[1]].strip():
                    comments.add(tok.start[0])
            elif tok.type not in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
                if at_start:
                    starts.add(tok.start[0])
                at_start = False
    except (tokenize.TokenError, SyntaxError):
        everything = set(range(1, len(lines) + 1))
        return everything, {n for n in everything if lines[n - 1].lstrip().startswith("#")}
    return starts, comments


def split_sections(lines: list[str]) -> list[Section]:
    """Split one file's lines into sections, in order; every line lands in exactly one."""
    starts, comments = _scan(lines)
    sections = [Section("preamble", "preamble", "", 1)]
    top = ""  # current top-level class or function, '' at module level
    in_class = False
    body_indent: int | None = None  # indent of the current class body
    method = ""  # current method (or nested class) of that class
    pending = False  # the last section holds only decorators so far

    def start(kind: str, title: str, scope: str, n: int, attach: bool = False) -> None:
        # comment lines right above a definition (no blank between) belong to it
        previous = sections[-1]
        moved: list[str] = []
        if attach:
            indent = _indent(lines[n - 1])
            while previous.lines:
                m = previous.start + len(previous.lines) - 1
                text = previous.lines[-1]
                if m in comments and _indent(text) == indent and not SECTION_RE.match(text.strip()):
                    moved.insert(0, previous.lines.pop())
                else:
                    break
        sections.append(Section(kind, title, scope, n - len(moved), moved))

    for n, line in enumerate(lines, 1):
        stripped = line.strip()
        indent = _indent(line)
        section = SECTION_RE.match(stripped) if n in comments else None
        if section:
            pending = False
            start("step", stripped[1:].strip(), f"{top}.{method}" if method else top, n)
        elif n in starts:
            header = HEADER_RE.match(stripped)
            decorator = stripped.startswith("@")
            if indent == 0:
                if header or decorator:
                    name = header.group(1) if header else ""
                    if header and pending:
                        sections[-1].title, sections[-1].scope = _def_title(stripped, name), name
                    elif header or not pending:
                        start("def", _def_title(stripped, name) if header else "", name, n, attach=True)
                    pending = decorator
                    top, method, in_class, body_indent = name, "", stripped.startswith("class"), None
                elif top:
                    # module-level code after a definition: its own section
                    start("code", stripped, "", n, attach=True)
                    top, method, in_class, body_indent = "", "", False, None
                    pending = False
            elif in_class:
                if body_indent is None:
                    body_indent = indent
                if indent == body_indent and (header or decorator):
                    name = header.group(1) if header else ""
                    title = _def_title(stripped, f"{top}.{name}")
                    if header and pending:
                        sections[-1].title, sections[-1].scope = title, f"{top}.{name}"
                    elif header or not pending:
                        start("def", title if header else "", f"{top}.{name}", n, attach=True)
                    pending = decorator
                    method = name
                elif indent == body_indent and method:
                    # a class-level statement after a method
                    start("code", stripped, top, n)
                    method, pending = "", False
        sections[-1].lines.append(line)
    return [s for s in sections if s.lines]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _def_title(stripped: str, qualified: str) -> str:
    return f"{'class' if stripped.startswith('class') else 'def'} {qualified}"


# --- aligning --------------------------------------------------------------------------


def align(left: list[str], right: list[str], left_start: int = 1, right_start: int = 1) -> list[Row]:
    """Align two runs of lines: equal lines 'same', replaced lines paired in order as
    'changed' (the most similar pairing), the rest 'left-only' / 'right-only'.
    Trailing spaces are ignored."""
    a = [line.rstrip() for line in left]
    b = [line.rstrip() for line in right]
    rows: list[Row] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            rows += [Row(left[i], right[j], left_start + i, right_start + j, "same")
                     for i, j in zip(range(i1, i2), range(j1, j2))]
        else:
            _pair(a, b, i1, i2, j1, j2, rows, left, right, left_start, right_start)
    return rows


def _pair(a, b, i1, i2, j1, j2, rows, left, right, left_start, right_start) -> None:
    """Pair a replaced block in order so that the paired lines are as similar as possible
    in total (the same step written differently sits side by side); the lines left over
    are one-sided. Very large blocks are paired by position."""
    n, m = i2 - i1, j2 - j1
    if n * m > MAX_PAIRING:
        chosen = [(i1 + k, j1 + k) for k in range(min(n, m))]
    else:
        ratio = [[difflib.SequenceMatcher(None, a[i1 + i], b[j1 + j], autojunk=False).ratio()
                  for j in range(m)] for i in range(n)]
        best = [[0.0] * (m + 1) for _ in range(n + 1)]  # best[i][j]: first i against first j
        for i in range(1, n + 1):
            for j in range(1, m + 1):
                best[i][j] = max(best[i - 1][j - 1] + ratio[i - 1][j - 1] + 1e-9,
                                 best[i - 1][j], best[i][j - 1])
        chosen, i, j = [], n, m
        while i and j:
            if best[i][j] == best[i - 1][j - 1] + ratio[i - 1][j - 1] + 1e-9:
                chosen.append((i1 + i - 1, j1 + j - 1))
                i, j = i - 1, j - 1
            elif best[i][j] == best[i - 1][j]:
                i -= 1
            else:
                j -= 1
        chosen.reverse()
    i, j = i1, j1
    for pi, pj in chosen + [(i2, j2)]:
        rows += [Row(left[k], None, left_start + k, None, "left-only") for k in range(i, pi)]
        rows += [Row(None, right[k], None, right_start + k, "right-only") for k in range(j, pj)]
        if pi < i2 and pj < j2:
            rows.append(Row(left[pi], right[pj], left_start + pi, right_start + pj, "changed"))
        i, j = pi + 1, pj + 1


def pair_sections(left: list[Section], right: list[Section]) -> list[tuple[Section | None, Section | None]]:
    """Pair sections by key, in order. Among the rest, steps with the same number and label
    (`1. model: ...`, the words before the colon) in the same scope are paired too, so a
    reworded comment still lines its code up; anything else is paired with None."""
    pairs: list[tuple[Section | None, Section | None]] = []
    matcher = difflib.SequenceMatcher(None, [s.key for s in left], [s.key for s in right], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            pairs += list(zip(left[i1:i2], right[j1:j2]))
            continue
        loose = difflib.SequenceMatcher(None, [_loose_key(s) for s in left[i1:i2]],
                                        [_loose_key(s) for s in right[j1:j2]], autojunk=False)
        for tag2, a1, a2, b1, b2 in loose.get_opcodes():
            if tag2 == "equal":
                pairs += list(zip(left[i1 + a1:i1 + a2], right[j1 + b1:j1 + b2]))
            else:
                pairs += [(s, None) for s in left[i1 + a1:i1 + a2]] + [(None, s) for s in right[j1 + b1:j1 + b2]]
    return pairs


def _loose_key(section: Section) -> tuple:
    match = re.match(r"(\d+)\.\s+([^:]*)", section.title) if section.kind == "step" else None
    if not match:
        return section.key
    return ("step", normal_scope(section.scope), match.group(1), match.group(2).strip())


def titles_differ(row: Row) -> bool:
    """A header row whose two titles are worded differently (torch forward = flax __call__)."""
    if row.left is None or row.right is None:
        return False
    return _normal_title(row.left) != _normal_title(row.right)


def _normal_title(title: str) -> str:
    return f"{title[:-len('.forward')]}.__call__" if title.startswith("def ") and title.endswith(".forward") else title


def side_by_side(left_lines: list[str], right_lines: list[str]) -> list[Row]:
    """Every row of the view: per section pair a 'section' header row, then its lines."""
    rows: list[Row] = []
    for ls, rs in pair_sections(split_sections(left_lines), split_sections(right_lines)):
        rows.append(Row(ls and ls.title, rs and rs.title, ls and ls.start, rs and rs.start, "section"))
        rows += align(ls.lines if ls else [], rs.lines if rs else [],
                      ls.start if ls else 1, rs.start if rs else 1)
    return rows


def section_stats(rows: list[Row]) -> list[tuple[Row, dict[str, int]]]:
    """Each header row with the count of its rows of each kind."""
    out: list[tuple[Row, dict[str, int]]] = []
    for row in rows:
        if row.kind == "section":
            out.append((row, dict.fromkeys(KINDS[:4], 0)))
        elif out:
            out[-1][1][row.kind] += 1
    return out


def summary(rows: list[Row]) -> str:
    """One line: how many sections paired, and how many lines of each kind."""
    stats = section_stats(rows)
    paired = sum(1 for row, _ in stats if row.left is not None and row.right is not None)
    counts = dict.fromkeys(KINDS[:4], 0)
    for row in rows:
        if row.kind != "section":
            counts[row.kind] += 1
    return (f"{len(stats)} sections ({paired} paired, {len(stats) - paired} one-sided); lines: "
            f"{counts['same']} same, {counts['changed']} changed, "
            f"{counts['left-only']} {LEFT_LABEL} only, {counts['right-only']} {RIGHT_LABEL} only")


# --- text rendering --------------------------------------------------------------------


class Piece(NamedTuple):
    """One physical line's share of a row's text: text[begin:end], '…' after it if more."""

    begin: int
    end: int
    more: bool


def cell_width(text: str) -> int:
    from rich.cells import cell_len

    return cell_len(text)


def wrap(text: str, width: int) -> list[Piece]:
    """Cut text into pieces of at most `width` cells, at a space where one is near the end;
    a piece that is not the last keeps one cell for the '…' that shows the line goes on.
    Nothing is dropped."""
    from rich.cells import get_character_cell_size

    pieces: list[Piece] = []
    begin = 0
    while cell_width(text[begin:]) > width:
        end, used = begin, 0
        while end < len(text) and used + get_character_cell_size(text[end]) <= width - 1:
            used += get_character_cell_size(text[end])
            end += 1
        space = text.rfind(" ", begin + (width - 1) // 2, end)
        if space >= 0 and text[begin:space].strip():
            end = space + 1
        end = max(end, begin + 1)  # a character wider than the column still moves on
        pieces.append(Piece(begin, end, True))
        begin = end
    pieces.append(Piece(begin, len(text), False))
    return pieces


def shown(row: Row, side: str) -> str | None:
    """The text a row shows on one side: the line, or for a header '## title'."""
    text = row.left if side == "left" else row.right
    if row.kind != "section":
        return text
    if text is not None:
        return f"## {text}"
    return f"## (not in {LEFT_DIR if side == 'left' else RIGHT_DIR})"


def columns(rows: list[Row], width: int) -> tuple[int, int]:
    """(line-number width, code-column width) for a total width."""
    numbers = [n for row in rows for n in (row.left_lineno, row.right_lineno) if n]
    nw = max(3, len(str(max(numbers, default=0))))
    return nw, max(10, (width - 2 * nw - 5) // 2)


def physical_lines(rows: list[Row], cw: int):
    """(row, first, left piece or None, right piece or None) for every screen line."""
    for row in rows:
        left, right = shown(row, "left"), shown(row, "right")
        lp = wrap(left, cw) if left is not None else []
        rp = wrap(right, cw) if right is not None else []
        for k in range(max(len(lp), len(rp))):
            yield row, k == 0, lp[k] if k < len(lp) else None, rp[k] if k < len(rp) else None


def render_plain(rows: list[Row], width: int, left_name: str, right_name: str) -> str:
    """Plain text, no escapes: `lineno code M lineno code`, M = | same, * changed,
    < left only, > right only, = section header."""
    nw, cw = columns(rows, width)
    out = [f"{'':>{nw}} {_pad(left_name, cw)}   {'':>{nw}} {right_name}"]
    for row, first, lp, rp in physical_lines(rows, cw):
        if row.kind == "section" and first:
            out.append("")
        ln = str(row.left_lineno) if first and row.left_lineno and row.kind != "section" else ""
        rn = str(row.right_lineno) if first and row.right_lineno and row.kind != "section" else ""
        left = _cut(shown(row, "left"), lp)
        right = _cut(shown(row, "right"), rp)
        out.append(f"{ln:>{nw}} {_pad(left, cw)} {marker(row)} {rn:>{nw}} {right}".rstrip())
    out += ["", summary(rows)]
    return "\n".join(out) + "\n"


def marker(row: Row) -> str:
    """The middle column: | same, * changed (or a header worded differently), < >, = header."""
    return MARKERS["changed"] if row.kind == "section" and titles_differ(row) else MARKERS[row.kind]


def _cut(text: str | None, piece: Piece | None) -> str:
    if text is None or piece is None:
        return ""
    return text[piece.begin:piece.end] + ("…" if piece.more else "")


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - cell_width(text))


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
    parts = Syntax(code, "python", theme="ansi_dark", background_color="default").highlight(code).split(
        "\n", allow_blank=True)
    return [parts[i] if i < len(parts) and parts[i].plain == line else Text(line) for i, line in enumerate(lines)]


def render_rich(rows: list[Row], console, width: int, left_name: str, right_name: str,
                left_lines: list[str], right_lines: list[str]) -> None:
    """Python colours, and a background on every line that differs (yellow changed,
    red left only, green right only); long lines wrap with a '…'."""
    from rich.text import Text

    colour = {"left": _rich_lines(left_lines), "right": _rich_lines(right_lines)}
    styles = STYLES if console.color_system in ("256", "truecolor") else {**STYLES, **STYLES_16}
    nw, cw = columns(rows, width)

    def cell(row: Row, side: str, piece: Piece | None) -> Text:
        text = shown(row, side)
        lineno = row.left_lineno if side == "left" else row.right_lineno
        if piece is None or text is None:
            body = Text()
        elif row.kind == "section":
            body = Text(text[piece.begin:piece.end])
        elif row.kind != "same" and styles is not STYLES:
            body = Text(text[piece.begin:piece.end])  # 16 colours: no token colours on a highlight
        else:
            body = colour[side][lineno - 1][piece.begin:piece.end]
        if piece is not None and piece.more:
            body.append("…", style="dim")
        body.pad_right(max(0, cw - body.cell_len))
        if row.kind == "section":
            present = (row.left if side == "left" else row.right) is not None
            body.stylize(styles["section"] if present else styles["missing"])
            if titles_differ(row):
                body.stylize(styles["section-differs"])
        elif piece is not None and row.kind != "same":
            body.stylize(styles[row.kind])
            if row.kind == "changed":
                for begin, end in changed_ranges(row.left, row.right)[side == "right"]:
                    begin, end = max(begin, piece.begin), min(end, piece.end)
                    if begin < end:
                        body.stylize(styles["mark"], begin - piece.begin, end - piece.begin)
        return body

    head = Text(" " * (nw + 1))
    head.append(left_name, style=styles["name"])
    head.pad_right(max(0, nw + 1 + cw + 3 + nw + 1 - head.cell_len))
    head.append(right_name, style=styles["name"])
    console.print(head, no_wrap=True, crop=False)
    for row, first, lp, rp in physical_lines(rows, cw):
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
    console.print(Text(summary(rows), style="bold"))


# --- HTML ------------------------------------------------------------------------------

HTML_STYLE = "default"  # pygments style for the page (light background)

PAGE_CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #ffffff; color: #1f2328;
       font: 15px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; }
header, nav { padding: 14px 24px 6px; }
h1 { font-size: 21px; margin: 0 0 6px; }
h1 .vs { color: #6e7781; font-weight: normal; padding: 0 6px; }
h2 { font-size: 16px; margin: 0 0 6px; }
p { margin: 4px 0; }
.legend span { display: inline-block; padding: 1px 8px; margin-right: 6px; border-radius: 3px;
               border: 1px solid #d0d7de; font-size: 13px; }
nav ol { margin: 0; padding-left: 0; list-style: none; columns: 2 32em; column-gap: 32px; }
nav li { padding: 1px 0; break-inside: avoid; }
nav li.depth-1 { padding-left: 1.4em; }
nav li.depth-2 { padding-left: 2.8em; }
nav a { color: #0550ae; text-decoration: none; }
nav a:hover { text-decoration: underline; }
.badge { font-size: 12px; padding: 0 6px; border-radius: 8px; margin-left: 4px; white-space: nowrap; }
.badge.same { background: #dafbe1; color: #116329; }
.badge.differs { background: #fff1b8; color: #7d4e00; }
.badge.left-only { background: #ffebe9; color: #a40e26; }
.badge.right-only { background: #ccf5d6; color: #0f5323; }
table.sbs { width: 100%; border-collapse: collapse; table-layout: fixed; margin-top: 8px;
            font: 13px/1.5 ui-monospace, "DejaVu Sans Mono", "SFMono-Regular", Menlo, Consolas, monospace; }
table.sbs col.ln { width: 3.6em; }
table.sbs col.mark { width: 1.8em; }
thead th { position: sticky; top: 0; z-index: 1; background: #f6f8fa; text-align: left; padding: 6px;
           border-bottom: 1px solid #d0d7de; font-size: 14px; }
td { vertical-align: top; padding: 0 6px; }
td.code { white-space: pre-wrap; overflow-wrap: anywhere; tab-size: 4;
          padding-left: calc(6px + 4ch); text-indent: -4ch; }  /* a wrapped line hangs 4 columns in */
td.ln { text-align: right; color: #8c959f; user-select: none; }
td.mark { text-align: center; font-weight: bold; user-select: none; }
tr.changed td.code, .legend .changed { background: #fff5c2; }
tr.changed td.ln { background: #ffec99; }
tr.changed td.mark { color: #9a6700; }
tr.changed mark { background: #f2cc60; color: inherit; border-radius: 2px; }
tr.left-only td.code.l, .legend .left-only { background: #ffebe9; }
tr.left-only td.ln.l { background: #ffcecb; }
tr.left-only td.mark { color: #cf222e; }
tr.right-only td.code.r, .legend .right-only { background: #dafbe1; }
tr.right-only td.ln.r { background: #aceebb; }
tr.right-only td.mark { color: #1a7f37; }
tr.left-only td.r, tr.right-only td.l {
  background: repeating-linear-gradient(135deg, #f6f8fa 0 5px, #eaeef2 5px 10px); }
tr.section td { background: #ddf4ff; color: #0a3069; font-weight: 600; padding-top: 3px; padding-bottom: 3px;
                border-top: 2px solid #54aeff; font-family: system-ui, -apple-system, "DejaVu Sans", sans-serif; }
tr.section.differs td { background: #fff1b8; color: #7d4e00; border-top-color: #d4a72c; }
tr.section td.missing { color: #57606a; font-style: italic; font-weight: normal; }
tr.gap td { height: 10px; }
footer { padding: 12px 24px 24px; color: #57606a; font-size: 13px; }
"""


def tokens_by_line(lines: list[str]) -> list[list[tuple[str, str]]]:
    """Each line as (pygments css class, text) pieces; the whole file is lexed at once so
    that strings spanning lines are coloured right."""
    from pygments.lexers import PythonLexer
    from pygments.token import STANDARD_TYPES

    out: list[list[tuple[str, str]]] = []
    current: list[tuple[str, str]] = []
    lexer = PythonLexer(stripnl=False, ensurenl=True)
    for ttype, value in lexer.get_tokens("\n".join(lines) + "\n"):
        while ttype not in STANDARD_TYPES:
            ttype = ttype.parent
        for k, part in enumerate(value.split("\n")):
            if k:
                out.append(current)
                current = []
            if part:
                current.append((STANDARD_TYPES[ttype], part))
    if len(out) < len(lines) or any("".join(t for _, t in pieces) != line for pieces, line in zip(out, lines)):
        return [[("", line)] for line in lines]  # never show text that differs from the file
    return out[: len(lines)]


def line_html(pieces: list[tuple[str, str]], marks: list[tuple[int, int]] = ()) -> str:
    """One line as HTML: token spans, with the character ranges in `marks` inside <mark>."""
    out, position = [], 0
    for css, text in pieces:
        cuts = sorted({0, len(text), *(min(max(b - position, 0), len(text)) for m in marks for b in m)})
        for begin, end in zip(cuts, cuts[1:]):
            part = html.escape(text[begin:end])
            if any(b <= position + begin and position + end <= e for b, e in marks):
                part = f"<mark>{part}</mark>"
            out.append(f'<span class="{css}">{part}</span>' if css else part)
        position += len(text)
    return "".join(out)


WORD_RE = re.compile(r"\w+|\s+|[^\w\s]")


def changed_ranges(left: str, right: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The character ranges that differ between two paired lines, word by word; none when
    the lines have too little in common for a word diff to help."""
    a, b = WORD_RE.findall(left), WORD_RE.findall(right)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    if matcher.ratio() < 0.4:
        return [], []
    offsets_a = [0] + [len(w) for w in a]
    offsets_b = [0] + [len(w) for w in b]
    for k in range(1, len(offsets_a)):
        offsets_a[k] += offsets_a[k - 1]
    for k in range(1, len(offsets_b)):
        offsets_b[k] += offsets_b[k - 1]
    ranges_a, ranges_b = [], []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            if i2 > i1:
                ranges_a.append((offsets_a[i1], offsets_a[i2]))
            if j2 > j1:
                ranges_b.append((offsets_b[j1], offsets_b[j2]))
    return ranges_a, ranges_b


def render_html(left_lines: list[str], right_lines: list[str], left_name: str, right_name: str,
                title: str = "") -> str:
    """One self-contained page: inline CSS, no scripts, no external resources."""
    from pygments.formatters import HtmlFormatter

    rows = side_by_side(left_lines, right_lines)
    tokens = {"l": tokens_by_line(left_lines), "r": tokens_by_line(right_lines)}
    stats = section_stats(rows)
    depths = [_depth(ls or rs) for ls, rs in pair_sections(split_sections(left_lines), split_sections(right_lines))]
    esc = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title or f'{left_name} vs {right_name}')}</title>",
        "<style>",
        PAGE_CSS.strip(),
        "\n".join(HtmlFormatter(style=HTML_STYLE).get_token_style_defs("td.code")),
        "</style>",
        "</head>",
        "<body>",
        "<header>",
        f'<h1>{esc(left_name)}<span class="vs">vs</span>{esc(right_name)}</h1>',
        f'<p class="summary">{esc(summary(rows))}</p>',
        '<p class="legend"><span class="same">same</span><span class="changed">changed</span>'
        f'<span class="left-only">{LEFT_LABEL} only</span><span class="right-only">{RIGHT_LABEL} only</span></p>',
        "</header>",
        '<nav><h2>Sections</h2><ol class="index">',
    ]
    for k, ((row, counts), depth) in enumerate(zip(stats, depths), 1):
        label = row.left if row.left is not None else row.right
        if row.left is not None and row.right is not None and row.left != row.right:
            label = f"{row.left} / {row.right}"
        if row.right is None:
            badge = ("left-only", f"{LEFT_LABEL} only")
        elif row.left is None:
            badge = ("right-only", f"{RIGHT_LABEL} only")
        else:
            differing = counts["changed"] + counts["left-only"] + counts["right-only"]
            differing += titles_differ(row)
            badge = ("differs", f"{differing} differ") if differing else ("same", "same")
        out.append(f'<li class="depth-{min(depth, 2)}"><a href="#s{k}">{esc(label)}</a>'
                   f'<span class="badge {badge[0]}">{badge[1]}</span></li>')
    out += [
        "</ol></nav>",
        '<table class="sbs">',
        '<colgroup><col class="ln"><col class="code"><col class="mark"><col class="ln"><col class="code"></colgroup>',
        f'<thead><tr><th colspan="2">{esc(left_name)}</th><th></th><th colspan="2">{esc(right_name)}</th></tr></thead>',
        "<tbody>",
    ]
    k = 0
    for row in rows:
        if row.kind == "section":
            k += 1
            if k > 1:
                out.append('<tr class="gap"><td colspan="5"></td></tr>')
            cells = []
            for side, text, missing in (("l", row.left, LEFT_DIR), ("r", row.right, RIGHT_DIR)):
                if text is None:
                    cells.append(f'<td colspan="2" class="{side} missing">(not in {missing})</td>')
                else:
                    cells.append(f'<td colspan="2" class="{side}">{esc(text)}</td>')
            differs = " differs" if titles_differ(row) else ""
            mark = MARKERS["changed"] if differs else ""
            out.append(f'<tr class="section{differs}" id="s{k}">{cells[0]}<td class="mark">{mark}</td>{cells[1]}</tr>')
            continue
        mark = "" if row.kind == "same" else MARKERS[row.kind]
        marks = changed_ranges(row.left, row.right) if row.kind == "changed" else ([], [])
        left = line_html(tokens["l"][row.left_lineno - 1], marks[0]) if row.left is not None else ""
        right = line_html(tokens["r"][row.right_lineno - 1], marks[1]) if row.right is not None else ""
        out.append(
            f'<tr class="{row.kind}">'
            f'<td class="ln l">{row.left_lineno or ""}</td><td class="code l">{left}</td>'
            f'<td class="mark">{mark}</td>'
            f'<td class="ln r">{row.right_lineno or ""}</td><td class="code r">{right}</td></tr>'
        )
    out += [
        "</tbody>",
        "</table>",
        "<footer>Sections are paired by their comment text (<code># N. words</code>) or their class/function name "
        "(torch <code>forward</code> = flax <code>__call__</code>); lines inside a pair are aligned with difflib. "
        "Written by <code>mhsa diff --html</code>.</footer>",
        "</body>",
        "</html>",
    ]
    return "\n".join(out) + "\n"


def _depth(section: Section) -> int:
    """Indent of a section in the index: methods under classes, steps under functions."""
    if section.kind == "def":
        return section.scope.count(".")
    if section.kind == "step":
        return section.scope.count(".") + 1 if section.scope else 0
    return 0


# --- the command -----------------------------------------------------------------------


def repo_root() -> Path:
    return Path(shared.__file__).resolve().parent.parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", default="attention", choices=NAMES,
                        help="which pair of files: torch_impl/NAME.py and jax_impl/NAME.py (default: attention)")
    parser.add_argument("--html", metavar="FILE", type=Path,
                        help="write one self-contained HTML page to FILE instead of printing")
    parser.add_argument("--width", metavar="N", type=int_at_least(MIN_WIDTH, f"a width of at least {MIN_WIDTH}"),
                        help="total width in characters (default: the terminal's, or 160 when there is none)")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="colour the terminal output: auto (when stdout is a terminal), always, never")


def terminal_width(default: int = 160) -> int:
    """COLUMNS, else the width of whichever of stdout/stderr is a terminal, else `default`."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) >= MIN_WIDTH:
        return int(columns)
    for stream in (sys.stdout, sys.stderr):
        try:
            return max(MIN_WIDTH, os.get_terminal_size(stream.fileno()).columns)
        except (AttributeError, OSError, ValueError):
            continue
    return default


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").expandtabs(4).splitlines()


def run(args) -> int:
    root = repo_root()
    names = (f"{LEFT_DIR}/{args.name}.py", f"{RIGHT_DIR}/{args.name}.py")
    paths = [root / name for name in names]
    missing = [name for name, path in zip(names, paths) if not path.is_file()]
    if missing:
        print(f"mhsa diff: {' and '.join(missing)} not found under {root}; nothing to compare",
              file=sys.stderr)
        return 1
    try:
        left_lines, right_lines = (read_lines(path) for path in paths)
    except (OSError, UnicodeDecodeError) as error:
        print(f"mhsa diff: cannot read {error}", file=sys.stderr)
        return 1

    if args.html is not None:
        target = Path(args.html)
        if not target.parent.is_dir():
            print(f"mhsa diff: cannot write {target}: folder {target.parent} does not exist", file=sys.stderr)
            return 1
        page = render_html(left_lines, right_lines, *names, title=f"mhsa diff {args.name}")
        try:
            write_atomically(target, page.encode("utf-8"))
        except OSError as error:
            print(f"mhsa diff: cannot write {target}: {error.strerror or error}", file=sys.stderr)
            return 1
        print(f"wrote {target}: {summary(side_by_side(left_lines, right_lines))}")
        return 0

    rows = side_by_side(left_lines, right_lines)
    width = args.width or terminal_width()
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    try:
        if colour:
            from rich.console import Console

            console = Console(force_terminal=True, width=width, highlight=False, soft_wrap=True,
                              markup=False, emoji=False)
            render_rich(rows, console, width, *names, left_lines, right_lines)
        else:
            sys.stdout.write(render_plain(rows, width, *names))
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader stopped early (`| head`): not an error; keep Python quiet at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0

