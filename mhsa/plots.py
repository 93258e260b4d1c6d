"""Attention heatmaps and training curves as matplotlib figures, and an atomic PNG writer.

NumPy in, a `matplotlib.figure.Figure` out. Figures are built with the object-oriented API
(no pyplot), so nothing here needs a display, touches global state, or must be closed.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory, offset_copy

from mhsa.heatmap import check_tokens, check_weights
from shared.files import write_atomically
from shared.words import plural

DPI = 100
MAX_COLUMNS = 4  # head panels per row: H = 1, 2, 4 -> one row; H = 8 -> 2 x 4
PANEL = 2.5  # inches per head panel (multiples of 1/4 inch give whole pixels at any dpi)
LOSS_HEIGHT = 2.75  # inches for the loss curve above the heads in training_figure
MAX_TICKS = 12  # more positions (or epochs) than this get every k-th tick (or label)
MAX_EPOCH_LINES = 50  # more epochs than this get a boundary line every k-th epoch
# viridis: weight 0 is the darkest colour, NaN is grey; a masked cell (a key the query may not
# attend) is white, so that it never reads as a learned weight of 0
CMAP = colormaps["viridis"].with_extremes(bad="lightgrey")
MASKED_RGBA = (1.0, 1.0, 1.0, 1.0)


def heads_figure(weights, tokens=None, title=None, allowed=None) -> Figure:
    """Every head's attention weights (H, T, T), one panel per head, with one colour bar (0..1).

    Rows are queries, columns are keys, ticks are positions; `tokens` (T ints) are listed below.
    allowed: bool (T, T) or (H, T, T), True where a query may attend (default: the causal
    mask); the other cells are drawn white, not as a weight of 0.
    """
    weights = check_weights(weights, ndim=3)
    tokens = check_tokens(tokens, weights.shape[-1])
    rows, columns = _grid(weights.shape[0])
    height = PANEL * rows + (1.0 if title else 0.75)
    figure = Figure(figsize=(PANEL * columns + 1.25, height), dpi=DPI, layout="constrained")
    _draw_heads(figure, weights, tokens, _allowed(allowed, weights.shape))
    if title:
        figure.suptitle(title)
    return figure


def training_figure(losses, steps_per_epoch, weights, tokens=None, title=None, first_step=0, allowed=None) -> Figure:
    """The per-step loss on a log axis, epochs marked, above the grid of every head's weights.

    Steps are counted from 0 as in the trainers' text output; a resumed run's losses start at
    `first_step` (a multiple of steps_per_epoch) and its epochs keep their real numbers.
    An epoch boundary is drawn as a dashed line between the last step of one epoch and the
    first of the next (so E epochs give E - 1 lines), and each epoch is labeled "epoch e";
    past 12 labels or 50 lines only every k-th epoch is, so that they stay legible.
    Non-finite losses are left out of the curve and named in a note on the plot.
    """
    losses = _check_losses(losses)
    steps_per_epoch = _check_steps_per_epoch(steps_per_epoch)
    weights = check_weights(weights, ndim=3)
    tokens = check_tokens(tokens, weights.shape[-1])
    rows, columns = _grid(weights.shape[0])
    heads_height = PANEL * rows + 0.5
    figure = Figure(
        figsize=(max(10.0, PANEL * columns + 1.25), LOSS_HEIGHT + heads_height + (0.5 if title else 0.0)),
        dpi=DPI,
        layout="constrained",
    )
    top, bottom = figure.subfigures(2, 1, height_ratios=[LOSS_HEIGHT, heads_height])  # type: ignore[misc]  # (2, 1) gives an array of two; the stub's union also has a lone SubFigure
    if isinstance(first_step, bool) or not isinstance(first_step, (int, np.integer)) or first_step < 0 or first_step % steps_per_epoch:
        raise ValueError(f"first_step must be a non-negative multiple of steps_per_epoch={steps_per_epoch}, got {first_step!r}")
    _draw_losses(top.subplots(), losses, steps_per_epoch, int(first_step))
    spare = figure.get_figwidth() - (PANEL * columns + 1.25)
    if spare > 0.5:  # few heads: centre their grid instead of stretching it across
        bottom = bottom.subfigures(1, 3, width_ratios=[spare / 2, PANEL * columns + 1.25, spare / 2])[1]
    _draw_heads(bottom, weights, tokens, _allowed(allowed, weights.shape))
    if title:
        figure.suptitle(title)
    return figure


def save_figure(fig: Figure, path) -> Path:
    """Write `fig` as a PNG at its own size and dpi, atomically: a temporary file in the same
    folder, then a rename, so a failed save never destroys the previous file. Returns the path.

    The figure is left open and unchanged for the caller.
    """
    if not isinstance(fig, Figure):
        raise TypeError(f"save_figure expects a matplotlib Figure, got {type(fig).__name__}")
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"save_figure writes PNG files; expected a path ending in .png, got {str(path)!r}")
    folder = path.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"cannot save figure to {str(path)!r}: folder {str(folder)!r} does not exist")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=fig.dpi)
    write_atomically(path, buffer.getvalue())
    return path


def _grid(n_heads: int) -> tuple[int, int]:
    # (rows, columns): up to MAX_COLUMNS heads side by side
    columns = min(n_heads, MAX_COLUMNS)
    return math.ceil(n_heads / columns), columns


def _allowed(allowed, shape: tuple) -> np.ndarray:
    # (H, T, T) bool: the causal mask unless the caller says otherwise
    H, T, _ = shape
    if allowed is None:
        return np.broadcast_to(np.tril(np.ones((T, T), dtype=bool)), shape)
    allowed = np.asarray(allowed)
    if allowed.dtype != bool:
        raise TypeError(f"allowed must be a boolean array (True = may attend), got dtype {allowed.dtype}")
    try:
        return np.broadcast_to(allowed, shape)
    except ValueError:
        raise ValueError(f"allowed of shape {allowed.shape} does not broadcast to the weights' {shape}") from None


def _draw_heads(container, weights: np.ndarray, tokens: list[int] | None, allowed: np.ndarray) -> None:
    # one panel per head in `container` (a Figure or SubFigure), one shared colour bar
    H, T, _ = weights.shape
    rows, columns = _grid(H)
    axes = container.subplots(rows, columns, squeeze=False).ravel()
    for spare in axes[H:]:  # H = 3 or 5 leaves empty cells in the grid
        spare.remove()
    axes = axes[:H]
    stride = math.ceil(T / MAX_TICKS)
    ticks = np.arange(0, T, stride)
    labels = [str(i) for i in ticks]
    causal = np.array_equal(allowed, np.broadcast_to(np.tril(np.ones((T, T), dtype=bool)), allowed.shape))
    # the staircase between allowed and masked cells: right of key i on query row i
    edge_x = np.repeat(np.arange(T) + 0.5, 2)  # (2T,)
    edge_y = np.stack([np.arange(T) - 0.5, np.arange(T) + 0.5], axis=1).ravel()  # (2T,)
    for h, (ax, head) in enumerate(zip(axes, weights)):
        image = ax.imshow(head, cmap=CMAP, vmin=0.0, vmax=1.0, interpolation="nearest")
        masked = np.zeros((T, T, 4))  # RGBA, transparent where the query may attend
        masked[~allowed[h]] = MASKED_RGBA
        ax.imshow(masked, interpolation="nearest")
        ax.set_title(f"head {h}")
        ax.set_xlabel("key position", fontsize=8)
        ax.set_ylabel("query position", fontsize=8)
        ax.set_xticks(ticks, labels, fontsize=7)
        ax.set_yticks(ticks, labels, fontsize=7)
        if causal:  # outline the mask: every key right of this line is a later position
            ax.plot(edge_x, edge_y, color="white", linewidth=0.8, alpha=0.6)
            ax.set_xlim(-0.5, T - 0.5)
            ax.set_ylim(T - 0.5, -0.5)  # query 0 at the top, as imshow had it
    colorbar = container.colorbar(image, ax=list(axes), shrink=0.9)
    colorbar.set_label("attention weight")
    notes = ["white: masked (the query may not attend that key)"]
    if tokens is not None:
        notes.insert(0, "input token ids by position: " + " ".join(str(token) for token in tokens))
    container.supxlabel(" · ".join(notes), fontsize=8, color="dimgrey")


def _draw_losses(ax, losses: np.ndarray, steps_per_epoch: int, first_step: int) -> None:
    # per-step loss (step s = the loss before update s, counted from 0) on a log axis, epochs marked
    n = len(losses)
    steps = np.arange(first_step, first_step + n)
    finite = np.isfinite(losses) & (losses > 0)  # a log axis cannot show 0, negatives, inf, NaN
    ax.plot(steps, np.where(finite, losses, np.nan), color="tab:blue", linewidth=1.2)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (cross-entropy)")
    ax.set_xlim(first_step - 0.5, first_step + n - 0.5)
    if not finite.any():
        ax.set_ylim(1e-2, 1e1)  # nothing to autoscale on
    ax.grid(True, which="major", alpha=0.3)
    n_epochs = math.ceil(n / steps_per_epoch)
    before = first_step // steps_per_epoch  # epochs trained before this run (a resumed run)
    label_every = math.ceil(n_epochs / MAX_TICKS)  # keep the labels from overlapping
    line_every = 1 if n_epochs <= MAX_EPOCH_LINES else label_every  # and the lines from merging
    for epoch in range(line_every, n_epochs, line_every):  # boundaries between epochs, not the two ends
        ax.axvline(first_step + epoch * steps_per_epoch - 0.5, color="grey", linestyle="--", linewidth=1)
    on_top = blended_transform_factory(ax.transData, ax.transAxes)  # x in steps, y in axes
    for epoch in range(1, n_epochs + 1, label_every):
        first = first_step + (epoch - 1) * steps_per_epoch
        last = min(first_step + epoch * steps_per_epoch, first_step + n) - 1
        if label_every == 1:  # centred over its epoch
            x, align = (first + last) / 2, "center"
        else:  # too narrow to centre over: start just right of its boundary line
            x, align = first - 0.5, "left"
        place = on_top if align == "center" else offset_copy(on_top, fig=ax.figure, x=3, units="points")
        ax.text(x, 0.96, f"epoch {before + epoch}", transform=place, ha=align, va="top", fontsize=8, color="dimgrey")
    bad = np.flatnonzero(~finite)
    if bad.size:  # say so rather than leave a silent gap
        first = int(bad[0])
        ax.axvline(first_step + first, color="tab:red", linestyle=":", linewidth=1)
        ax.set_title(
            f"loss {float(losses[first])} at step {first_step + first} cannot be shown on a log axis ({plural(bad.size, 'step')} in all)",
            loc="right",
            fontsize=8,
            color="tab:red",
        )


def _check_losses(losses) -> np.ndarray:
    array = np.asarray(losses)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"losses must be a sequence of floats, one per step, got dtype {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"losses must be 1-D (one loss per step), got shape {array.shape}")
    if array.size == 0:
        raise ValueError("losses is empty; expected at least one loss, one per training step")
    return array.astype(np.float64)


def _check_steps_per_epoch(steps_per_epoch) -> int:
    if isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, (int, np.integer)):
        raise ValueError(f"steps_per_epoch must be a positive integer, got {steps_per_epoch!r}")
    if steps_per_epoch <= 0:
        raise ValueError(f"steps_per_epoch must be a positive integer, got {steps_per_epoch}")
    return int(steps_per_epoch)
