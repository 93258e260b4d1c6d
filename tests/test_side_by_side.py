"""`mhsa diff`: splitting into sections, pairing, line alignment, and the three renderings,
on a torch/flax fixture pair written here (plus a smoke run over the real files if present)."""

import html
import re
import textwrap
from io import StringIO
from pathlib import Path

import pytest

from shared.tools import cli, side_by_side
from shared.tools.side_by_side import Row, align, pair_sections, side_by_side as rows_of, split_sections

TORCH = textwrap.dedent('''\
    """Causal self-attention, in PyTorch."""

    from __future__ import annotations

    import math

    import torch
    from torch import nn


    class MultiHeadSelfAttention(nn.Module):
        """(B, T, D) -> (B, T, D)."""

        def __init__(self, d_model, n_heads, max_len, bias=True):
            super().__init__()
            self.n_heads = n_heads
            self.d_head = d_model // n_heads
            self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
            self.out_proj = nn.Linear(d_model, d_model, bias=bias)
            self.register_buffer("causal_mask", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)), persistent=False)

        def forward(self, x, mask=None, return_weights=False):
            B, T, D = x.shape

            # 1. project: one matmul makes Q, K and V
            qkv = self.qkv_proj(x)  # (B, T, 3D)

            # 2. split
            q, k, v = qkv.split(D, dim=-1)  # 3 x (B, T, D)
            q = q.reshape(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)
            k = k.reshape(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)
            v = v.reshape(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)

            # 3. score and scale
            scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(self.d_head))  # (B, H, T, T)

            # 4. mask: no query may see a later key
            allowed = self.causal_mask[:T, :T]  # (T, T)
            scores = scores.masked_fill(~allowed, float("-inf"))

            # 5. softmax over keys
            weights = torch.softmax(scores, dim=-1)  # (B, H, T, T)

            # 6. merge heads
            merged = (weights @ v).transpose(1, 2).reshape(B, T, D)  # (B, T, D)
            out = self.out_proj(merged)  # (B, T, D)
            return (out, weights) if return_weights else out


    def count_parameters(module):
        return sum(p.numel() for p in module.parameters())


    if __name__ == "__main__":
        print(count_parameters(MultiHeadSelfAttention(32, 4, 12)))
    ''')

FLAX = textwrap.dedent('''\
    """Causal self-attention, in JAX with Flax NNX."""

    from __future__ import annotations

    import math

    import jax
    import jax.numpy as jnp
    from flax import nnx


    class CausalMask(nnx.Variable):
        """Not a parameter: never differentiated, never saved."""


    class MultiHeadSelfAttention(nnx.Module):
        """(B, T, D) -> (B, T, D)."""

        def __init__(self, d_model, n_heads, max_len, bias=True, *, rngs: nnx.Rngs):
            self.n_heads = n_heads
            self.d_head = d_model // n_heads
            self.qkv_proj = nnx.Linear(d_model, 3 * d_model, use_bias=bias, rngs=rngs)
            self.out_proj = nnx.Linear(d_model, d_model, use_bias=bias, rngs=rngs)
            self.causal_mask = CausalMask(jnp.tril(jnp.ones((max_len, max_len), dtype=bool)))

        def __call__(self, x, mask=None, return_weights=False):
            B, T, D = x.shape

            # 1. project: one matmul makes Q, K and V
            qkv = self.qkv_proj(x)  # (B, T, 3D)

            # 2. split
            q, k, v = jnp.split(qkv, 3, axis=-1)  # 3 x (B, T, D)
            q = q.reshape(B, T, self.n_heads, self.d_head).transpose(0, 2, 1, 3)  # (B, H, T, d_head)
            k = k.reshape(B, T, self.n_heads, self.d_head).transpose(0, 2, 1, 3)  # (B, H, T, d_head)
            v = v.reshape(B, T, self.n_heads, self.d_head).transpose(0, 2, 1, 3)  # (B, H, T, d_head)

            # 3. score and scale
            scores = q @ k.swapaxes(-2, -1) * (1.0 / math.sqrt(self.d_head))  # (B, H, T, T)

            # 4. mask: no query may see a later key
            allowed = self.causal_mask[:T, :T]  # (T, T)
            scores = jnp.where(allowed, scores, -jnp.inf)

            # 5. softmax over keys
            weights = jax.nn.softmax(scores, axis=-1)  # (B, H, T, T)

            # 6. merge heads
            merged = (weights @ v).transpose(0, 2, 1, 3).reshape(B, T, D)  # (B, T, D)
            out = self.out_proj(merged)  # (B, T, D)
            return (out, weights) if return_weights else out


    def count_parameters(module):
        return sum(p.size for p in jax.tree.leaves(nnx.state(module, nnx.Param)))


    if __name__ == "__main__":
        print(count_parameters(MultiHeadSelfAttention(32, 4, 12, rngs=nnx.Rngs(0))))
    ''')

