"""`mhsa diff`'s alignment, pure and on strings: splitting a file into sections, pairing
sections across two files (torch/flax, and numpy_ref's functions beside torch's methods),
aligning the lines inside a pair, and the words that differ inside a changed line."""

import dataclasses
import textwrap

import pytest

from mhsa.diff.align import (
    Row,
    align,
    changed_ranges,
    pair_sections,
    titles_differ,
)
from mhsa.diff.align import align_files as rows_of
from mhsa.diff.render_text import marker
from mhsa.diff.sections import split_sections
from tests.tools.diff_fixtures import FLAX, NUMPY, TORCH, lines

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
    assert [(s.kind, s.title) for s in sections] == [("preamble", "preamble"), ("def", "def long_signature"), ("step", "1. real")]
    assert sections[1].lines[-1] == '"""'  # the string's last line, at column 0


def test_decorators_and_comments_above_a_definition_belong_to_it():
    source = textwrap.dedent("""\
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
        """)
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
    for title in ("1. project: one matmul makes Q, K and V", "4. mask: no query may see a later key", "6. merge heads"):
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
        numbers = [getattr(row, f"{side}_lineno") for row in rows if row.kind != "section" and getattr(row, side) is not None]
        assert numbers == list(range(1, len(lines(text)) + 1))


def test_a_reworded_step_still_lines_up_and_is_flagged():
    flax = FLAX.replace("# 4. mask: no query may see a later key", "# 4. mask: hide the future")
    rows = rows_of(lines(TORCH), lines(flax))
    header = next(row for row in rows if row.kind == "section" and row.right == "4. mask: hide the future")
    assert header.left == "4. mask: no query may see a later key"
    assert titles_differ(header)
    assert marker(header) == "*"


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
    ranges_left, ranges_right = changed_ranges(left, right)
    marked_left = "".join(left[b:e] for b, e in ranges_left)
    marked_right = "".join(right[b:e] for b, e in ranges_right)
    assert marked_left in ("1", "2") and "0" in marked_right and "3" in marked_right
    assert "transpose" not in marked_left + marked_right and "d_head" not in marked_left + marked_right
    assert changed_ranges("import torch", "x = jnp.zeros((3, 4), dtype=bool)") == ([], [])


# --- numpy_ref beside a framework ------------------------------------------------------------


def test_numpy_functions_pair_their_steps_with_the_torch_method():
    pairs = pair_sections(split_sections(lines(NUMPY)), split_sections(lines(TORCH)))
    steps = [(left.title, right.title) for left, right in pairs if left is not None and right is not None and left.kind == "step"]
    torch_steps = [s.title for s in split_sections(lines(TORCH)) if s.kind == "step"]
    assert len(torch_steps) == 6
    assert steps == [(title, title) for title in torch_steps]  # every step, in order
    # scopes differ (function `attention`, method `MultiHeadSelfAttention.forward`): still paired
    assert {(left.scope, right.scope) for left, right in pairs if left and right and left.kind == "step"} == {
        ("attention", "MultiHeadSelfAttention.forward")
    }
    rows = rows_of(lines(NUMPY), lines(TORCH))
    by_left = {row.left: row for row in rows if row.kind != "section" and row.left}
    assert by_left["    # 5. softmax over keys"].right == "        # 5. softmax over keys"
    assert by_left["    scores = np.where(allowed, scores, -np.inf)"].right == ('        scores = scores.masked_fill(~allowed, float("-inf"))')


def test_a_step_pair_outweighs_the_order_of_definitions():
    # the class first in one file, the function with the steps first in the other: the
    # steps pair (they are what a reader compares), the wrapping class goes one-sided
    numpy = NUMPY + textwrap.dedent("""\


        class MultiHeadSelfAttention:
            def __call__(self, x):
                return attention(x, self.params, self.n_heads)
        """)
    pairs = pair_sections(split_sections(lines(numpy)), split_sections(lines(TORCH)))
    paired = [(left.title, right.title) for left, right in pairs if left and right]
    assert ("6. merge heads", "6. merge heads") in paired
    assert ("1. project: one matmul makes Q, K and V",) * 2 in paired
    assert all(left is None or right is None or left.kind == right.kind for left, right in pairs)
    # each side still reads in file order
    for side in (0, 1):
        starts = [pair[side].start for pair in pairs if pair[side] is not None]
        assert starts == sorted(starts)


