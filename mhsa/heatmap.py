"""Attention weights as text: one shaded character pair per (query, key) cell, for a terminal.

Rows are queries, columns are keys. A weight of exactly 0 (a masked key) is blank, so the
causal triangle shows; darker characters mean more weight. NumPy in, a string out.
"""

from __future__ import annotations

import math

import numpy as np

# ' ' is reserved for an exact 0; the other nine shades split (0, 1] into steps of 1/9
RAMP = " .:-=+*#%@"
NAN = "?"
TOLERANCE = 1e-6  # how far outside [0, 1] a weight may stray (rounding) before it is refused
LEGEND = f"shade: ' ' = 0 (masked) < {' '.join(RAMP[1:])} = 1, one step per 1/9; '{NAN}' = NaN"


def check_weights(weights, ndim: int, name: str = "weights") -> np.ndarray:
    """Return `weights` as float64 after checking it is a numeric array of rank `ndim` whose
    last two axes are square (T, T), T >= 1, with every value in [0, 1] (NaN allowed).

    Raises TypeError for a non-numeric array, ValueError naming the shape or the first bad
    value and what was expected.
    """
    layout = {2: "(T, T)", 3: "(H, T, T)"}.get(ndim, f"rank {ndim}")
    array = np.asarray(weights)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a numeric array {layout}, got dtype {array.dtype}")
    if array.ndim != ndim:
        hint = ""
        if array.ndim == ndim + 1:
            hint = f"; for a batch pick one row first, e.g. {name}[0]"
        elif array.ndim == ndim - 1 and ndim == 3:
            hint = f"; for a single head pass {name}[None]"
        raise ValueError(f"{name} must have rank {ndim} {layout}, got rank {array.ndim} with shape {array.shape}{hint}")
    if array.shape[-1] != array.shape[-2]:
        raise ValueError(
            f"{name} must be square over (query, key) {layout}, got shape {array.shape} ({array.shape[-2]} queries, {array.shape[-1]} keys)"
        )
    if array.size == 0:
        raise ValueError(f"{name} must hold at least one head and one position {layout}, got shape {array.shape}")
    array = array.astype(np.float64)
    outside = ~np.isnan(array) & ((array < -TOLERANCE) | (array > 1 + TOLERANCE))
    if outside.any():
        where = tuple(int(i) for i in np.argwhere(outside)[0])
        raise ValueError(
            f"{name}[{', '.join(map(str, where))}] = {float(array[where])} is outside [0, 1]; "
            f"attention weights are probabilities (after softmax), shape {array.shape}"
        )
    return array


def check_tokens(tokens, T: int) -> list[int] | None:
    """Return `tokens` as a list of T ints (None stays None); ValueError otherwise."""
    if tokens is None:
        return None
    array = np.asarray(tokens)
    if array.ndim != 1 or array.shape[0] != T:
        raise ValueError(f"tokens must be {T} token ids, one per position (shape ({T},)), got shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise ValueError(f"tokens must be integer token ids, got dtype {array.dtype}")
    return [int(token) for token in array]


def ascii_heatmap(weights, tokens=None, title=None) -> str:
    """One head's attention weights (T, T) as text, with a one-line legend at the end.

    Rows (queries) and columns (keys) are labeled with the position and, when `tokens`
    (T ints) is given, the token id at that position.
    """
    weights = check_weights(weights, ndim=2)
    tokens = check_tokens(tokens, weights.shape[0])
    return "\n".join(_render(weights, tokens, title) + [LEGEND])


def ascii_heads(weights_hTT, tokens=None) -> str:
    """Every head of (H, T, T) attention weights, each titled "head h", one legend at the end."""
    weights = check_weights(weights_hTT, ndim=3, name="weights_hTT")
    tokens = check_tokens(tokens, weights.shape[-1])
    blocks = ["\n".join(_render(head, tokens, f"head {h}")) for h, head in enumerate(weights)]
    return "\n\n".join(blocks) + "\n\n" + LEGEND


def shade(value: float) -> str:
    """The character for one weight: ' ' for exactly 0, '@' for 1, '?' for NaN."""
    if math.isnan(value):
        return NAN
    value = min(max(value, 0.0), 1.0)  # rounding within TOLERANCE
    if value == 0.0:
        return RAMP[0]
    return RAMP[min(max(math.ceil(value * 9), 1), 9)]  # any weight > 0 is visible


def _render(weights: np.ndarray, tokens: list[int] | None, title: str | None) -> list[str]:
    # the lines of one (T, T) heatmap, without the legend
    T = weights.shape[0]
    positions = [str(i) for i in range(T)]
    ids = [str(token) for token in tokens] if tokens is not None else None
    # each cell is at least two characters (roughly square in a terminal), wide enough
    # that neighbouring column labels never touch
    width = max(2, 1 + max(len(label) for label in positions + (ids or [])))

    # left gutter: query position (and token id) of each row
    row_heads = ["query", "token"] if ids is not None else ["query"]
    columns = [positions] + ([ids] if ids is not None else [])
    widths = [max(len(head), *(len(label) for label in column)) for head, column in zip(row_heads, columns)]
    gutter = len(" ".join(" " * w for w in widths))

    lines = [title] if title else []
    lines.append("key".rjust(gutter) + "  " + "".join(label.rjust(width) for label in positions))
    if ids is not None:
        lines.append("token".rjust(gutter) + "  " + "".join(label.rjust(width) for label in ids))
    rule = "+" + "-" * (T * width) + "+"
    lines.append(" ".join(head.rjust(w) for head, w in zip(row_heads, widths)) + " " + rule)
    for i, row in enumerate(weights):
        label = " ".join(column[i].rjust(w) for column, w in zip(columns, widths))
        cells = "".join(shade(value) * width for value in row)
        lines.append(f"{label} |{cells}|")
    lines.append(" " * gutter + " " + rule)
    return lines
