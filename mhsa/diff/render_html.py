"""The rows of `mhsa diff` as one self-contained HTML page: inline CSS (page.css beside this
file, with pygments' token colours), no scripts, no external resources; an index of the
sections with a badge each, then a table of both files with the differing words marked.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from importlib.resources import files
from typing import cast

from mhsa.diff.align import (
    MARKERS,
    align_files,
    changed_ranges,
    pair_sections,
    section_stats,
    summary,
    titles_differ,
)
from mhsa.diff.render_text import folder
from mhsa.diff.sections import Section, split_sections

HTML_STYLE = "default"  # pygments style for the page (light background)


def page_css() -> str:
    """The page's own stylesheet, shipped as package data (pyproject: package-data)."""
    return files("mhsa.diff").joinpath("page.css").read_text(encoding="utf-8")


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


def line_html(pieces: list[tuple[str, str]], marks: Sequence[tuple[int, int]] = ()) -> str:
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


def render_html(
    left_lines: list[str], right_lines: list[str], left_name: str, right_name: str, title: str = "", labels: tuple[str, str] = ("left", "right")
) -> str:
    """One self-contained page: inline CSS, no scripts, no external resources; `labels`
    name the sides in the summary, the legend and the badges ('torch', 'jax')."""
    from pygments.formatters import HtmlFormatter

    rows = align_files(left_lines, right_lines)
    tokens = {"l": tokens_by_line(left_lines), "r": tokens_by_line(right_lines)}
    stats = section_stats(rows)
    # pair_sections never pairs None with None: one side of each pair is a Section
    depths = [_depth(cast(Section, ls or rs)) for ls, rs in pair_sections(split_sections(left_lines), split_sections(right_lines))]
    esc = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title or f'{left_name} vs {right_name}')}</title>",
        "<style>",
        page_css().strip(),
        "\n".join(HtmlFormatter(style=HTML_STYLE).get_token_style_defs("td.code")),
        "</style>",
        "</head>",
        "<body>",
        "<header>",
        f'<h1>{esc(left_name)}<span class="vs">vs</span>{esc(right_name)}</h1>',
        f'<p class="summary">{esc(summary(rows, labels))}</p>',
        '<p class="legend"><span class="same">same</span><span class="changed">changed</span>'
        f'<span class="left-only">{esc(labels[0])} only</span><span class="right-only">{esc(labels[1])} only</span></p>',
        "</header>",
        '<nav><h2>Sections</h2><ol class="index">',
    ]
    for k, ((row, counts), depth) in enumerate(zip(stats, depths), 1):
        label = row.left if row.left is not None else row.right or ""  # a header row has a title on one side at least
        if row.left is not None and row.right is not None and row.left != row.right:
            label = f"{row.left} / {row.right}"
        if row.right is None:
            badge = ("left-only", f"{esc(labels[0])} only")
        elif row.left is None:
            badge = ("right-only", f"{esc(labels[1])} only")
        else:
            differing = counts["changed"] + counts["left-only"] + counts["right-only"]
            differing += titles_differ(row)
            badge = ("differs", f"{differing} differ") if differing else ("same", "same")
        out.append(f'<li class="depth-{min(depth, 2)}"><a href="#s{k}">{esc(label)}</a><span class="badge {badge[0]}">{badge[1]}</span></li>')
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
            for side, text, missing in (("l", row.left, folder(left_name)), ("r", row.right, folder(right_name))):
                if text is None:
                    cells.append(f'<td colspan="2" class="{side} missing">(not in {esc(missing)})</td>')
                else:
                    cells.append(f'<td colspan="2" class="{side}">{esc(text)}</td>')
            differs = " differs" if titles_differ(row) else ""
            mark = MARKERS["changed"] if differs else ""
            out.append(f'<tr class="section{differs}" id="s{k}">{cells[0]}<td class="mark">{mark}</td>{cells[1]}</tr>')
            continue
        mark = "" if row.kind == "same" else MARKERS[row.kind]
        # a line row has a line number wherever it has text, and a 'changed' row has both texts
        changed = row.kind == "changed" and row.left is not None and row.right is not None
        marks = changed_ranges(row.left or "", row.right or "") if changed else ([], [])
        left = line_html(tokens["l"][row.left_lineno - 1], marks[0]) if row.left is not None and row.left_lineno is not None else ""
        right = line_html(tokens["r"][row.right_lineno - 1], marks[1]) if row.right is not None and row.right_lineno is not None else ""
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
