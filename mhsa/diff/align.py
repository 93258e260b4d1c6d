"""Pair two files' sections and align the lines inside each pair: the rows every
renderer draws. Pure: lines in, rows out.

Sections (see sections.py) are paired by their key (the comment text, or the class/function
name, with torch `forward` and flax `__call__` counted as the same method), in order; what is
left is paired more loosely (a reworded step comment, then a step of the same number and
label in another function, so numpy_ref's `attention` lines up with torch's `forward`); the
steps still one-sided after that pair across functions defined in another order (numpy_ref's
`forward` and flax's `TinyLM.__call__`); inside a pair the lines are aligned with difflib.
"""

from __future__ import annotations

import difflib
import re
from typing import NamedTuple

from mhsa.diff.sections import Section, normal_scope, split_sections

KINDS = ("same", "changed", "left-only", "right-only", "section")
MARKERS = {"same": "|", "changed": "*", "left-only": "<", "right-only": ">", "section": "="}
MAX_PAIRING = 4000  # replaced blocks up to this many line pairs are paired by similarity
WORD_RE = re.compile(r"\w+|\s+|[^\w\s]")


class Row(NamedTuple):
    """One aligned row. kind 'section' is a header row whose texts are the section titles
    (None where the section exists on one side only) and whose numbers are first lines."""

    left: str | None
    right: str | None
    left_lineno: int | None
    right_lineno: int | None
    kind: str


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
            rows += [Row(left[i], right[j], left_start + i, right_start + j, "same") for i, j in zip(range(i1, i2), range(j1, j2))]
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
        ratio = [[difflib.SequenceMatcher(None, a[i1 + i], b[j1 + j], autojunk=False).ratio() for j in range(m)] for i in range(n)]
        best = [[0.0] * (m + 1) for _ in range(n + 1)]  # best[i][j]: first i against first j
        for i in range(1, n + 1):
            for j in range(1, m + 1):
                best[i][j] = max(best[i - 1][j - 1] + ratio[i - 1][j - 1] + 1e-9, best[i - 1][j], best[i][j - 1])
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
    """Pair sections in order, each side keeping its file order; unpaired ones are paired
    with None. Two sections may pair when their keys are equal, or when both are steps with
    the same number and label (`4. mask: ...`, the words before the colon): in the same scope
    (a reworded comment still lines its code up) or in another one (a step of numpy_ref's
    function `attention` and the same step of torch's method `forward`). The pairing with
    the most pairs wins (so a function's steps pair even where the two files order their
    definitions differently); among those, pairs by key beat pairs by label, and pairs in
    one scope beat pairs across scopes. Steps that in-order pairing leaves one-sided then pair
    across functions out of order (see _pair_stray_steps): only the left side is sure to keep
    its file order."""
    n, m = len(left), len(right)
    # a pair is worth `pair` plus its preference: one more pair outweighs all preferences
    pair = 4 * (n + m + 1)
    weight = [[pair + w if (w := _weight(a, b)) else 0 for b in right] for a in left]
    # best[i][j]: the most weight left[i:] and right[j:] can pair
    best = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            best[i][j] = max(best[i + 1][j], best[i][j + 1], best[i + 1][j + 1] + weight[i][j] if weight[i][j] else 0)
    pairs: list[tuple[Section | None, Section | None]] = []
    i = j = 0
    skipped_left: list[Section] = []
    skipped_right: list[Section] = []
    while i < n or j < m:
        if i < n and j < m and weight[i][j] and best[i][j] == best[i + 1][j + 1] + weight[i][j]:
            # the sections each side skipped since the last pair: left ones first
            pairs += [(s, None) for s in skipped_left] + [(None, s) for s in skipped_right]
            skipped_left, skipped_right = [], []
            pairs.append((left[i], right[j]))
            i, j = i + 1, j + 1
        elif i < n and best[i][j] == best[i + 1][j]:
            skipped_left.append(left[i])
            i += 1
        else:
            skipped_right.append(right[j])
            j += 1
    pairs += [(s, None) for s in skipped_left] + [(None, s) for s in skipped_right]
    return _pair_stray_steps(pairs)