ANSI = re.compile(r"\x1b\[")


def lines(text):
    return text.splitlines()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A fake checkout holding the fixture pair as attention.py; `mhsa diff` reads it."""
    for folder, text in (("torch_impl", TORCH), ("jax_impl", FLAX)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "attention.py").write_text(text)
    monkeypatch.setattr(side_by_side, "repo_root", lambda: tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)
    return tmp_path


# --- splitting ---------------------------------------------------------------------------


def test_split_finds_definitions_and_numbered_steps():
    sections = split_sections(lines(TORCH))
    assert [(s.kind, s.title) for s in sections] == [
        ("preamble", "preamble"),
        ("def", "class MultiHeadSelfAttention"),
        ("def", "def MultiHeadSelfAttention.__init__"),
        ("def", "def MultiHeadSelfAttention.forward"),
        ("step", "1. project: one matmul makes Q, K and V"),
        ("step", "2. split"),
        ("step", "3. score and scale"),
        ("step", "4. mask: no query may see a later key"),
        ("step", "5. softmax over keys"),
        ("step", "6. merge heads"),
        ("def", "def count_parameters"),
        ("code", 'if __name__ == "__main__":'),
    ]
    assert {s.scope for s in sections if s.kind == "step"} == {"MultiHeadSelfAttention.forward"}


@pytest.mark.parametrize("text", [TORCH, FLAX])
def test_every_line_lands_in_exactly_one_section_in_order(text):
    sections = split_sections(lines(text))
    assert [line for s in sections for line in s.lines] == lines(text)
    starts = [s.start for s in sections]
    assert starts == [1] + [s.start + len(s.lines) for s in sections[:-1]]


def test_strings_and_continuation_lines_are_not_boundaries():
    source = textwrap.dedent('''\
        """Module docstring.

        # 1. not a section: this is inside a string
        class NotAClass:
        """


        def long_signature(
            a,
            b,
        ):
            text = """
        def not_a_function():
        # 2. not a section either
        """
            # 1. real
            return a + b
        ''')
    sections = split_sections(lines(source))
    assert [(s.kind, s.title) for s in sections] == [
        ("preamble", "preamble"), ("def", "def long_signature"), ("step", "1. real")]
    assert sections[1].lines[-1] == '"""'  # the string's last line, at column 0


def test_decorators_and_comments_above_a_definition_belong_to_it():
    source = textwrap.dedent('''\
        import functools

        # compiled once per shape
        @functools.lru_cache
        def step(x):
            # 1. cached
            return x


        class Box:
            @property
            def size(self):
                return 1
        ''')
    sections = split_sections(lines(source))
    assert [(s.kind, s.title, s.start) for s in sections] == [
        ("preamble", "preamble", 1),
        ("def", "def step", 3),
        ("step", "1. cached", 6),
        ("def", "class Box", 10),
        ("def", "def Box.size", 11),
    ]
    assert sections[1].lines == ["# compiled once per shape", "@functools.lru_cache", "def step(x):"]


# --- pairing and aligning --------------------------------------------------------------------


def test_sections_pair_by_comment_text_and_forward_pairs_with_call():
    pairs = pair_sections(split_sections(lines(TORCH)), split_sections(lines(FLAX)))
    titles = [(left and left.title, right and right.title) for left, right in pairs]
    assert ("def MultiHeadSelfAttention.forward", "def MultiHeadSelfAttention.__call__") in titles
    assert (None, "class CausalMask") in titles  # only in the flax file: against an empty column
    for title in ("1. project: one matmul makes Q, K and V", "4. mask: no query may see a later key",
                  "6. merge heads"):
        assert (title, title) in titles
    assert all(left is None or right is None or left.key == right.key for left, right in pairs)


def test_align_marks_same_changed_and_one_sided_lines():
    left = ["a = 1", "b = torch.zeros(3)", "c = a + b", "return c"]
    right = ["a = 1", "b = jnp.zeros(3)", "c = a + b", "c = c.block_until_ready()", "return c"]
    assert align(left, right, left_start=10, right_start=20) == [
        Row("a = 1", "a = 1", 10, 20, "same"),
        Row("b = torch.zeros(3)", "b = jnp.zeros(3)", 11, 21, "changed"),
        Row("c = a + b", "c = a + b", 12, 22, "same"),
        Row(None, "c = c.block_until_ready()", None, 23, "right-only"),
        Row("return c", "return c", 13, 24, "same"),
    ]
    assert [row.kind for row in align(["x", "gone"], ["x"])] == ["same", "left-only"]


