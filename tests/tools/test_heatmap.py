"""The text heatmap: labels, the blank causal triangle, the shading, the legend, refusals."""

import numpy as np
import pytest

from mhsa.heatmap import LEGEND, NAN, RAMP, ascii_heads, ascii_heatmap
from tests.samples import causal_weights


def grid_rows(text):
    """The cell strings between the borders, one per query row."""
    return [line.split("|")[1] for line in text.splitlines() if line.count("|") == 2]


def test_labels_and_token_ids_appear():
    tokens = [7, 3, 9, 41, 2]
    text = ascii_heatmap(causal_weights(1, 5, seed=0)[0], tokens=tokens, title="head 0")
    lines = text.splitlines()
    assert lines[0] == "head 0"
    key_line = next(line for line in lines if line.lstrip().startswith("key"))
    assert key_line.split()[1:] == ["0", "1", "2", "3", "4"]
    token_line = next(line for line in lines if line.lstrip().startswith("token"))
    assert token_line.split()[1:] == ["7", "3", "9", "41", "2"]
    assert any(line.split()[:2] == ["query", "token"] for line in lines)
    rows = [line for line in lines if line.count("|") == 2]
    assert [row.split("|")[0].split() for row in rows] == [[str(i), str(t)] for i, t in enumerate(tokens)]


def test_without_tokens_rows_carry_positions_only():
    text = ascii_heatmap(causal_weights(1, 5, seed=1)[0])
    rows = [line for line in text.splitlines() if line.count("|") == 2]
    assert [row.split("|")[0].split() for row in rows] == [[str(i)] for i in range(5)]
    assert "token" not in text


@pytest.mark.parametrize("T", [1, 5, 12])
def test_every_above_diagonal_cell_is_blank_and_every_allowed_cell_is_not(T):
    weights = causal_weights(1, T, seed=T)[0]
    rows = grid_rows(ascii_heatmap(weights, tokens=list(range(100, 100 + T))))
    assert len(rows) == T
    width = len(rows[0]) // T
    assert width >= 2  # at least two characters per cell: roughly square
    for i, row in enumerate(rows):
        cells = [row[j * width : (j + 1) * width] for j in range(T)]
        for j, cell in enumerate(cells):
            assert len(set(cell)) == 1  # one shade fills the cell
            if j > i:
                assert cell == " " * width, (i, j)
            else:
                assert cell[0] != " ", (i, j)  # softmax weights are > 0 where allowed


def test_one_hot_identity_diagonal_is_darkest_and_the_rest_blank():
    rows = grid_rows(ascii_heatmap(np.eye(4)))
    for i, row in enumerate(rows):
        assert row == "  " * i + RAMP[-1] * 2 + "  " * (3 - i)


def test_shades_grow_with_the_weight():
    weights = np.tril(np.ones((4, 4))) * np.array([1e-9, 0.3, 0.6, 1.0])[:, None]
    rows = grid_rows(ascii_heatmap(weights))
    shades = [RAMP.index(row[0]) for row in rows]
    assert shades[0] == 1  # a tiny but non-zero weight is still visible
    assert shades == sorted(shades) and shades[-1] == len(RAMP) - 1


def test_the_legend_is_one_line_at_the_end_and_names_the_shades_the_cells_use():
    text = ascii_heatmap(np.eye(3))
    assert text.splitlines()[-1] == LEGEND
    assert LEGEND.startswith(f"shade: '{RAMP[0]}' = 0") and f"{' '.join(RAMP[1:])} = 1, one step per 1/{len(RAMP) - 1};" in LEGEND
    assert LEGEND.endswith(f"'{NAN}' = NaN")


def test_nan_renders_as_question_marks():
    weights = causal_weights(1, 4, seed=2)[0]
    weights[2, 1] = np.nan
    rows = grid_rows(ascii_heatmap(weights))
    assert rows[2][2:4] == "??"


def test_heads_titles_and_one_legend():
    weights = causal_weights(3, 5, seed=3)
    text = ascii_heads(weights, tokens=[1, 2, 3, 4, 5])
    lines = text.splitlines()
    assert [line for line in lines if line.startswith("head ")] == ["head 0", "head 1", "head 2"]
    assert text.count(LEGEND) == 1 and lines[-1] == LEGEND
    assert len(grid_rows(text)) == 3 * 5
    # each head renders exactly as ascii_heatmap renders it alone
    assert ascii_heatmap(weights[1], tokens=[1, 2, 3, 4, 5], title="head 1").removesuffix(LEGEND) in text


def test_wide_labels_widen_the_cells_so_they_never_touch():
    weights = causal_weights(1, 12, seed=4)[0]
    text = ascii_heatmap(weights, tokens=[0, 5, 63, 10, 11, 12, 13, 14, 15, 16, 17, 18])
    key_line = next(line for line in text.splitlines() if line.lstrip().startswith("key"))
    assert key_line.split()[1:] == [str(i) for i in range(12)]
    assert len(grid_rows(text)[0]) == 12 * 3


@pytest.mark.parametrize(
    "weights, message",
    [
        (np.ones(4) / 4, r"rank 2 \(T, T\), got rank 1 with shape \(4,\)"),
        (np.ones((2, 3, 3)) / 3, r"rank 2 \(T, T\), got rank 3 .*weights\[0\]"),
        (np.ones((3, 4)) / 4, r"square .* got shape \(3, 4\)"),
        (np.zeros((0, 0)), r"at least one .* shape \(0, 0\)"),
        (np.array([[1.5, 0.0], [0.5, 0.5]]), r"weights\[0, 0\] = 1\.5 is outside \[0, 1\]"),
        (np.array([[1.0, 0.0], [-0.01, 1.0]]), r"weights\[1, 0\] = -0\.01 is outside \[0, 1\]"),
        (np.array([[1.0, 0.0], [np.inf, 1.0]]), r"weights\[1, 0\] = inf is outside"),
    ],
)
def test_bad_weights_are_refused(weights, message):
    with pytest.raises(ValueError, match=message):
        ascii_heatmap(weights)


def test_rounding_just_outside_the_range_is_accepted():
    weights = np.array([[1 + 5e-7, 0.0], [0.5, 0.5 - 5e-7]])
    weights[0, 1] = -5e-7
    rows = grid_rows(ascii_heatmap(weights))
    assert rows == ["@@  ", "++++"]


def test_bad_heads_and_tokens_are_refused():
    with pytest.raises(ValueError, match=r"weights_hTT must have rank 3 \(H, T, T\), got rank 2 .*weights_hTT\[None\]"):
        ascii_heads(np.eye(3))
    with pytest.raises(ValueError, match=r"square .* got shape \(2, 3, 4\)"):
        ascii_heads(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match=r"weights_hTT\[1, 2, 0\] = 2\.0 is outside \[0, 1\]"):
        bad = causal_weights(2, 3, seed=5)
        bad[1, 2, 0] = 2.0
        ascii_heads(bad)
    with pytest.raises(ValueError, match=r"tokens must be 3 token ids.*got shape \(2,\)"):
        ascii_heatmap(np.eye(3), tokens=[1, 2])
    with pytest.raises(ValueError, match=r"tokens must be integer token ids, got dtype float64"):
        ascii_heatmap(np.eye(3), tokens=[1.0, 2.5, 3.0])
    with pytest.raises(TypeError, match=r"numeric array"):
        ascii_heatmap(np.array([["a", "b"], ["c", "d"]]))
