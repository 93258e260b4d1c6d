"""`mhsa diff`'s renderers on rows made from the fixture pair: wrapping (never inside a
name, continuation lines marked), plain text, terminal colour, and HTML pieces."""

import re
from io import StringIO

import pytest

from mhsa.diff import render_html, render_rich, render_text
from mhsa.diff.align import align_files as rows_of
from mhsa.diff.render_text import CONTINUED, Piece, cell_width, wrap
from tests.tools.diff_fixtures import ANSI, FLAX, TORCH, lines

NAMES = ("torch_impl/attention.py", "jax_impl/attention.py")
LABELS = ("pytorch", "flax")  # what the summary, the legend and the badges call the sides


def test_wrap_keeps_every_character_and_marks_the_cut():
    text = "x = some_function(argument_one, argument_two, argument_three)  # (B, H, T, d_head)"
    pieces = wrap(text, 20)
    assert "".join(text[p.begin : p.end] for p in pieces) == text
    assert [p.more for p in pieces] == [True] * (len(pieces) - 1) + [False]
    # every screen line fits, its continuation mark included
    assert all(cell_width(p.lead + text[p.begin : p.end]) <= 20 for p in pieces)
    assert [p.lead.endswith(CONTINUED) for p in pieces] == [False] + [True] * (len(pieces) - 1)
    assert wrap("", 20) == [Piece(0, 0, False)]


IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


@pytest.mark.parametrize("width", [12, 17, 20, 23, 31, 40])
@pytest.mark.parametrize(
    "text",
    [
        "x = some_function(argument_one, argument_two, argument_three)  # (B, H, T, d_head)",
        "        weights = weights.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)",
        "        q = q * (1.0 / math.sqrt(self.d_head))  # scaling Q is T / d_head times cheaper than scaling the scores",
        'self.register_buffer("causal_mask",torch.tril(torch.ones(max_len,max_len,dtype=torch.bool)),persistent=False)',
    ],
)
def test_wrapping_never_splits_an_identifier(text, width):
    pieces = wrap(text, width)
    assert "".join(text[p.begin : p.end] for p in pieces) == text
    assert len(pieces) > 1
    cuts = {p.end for p in pieces[:-1]}
    for match in IDENTIFIER.finditer(text):
        if cell_width(match.group()) <= width // 2 - 2:  # fits any continuation line
            inside = {k for k in cuts if match.start() < k < match.end()}
            assert not inside, f"{match.group()!r} cut at {sorted(inside)} (width {width})"


def test_a_name_wider_than_the_column_is_still_cut_and_kept():
    text = "x = " + "a_very_long_identifier_name" * 2
    pieces = wrap(text, 16)
    assert "".join(text[p.begin : p.end] for p in pieces) == text
    assert all(cell_width(p.lead + text[p.begin : p.end]) <= 16 for p in pieces)


def test_continuation_lines_are_marked_and_hang_at_the_indent():
    rows = rows_of(lines(TORCH), lines(FLAX))
    out = render_text.render_plain(rows, 100, *NAMES, labels=LABELS)
    nw, cw = render_text.columns(rows, 100)
    line = next(line for line in out.splitlines() if "self.register_buffer(" in line)
    after = out.splitlines()[out.splitlines().index(line) + 1]
    assert after[:nw].strip() == ""  # no line number on a continuation
    assert after[nw + 1 :].lstrip().startswith(CONTINUED)
    indent = len(line[nw + 1 :]) - len(line[nw + 1 :].lstrip())
    assert after[nw + 1 :].index(CONTINUED) == indent  # hangs where the code starts
    assert "…" not in out  # nothing reads as cut off
    assert re.search(r"\d+ pytorch only, \d+ flax only$", out.splitlines()[-1])  # the labels name the sides


def test_colour_on_a_terminal():
    from rich.console import Console

    rows = rows_of(lines(TORCH), lines(FLAX))
    buffer = StringIO()
    console = Console(file=buffer, force_terminal=True, color_system="truecolor", width=140)
    render_rich.render_rich(rows, console, 140, "torch_impl/attention.py", "jax_impl/attention.py", lines(TORCH), lines(FLAX))
    out = buffer.getvalue()
    assert ANSI.search(out)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert "def __call__(self, x, mask=None, return_weights=False):" in plain
    assert "48;2;61;53;0" in out  # the background of a changed line
    assert max(len(line) for line in plain.splitlines()) <= 140


def test_colour_wraps_like_plain_text():
    from rich.console import Console

    rows = rows_of(lines(TORCH), lines(FLAX))
    buffer = StringIO()
    console = Console(file=buffer, force_terminal=True, color_system="truecolor", width=100)
    render_rich.render_rich(rows, console, 100, *NAMES, lines(TORCH), lines(FLAX), labels=LABELS)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", buffer.getvalue())
    text = render_text.render_plain(rows, 100, *NAMES, labels=LABELS)
    strip = [line.rstrip().replace("│", "|") for line in plain.splitlines()]
    assert strip == text.splitlines()  # the same screen lines, colour aside


def test_html_line_marks_the_differing_characters():
    html_line = render_html.line_html([("n", "x"), ("", ".transpose(1, 2)")], [(12, 13)])
    assert html_line == '<span class="n">x</span>.transpose(<mark>1</mark>, 2)'


def test_html_page_names_the_sides_by_their_labels():
    page = render_html.render_html(lines(TORCH), lines(FLAX), *NAMES, labels=LABELS)
    assert '<span class="left-only">pytorch only</span><span class="right-only">flax only</span>' in page
    assert "(not in torch_impl)" in page
    assert "tr.gap td { height: 10px; }" in page  # page.css, read as package data