def test_replaced_block_pairs_the_most_similar_lines():
    left = ["    if tokens.numel() == 0:"]
    right = ["    # jax needs a comment here", "    if tokens.size == 0:"]
    assert [(row.left, row.right, row.kind) for row in align(left, right)] == [
        (None, "    # jax needs a comment here", "right-only"),
        ("    if tokens.numel() == 0:", "    if tokens.size == 0:", "changed"),
    ]


def test_identical_files_are_all_same():
    rows = rows_of(lines(TORCH), lines(TORCH))
    assert {row.kind for row in rows} == {"same", "section"}
    assert all(row.left == row.right for row in rows)


def test_fixture_rows():
    rows = rows_of(lines(TORCH), lines(FLAX))
    by_left = {row.left: row for row in rows if row.kind != "section" and row.left}
    assert by_left["        qkv = self.qkv_proj(x)  # (B, T, 3D)"].kind == "same"
    renamed = by_left["    def forward(self, x, mask=None, return_weights=False):"]
    assert (renamed.kind, renamed.right) == ("changed", "    def __call__(self, x, mask=None, return_weights=False):")
    assert by_left["        super().__init__()"].kind == "left-only"
    # nothing is lost: each side's rows are that whole file, in order
    for side, text in (("left", TORCH), ("right", FLAX)):
        numbers = [getattr(row, f"{side}_lineno") for row in rows
                   if row.kind != "section" and getattr(row, side) is not None]
        assert numbers == list(range(1, len(lines(text)) + 1))


def test_a_reworded_step_still_lines_up_and_is_flagged():
    flax = FLAX.replace("# 4. mask: no query may see a later key", "# 4. mask: hide the future")
    rows = rows_of(lines(TORCH), lines(flax))
    header = next(row for row in rows if row.kind == "section" and row.right == "4. mask: hide the future")
    assert header.left == "4. mask: no query may see a later key"
    assert side_by_side.titles_differ(header)
    assert side_by_side.marker(header) == "*"


def test_a_step_in_one_file_only_is_shown_against_nothing():
    flax = FLAX.replace("        # 5. softmax over keys\n", "")
    assert flax != FLAX
    rows = rows_of(lines(TORCH), lines(flax))
    header = next(row for row in rows if row.kind == "section" and row.left == "5. softmax over keys")
    assert header.right is None
    start = rows.index(header)
    comment = rows[start + 1]
    assert (comment.left.strip(), comment.right, comment.kind) == ("# 5. softmax over keys", None, "left-only")


def test_changed_lines_mark_the_words_that_differ():
    left, right = "x.transpose(1, 2)  # (B, H, T, d_head)", "x.transpose(0, 2, 1, 3)  # (B, H, T, d_head)"
    ranges_left, ranges_right = side_by_side.changed_ranges(left, right)
    marked_left = "".join(left[b:e] for b, e in ranges_left)
    marked_right = "".join(right[b:e] for b, e in ranges_right)
    assert marked_left in ("1", "2") and "0" in marked_right and "3" in marked_right
    assert "transpose" not in marked_left + marked_right and "d_head" not in marked_left + marked_right
    assert side_by_side.changed_ranges("import torch", "x = jnp.zeros((3, 4), dtype=bool)") == ([], [])
    html_line = side_by_side.line_html([("n", "x"), ("", ".transpose(1, 2)")], [(12, 13)])
    assert html_line == '<span class="n">x</span>.transpose(<mark>1</mark>, 2)'


# --- rendering -------------------------------------------------------------------------------


def test_wrap_keeps_every_character_and_marks_the_cut():
    text = "x = some_function(argument_one, argument_two, argument_three)  # (B, H, T, d_head)"
    pieces = side_by_side.wrap(text, 20)
    assert "".join(text[p.begin:p.end] for p in pieces) == text
    assert [p.more for p in pieces] == [True] * (len(pieces) - 1) + [False]
    assert all(side_by_side.cell_width(text[p.begin:p.end]) + p.more <= 20 for p in pieces)
    assert side_by_side.wrap("", 20) == [side_by_side.Piece(0, 0, False)]