def test_pairs_by_key_beat_pairs_by_label_and_one_scope_beats_across():
    from mhsa.diff.align import _weight

    sections = split_sections(lines(TORCH))
    split = next(s for s in sections if s.title == "4. mask: no query may see a later key")
    reworded = dataclasses.replace(split, title="4. mask: hide the future")
    elsewhere = dataclasses.replace(split, scope="count_parameters")
    assert _weight(split, split) > _weight(split, reworded) > _weight(split, elsewhere) > 0
    assert _weight(split, dataclasses.replace(split, title="5. mask: no query may see a later key")) == 0  # another number
    assert _weight(sections[1], sections[2]) == 0  # two different definitions


# --- steps whose functions are named differently ---------------------------------------------

FUNCTION_FIRST = textwrap.dedent("""\
    def check(tokens):
        return tokens


    def forward(tokens, params):
        x = tokens
        # 1. embed: token identity plus position
        x = params["emb"][x]
        # 2. attend
        x = attention(x, params)
        # 3. read out the next token
        return x @ params["head"]


    class TinyLM:
        def check(self, tokens):
            return check(tokens)

        def __call__(self, tokens):
            return forward(tokens, self.params)
    """)

METHOD_LAST = textwrap.dedent("""\
    class TinyLM:
        def check(self, tokens):
            return tokens

        def __call__(self, tokens):
            x = tokens
            # 1. embed: token identity plus position
            x = self.emb(x)
            # 2. attend
            x = self.attn(x)
            # 3. read out the next token
            return self.head(x)
    """)


@pytest.mark.parametrize("flip", [False, True], ids=["function-left", "method-left"])
def test_steps_pair_across_functions_named_differently_and_defined_out_of_order(flip):
    # keeping both file orders, the function's steps would cost the class and its methods
    # their pairs; the steps pair anyway, by number and label
    left, right = (METHOD_LAST, FUNCTION_FIRST) if flip else (FUNCTION_FIRST, METHOD_LAST)
    pairs = pair_sections(split_sections(lines(left)), split_sections(lines(right)))
    paired = [(a.title, b.title) for a, b in pairs if a and b]
    for title in ("1. embed: token identity plus position", "2. attend", "3. read out the next token"):
        assert (title, title) in paired
    assert ("class TinyLM", "class TinyLM") in paired and ("def TinyLM.__call__", "def TinyLM.__call__") in paired
    assert not [s for a, b in pairs if a is None or b is None for s in (a, b) if s is not None and s.kind == "step"]
    # the left column still reads in file order; the pulled-in steps stay in their own order
    starts = [a.start for a, _ in pairs if a is not None]
    assert starts == sorted(starts)
    moved = [b.start for a, b in pairs if a and b and a.kind == "step"]
    assert moved == sorted(moved)


def test_stray_steps_pair_only_by_number_and_label():
    other = METHOD_LAST.replace("# 2. attend", "# 2. mix").replace("# 3. read out the next token", "# 4. read out the next token")
    pairs = pair_sections(split_sections(lines(FUNCTION_FIRST)), split_sections(lines(other)))
    paired = {a.title for a, b in pairs if a and b and a.kind == "step"}
    assert paired == {"1. embed: token identity plus position"}


def test_a_step_of_a_function_with_a_mirror_does_not_go_looking_elsewhere():
    # f and g pair by name in both files; the one step moved from f to g stays one-sided
    left = "def f(x):\n    # 1. one\n    return x\n\n\ndef g(x):\n    return x\n"
    right = "def f(x):\n    return x\n\n\ndef g(x):\n    # 1. one\n    return x\n"
    pairs = pair_sections(split_sections(lines(left)), split_sections(lines(right)))
    assert [(a.title, b.title) for a, b in pairs if a and b] == [("def f", "def f"), ("def g", "def g")]


@pytest.mark.parametrize("left", ["numpy", "torch", "jax"])
def test_the_model_pairs_every_step_of_numpy_forward(left):
    from mhsa import registry
    from mhsa.diff.command import read_lines, repo_root

    right = "numpy" if left != "numpy" else "jax"
    files = [read_lines(repo_root() / registry.get(side).package / "model.py") for side in (left, right)]
    pairs = pair_sections(*map(split_sections, files))
    one_sided = [s.title for a, b in pairs if a is None or b is None for s in (a, b) if s is not None and s.kind == "step"]
    assert one_sided == []
    paired = [(a.title, b.title) for a, b in pairs if a and b and a.kind == "step"]
    for title in ("1. embed: token identity plus learned position", "2. attend", "3. read out the next token"):
        assert (title, title) in paired