def _pair_stray_steps(pairs: list[tuple[Section | None, Section | None]]) -> list[tuple[Section | None, Section | None]]:
    """Pair the steps still one-sided across functions the in-order pairing could not line
    up: numpy_ref's function `forward` holds the steps that flax writes in `TinyLM.__call__`,
    defined after other sections both files share, so keeping both file orders leaves them
    apart. Steps pair by number and label, one enclosing function with one (the pair of
    functions sharing the most labels first), and only where one of the two functions has
    no mirror by name, so two functions that do mirror each other keep their own steps.
    Each such pair sits where its left step is: the left column keeps its file order."""
    paired_defs = {normal_scope(s.scope) for a, b in pairs if a and b for s in (a, b) if s.kind == "def"}

    def strays(side: int) -> dict[str, list[tuple[int, Section]]]:
        groups: dict[str, list[tuple[int, Section]]] = {}
        for index, pair in enumerate(pairs):
            section, other = pair[side], pair[1 - side]
            if other is None and section is not None and _step_label(section) is not None:
                groups.setdefault(section.scope, []).append((index, section))
        return groups

    lefts, rights = strays(0), strays(1)
    candidates = []
    for left_scope, left_steps in lefts.items():
        for right_scope, right_steps in rights.items():
            if normal_scope(left_scope) in paired_defs and normal_scope(right_scope) in paired_defs:
                continue
            labels = {_step_label(s) for _, s in right_steps}
            shared = sum(1 for _, s in left_steps if _step_label(s) in labels)
            if shared:
                candidates.append((-shared, left_scope, right_scope))
    moved: dict[int, Section] = {}  # left step's index -> the right step that joins it
    taken: set[int] = set()  # indexes of right steps that moved
    used_left: set[str] = set()
    used_right: set[str] = set()
    for _, left_scope, right_scope in sorted(candidates, key=lambda c: c[0]):
        if left_scope in used_left or right_scope in used_right:
            continue
        used_left.add(left_scope)
        used_right.add(right_scope)
        free = list(rights[right_scope])
        for index, section in lefts[left_scope]:
            match = next((k for k, (_, other) in enumerate(free) if _step_label(other) == _step_label(section)), None)
            if match is not None:
                right_index, other = free.pop(match)
                moved[index] = other
                taken.add(right_index)
    if not moved:
        return pairs
    return [(a, moved[k]) if k in moved else (a, b) for k, (a, b) in enumerate(pairs) if k not in taken]


def _weight(a: Section, b: Section) -> int:
    """How much pairing a with b is worth (0: they may not pair): by key 3, steps with the
    same number and label 2 in one scope, 1 across scopes."""
    if a.key == b.key:
        return 3
    label_a, label_b = _step_label(a), _step_label(b)
    if label_a is None or label_a != label_b:
        return 0
    return 2 if normal_scope(a.scope) == normal_scope(b.scope) else 1


def _step_label(section: Section) -> tuple[str, str] | None:
    """('4', 'mask') for a step titled '4. mask: no query may see a later key'."""
    match = re.match(r"(\d+)\.\s+([^:]*)", section.title) if section.kind == "step" else None
    return (match.group(1), match.group(2).strip()) if match else None


def titles_differ(row: Row) -> bool:
    """A header row whose two titles are worded differently (torch forward = flax __call__)."""
    if row.left is None or row.right is None:
        return False
    return _normal_title(row.left) != _normal_title(row.right)


def _normal_title(title: str) -> str:
    return f"{title[: -len('.forward')]}.__call__" if title.startswith("def ") and title.endswith(".forward") else title


def align_files(left_lines: list[str], right_lines: list[str]) -> list[Row]:
    """Every row of the view: per section pair a 'section' header row, then its lines."""
    rows: list[Row] = []
    for ls, rs in pair_sections(split_sections(left_lines), split_sections(right_lines)):
        rows.append(Row(ls.title if ls else None, rs.title if rs else None, ls.start if ls else None, rs.start if rs else None, "section"))
        rows += align(ls.lines if ls else [], rs.lines if rs else [], ls.start if ls else 1, rs.start if rs else 1)
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


def summary(rows: list[Row], labels: tuple[str, str] = ("left", "right")) -> str:
    """One line: how many sections paired, and how many lines of each kind; `labels` name
    the two sides ('torch', 'jax')."""
    stats = section_stats(rows)
    paired = sum(1 for row, _ in stats if row.left is not None and row.right is not None)
    counts = dict.fromkeys(KINDS[:4], 0)
    for row in rows:
        if row.kind != "section":
            counts[row.kind] += 1
    return (
        f"{len(stats)} sections ({paired} paired, {len(stats) - paired} one-sided); lines: "
        f"{counts['same']} same, {counts['changed']} changed, "
        f"{counts['left-only']} {labels[0]} only, {counts['right-only']} {labels[1]} only"
    )


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