def test_plain_output_when_piped(repo, capsys):
    assert cli.main(["diff", "attention", "--width", "100"]) == 0
    out = capsys.readouterr().out
    assert not ANSI.search(out)
    text_lines = out.splitlines()
    assert all(len(line) <= 100 for line in text_lines)
    assert "torch_impl/attention.py" in text_lines[0] and "jax_impl/attention.py" in text_lines[0]
    assert any(re.search(r"## 1\. project: one matmul makes Q, K and V +=", line) for line in text_lines)
    assert any(re.search(r"## \(not in torch_impl\) += +## class CausalMask", line) for line in text_lines)
    markers = {line[side_by_side.columns([], 100)[0] + 1 + side_by_side.columns([], 100)[1] + 1]
               for line in text_lines[1:-2] if line.strip()}
    assert markers == {"|", "*", "<", ">", "="}
    assert "…" in out  # the long register_buffer line is wrapped visibly, not dropped
    assert "persistent=False)" in out
    assert "sections" in text_lines[-1] and "changed" in text_lines[-1]


def test_colour_on_a_terminal():
    from rich.console import Console

    rows = rows_of(lines(TORCH), lines(FLAX))
    buffer = StringIO()
    console = Console(file=buffer, force_terminal=True, color_system="truecolor", width=140)
    side_by_side.render_rich(rows, console, 140, "torch_impl/attention.py", "jax_impl/attention.py",
                             lines(TORCH), lines(FLAX))
    out = buffer.getvalue()
    assert ANSI.search(out)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert "def __call__(self, x, mask=None, return_weights=False):" in plain
    assert "48;2;61;53;0" in out  # the background of a changed line
    assert max(len(line) for line in plain.splitlines()) <= 140


def test_html_page_is_self_contained_with_an_index(repo, tmp_path, capsys):
    target = tmp_path / "out" / "page.html"
    target.parent.mkdir()
    assert cli.main(["diff", "--html", str(target)]) == 0
    assert "wrote" in capsys.readouterr().out
    page = target.read_text()
    assert [p.name for p in target.parent.iterdir()] == ["page.html"]  # no temporary left behind
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for external in ("http://", "https://", "src=", "<link", "@import", "url(", "<script"):
        assert external not in page
    assert "<style>" in page
    for left, right in ((left, right) for left, right in pair_sections(
            split_sections(lines(TORCH)), split_sections(lines(FLAX)))):
        title = (left or right).title
        assert re.search(rf'<a href="#s\d+">[^<]*{re.escape(html.escape(title))}', page), title
    anchors = re.findall(r'<a href="#(s\d+)">', page)
    assert anchors and all(f'id="{a}"' in page for a in anchors)
    assert '<tr class="changed">' in page and '<tr class="right-only">' in page
    assert '<span class="n">jnp</span></mark>' in page or "<mark>jnp</mark>" in page
    assert '<td class="ln l">21</td>' in page  # line numbers
    assert 'class="k"' in page  # pygments token classes, styled by the embedded stylesheet
    assert "td.code .k {" in page


def test_unknown_name_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["diff", "atention"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'atention'" in err
    for name in ("attention", "model", "train"):
        assert name in err


def test_missing_file_is_a_clear_error(repo, capsys):
    (repo / "jax_impl" / "attention.py").unlink()
    assert cli.main(["diff", "attention"]) == 1
    err = capsys.readouterr().err
    assert "jax_impl/attention.py not found" in err
    assert cli.main(["diff", "model"]) == 1
    assert "torch_impl/model.py and jax_impl/model.py not found" in capsys.readouterr().err


def test_too_narrow_width_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["diff", "--width", "10"])
    assert exit_info.value.code == 2
    assert "expected a width of at least 40" in capsys.readouterr().err


@pytest.mark.parametrize("name", side_by_side.NAMES)
def test_the_real_files_render(name, capsys):
    root = Path(side_by_side.repo_root())
    if not all((root / folder / f"{name}.py").exists() for folder in ("torch_impl", "jax_impl")):
        pytest.skip(f"torch_impl/{name}.py or jax_impl/{name}.py not written yet")
    assert cli.main(["diff", name, "--width", "160", "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert not ANSI.search(out) and "sections" in out.splitlines()[-1]
    page = side_by_side.render_html(side_by_side.read_lines(root / "torch_impl" / f"{name}.py"),
                                    side_by_side.read_lines(root / "jax_impl" / f"{name}.py"), "a", "b")
    assert "https://" not in page and "src=" not in page


def test_html_that_cannot_be_written_is_a_clear_error(repo, tmp_path, capsys):
    folder = tmp_path / "pages"
    folder.mkdir()
    assert cli.main(["diff", "--html", str(folder)]) == 1  # a folder, not a file
    assert "cannot write" in capsys.readouterr().err
    assert list(folder.iterdir()) == [] and not list(tmp_path.glob(".*.tmp"))
    assert cli.main(["diff", "--html", str(tmp_path / "missing" / "page.html")]) == 1
    assert "does not exist" in capsys.readouterr().err
