"""The figures (mhsa/plots.py), inspected as objects before saving (no pixel matching), and
save_figure: a PNG of the figure's size, drawn in memory first, so a drawing that fails leaves
the previous file as it was. How every writer keeps the previous file on a failed write:
tests/contract/test_files.py."""

import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from mhsa.plots import MASKED_RGBA, heads_figure, save_figure, training_figure
from tests.samples import causal_weights

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def fake_losses(n, seed=0):
    """A copy-task-like curve: from about log(64) down towards 0, with noise."""
    rng = np.random.default_rng(seed)
    return 4.16 * np.exp(-np.arange(n) / (n / 5)) + 0.02 + 0.02 * rng.random(n)


def head_axes(fig):
    return [ax for ax in fig.axes if ax.get_title().startswith("head ")]


def colorbar_axes(fig):
    return [ax for ax in fig.axes if ax.get_ylabel() == "attention weight"]


def loss_axes(fig):
    (ax,) = [ax for ax in fig.axes if ax.get_ylabel() == "loss (cross-entropy)"]
    return ax


def png_size(path):
    """(width, height) from the IHDR chunk, the first chunk after the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def expected_pixels(fig):
    width, height = fig.get_size_inches() * fig.dpi
    return round(width), round(height)


@pytest.mark.parametrize("H", [1, 2, 3, 4, 5, 8])
def test_heads_figure_has_one_titled_panel_per_head_and_one_colour_bar(H):
    T = 5
    fig = heads_figure(causal_weights(H, T, seed=H), title=f"numpy · H={H}")
    panels = head_axes(fig)
    assert [ax.get_title() for ax in panels] == [f"head {h}" for h in range(H)]
    assert len(fig.axes) == H + 1  # the heads and the colour bar, no empty spare cells
    for ax in panels:
        assert ax.get_xlabel() == "key position"
        assert ax.get_ylabel() == "query position"
        image, _ = ax.get_images()  # the weights, then the white cover of masked cells
        assert image.get_clim() == (0.0, 1.0)  # one fixed range: heads are comparable
        assert image.get_array().shape == (T, T)
    assert len(colorbar_axes(fig)) == 1
    assert fig.get_suptitle() == f"numpy · H={H}"
    # a sensible grid: at most four heads side by side
    columns = len({round(ax.get_position().x0, 3) for ax in panels})
    assert columns == min(H, 4)


def test_masked_cells_are_white_and_a_learned_zero_is_not():
    weights = causal_weights(2, 5, seed=0)
    weights[:, 3, 1] = 0.0  # an allowed key that got weight exactly 0
    fig = heads_figure(weights)
    for ax, head in zip(head_axes(fig), weights):
        image, overlay = ax.get_images()
        np.testing.assert_array_equal(image.get_array(), head)
        cover = overlay.get_array()  # (T, T, 4) RGBA over the weights
        upper = np.triu_indices(5, k=1)
        assert np.allclose(cover[upper], MASKED_RGBA)  # every later key: white, opaque
        assert (cover[np.tril_indices(5)][:, 3] == 0).all()  # allowed cells: transparent
        assert not np.allclose(image.cmap(0.0), MASKED_RGBA)  # weight 0 keeps its own colour
    assert "white: masked" in fig._supxlabel.get_text()


def test_an_extra_mask_is_drawn_as_masked_too():
    weights = causal_weights(1, 4, seed=0)
    allowed = np.tril(np.ones((4, 4), dtype=bool))
    allowed[2, 0] = False
    (ax,) = head_axes(heads_figure(weights, allowed=allowed))
    _, overlay = ax.get_images()
    assert np.allclose(overlay.get_array()[2, 0], MASKED_RGBA)
    with pytest.raises(ValueError, match=r"allowed of shape \(3, 3\) does not broadcast to the weights' \(1, 4, 4\)"):
        heads_figure(weights, allowed=np.ones((3, 3), dtype=bool))


def test_a_resumed_run_keeps_its_real_epochs_and_steps():
    fig = training_figure(fake_losses(2 * 7), steps_per_epoch=7, weights=causal_weights(1, 3, seed=2), first_step=7)
    ax = loss_axes(fig)
    (curve,) = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    np.testing.assert_array_equal(curve.get_xdata(), np.arange(7, 21))  # steps 7..20, as the text says
    assert [text.get_text() for text in ax.texts] == ["epoch 2", "epoch 3"]
    assert [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"] == [13.5]
    with pytest.raises(ValueError, match="first_step must be a non-negative multiple of steps_per_epoch=7, got 3"):
        training_figure(fake_losses(7), 7, causal_weights(1, 3, seed=2), first_step=3)


def test_ticks_are_positions_and_token_ids_are_listed_once():
    # a copy-task row repeats one id, so ids on the ticks would all read the same
    tokens = [7, 3, 9, 41, 2]
    fig = heads_figure(causal_weights(3, 5, seed=1), tokens=tokens)
    for ax in head_axes(fig):
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2", "3", "4"]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2", "3", "4"]
    assert fig._supxlabel.get_text().startswith("input token ids by position: 7 3 9 41 2 · ")
    plain = heads_figure(causal_weights(3, 5, seed=1))
    assert "token ids" not in plain._supxlabel.get_text()


def test_training_figure_inspected_before_saving(tmp_path):
    losses = fake_losses(3 * 7)
    title = "torch · H=4 D=32 T=5 V=64"
    fig = training_figure(losses, steps_per_epoch=7, weights=causal_weights(4, 5, seed=2), tokens=[1, 2, 3, 4, 5], title=title)
    assert fig.get_suptitle() == title
    ax = loss_axes(fig)
    assert ax.get_yscale() == "log"
    assert ax.get_xlabel() == "step"
    (curve,) = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    np.testing.assert_allclose(curve.get_ydata(), losses)
    np.testing.assert_array_equal(curve.get_xdata(), np.arange(0, 21))  # counted from 0, as the text output
    # one dashed line between each pair of epochs: after steps 6 and 13
    boundaries = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert boundaries == [6.5, 13.5]
    assert [text.get_text() for text in ax.texts] == ["epoch 1", "epoch 2", "epoch 3"]
    assert [a.get_title() for a in head_axes(fig)] == ["head 0", "head 1", "head 2", "head 3"]
    assert len(colorbar_axes(fig)) == 1

    path = save_figure(fig, tmp_path / "train.png")
    assert path == tmp_path / "train.png"
    assert png_size(path) == expected_pixels(fig)
    assert os.listdir(tmp_path) == ["train.png"]
    assert path.stat().st_size < 300_000


@pytest.mark.parametrize("n_steps, steps_per_epoch, n_lines", [(5, 5, 0), (6, 5, 1), (12, 4, 2), (1, 3, 0)])
def test_one_boundary_line_per_epoch_boundary(n_steps, steps_per_epoch, n_lines):
    fig = training_figure(fake_losses(n_steps), steps_per_epoch, causal_weights(1, 3, seed=3))
    ax = loss_axes(fig)
    assert len([line for line in ax.get_lines() if line.get_linestyle() == "--"]) == n_lines
    assert len(ax.texts) == n_lines + 1  # every epoch labeled, the last one partial or not


def test_many_epochs_thin_their_labels_and_lines():
    fig = training_figure(fake_losses(500 * 4), 4, causal_weights(1, 3, seed=3))
    ax = loss_axes(fig)
    labels = [text.get_text() for text in ax.texts]
    assert labels[0] == "epoch 1" and 1 < len(labels) <= 12
    lines = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert 1 < len(lines) <= 50
    # each line sits on the boundary just before a labeled epoch
    assert [f"epoch {int(x + 0.5) // 4 + 1}" for x in lines] == labels[1:]


def test_non_finite_losses_are_named_not_hidden():
    losses = fake_losses(10)
    losses[6:] = np.nan
    fig = training_figure(losses, 5, causal_weights(2, 4, seed=4))
    ax = loss_axes(fig)
    note = ax.get_title(loc="right")
    assert "loss nan at step 6" in note and note.endswith("(4 steps in all)")
    losses[6:9] = 1.0  # one step left non-finite: the singular
    assert loss_axes(training_figure(losses, 5, causal_weights(2, 4, seed=4))).get_title(loc="right").endswith("(1 step in all)")


def test_save_figure_writes_a_png_of_the_figure_size(tmp_path):
    fig = heads_figure(causal_weights(4, 12, seed=5), tokens=list(range(50, 62)))
    size = tuple(fig.get_size_inches())
    path = save_figure(fig, tmp_path / "heads.png")
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert png_size(path) == expected_pixels(fig)
    assert len(data) < 300_000
    assert os.listdir(tmp_path) == ["heads.png"]
    # the caller's figure is untouched and still usable: saving again gives the same size
    assert tuple(fig.get_size_inches()) == size and len(head_axes(fig)) == 4
    save_figure(fig, tmp_path / "again.png")
    assert png_size(tmp_path / "again.png") == png_size(path)


def fail_midway(fig, monkeypatch, error):
    """Make fig.savefig write half a PNG and then fail."""

    def savefig(file, **kwargs):
        file.write(PNG_SIGNATURE + b"\0" * 100)
        raise error

    monkeypatch.setattr(fig, "savefig", savefig)


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_a_drawing_that_fails_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch, error):
    path = tmp_path / "heads.png"
    save_figure(heads_figure(causal_weights(2, 5, seed=6)), path)
    before = path.read_bytes()
    fig = heads_figure(causal_weights(3, 5, seed=7))
    fail_midway(fig, monkeypatch, error)
    with pytest.raises(type(error)):
        save_figure(fig, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["heads.png"]


def test_save_figure_refusals(tmp_path):
    fig = heads_figure(causal_weights(1, 3, seed=10))
    with pytest.raises(TypeError, match="matplotlib Figure, got ndarray"):
        save_figure(np.zeros((2, 2)), tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"ending in \.png, got .*x\.pdf"):
        save_figure(fig, tmp_path / "x.pdf")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save_figure(fig, tmp_path / "missing" / "x.png")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "weights, message",
    [
        (np.eye(3), r"rank 3 \(H, T, T\), got rank 2 with shape \(3, 3\).*weights\[None\]"),
        (np.ones((1, 2, 3, 3)) / 3, r"rank 3 \(H, T, T\), got rank 4 .*weights\[0\]"),
        (np.ones((2, 3, 4)) / 4, r"square .* got shape \(2, 3, 4\)"),
        (np.full((1, 2, 2), 1.5), r"weights\[0, 0, 0\] = 1\.5 is outside \[0, 1\]"),
    ],
)
def test_figures_refuse_bad_weights(weights, message):
    with pytest.raises(ValueError, match=message):
        heads_figure(weights)
    with pytest.raises(ValueError, match=message):
        training_figure(fake_losses(4), 2, weights)


def test_figures_refuse_bad_tokens_losses_and_epochs():
    weights = causal_weights(2, 4, seed=11)
    with pytest.raises(ValueError, match=r"tokens must be 4 token ids"):
        heads_figure(weights, tokens=[1, 2, 3])
    with pytest.raises(ValueError, match=r"losses must be 1-D .* got shape \(2, 3\)"):
        training_figure(np.ones((2, 3)), 2, weights)
    with pytest.raises(ValueError, match=r"losses is empty"):
        training_figure([], 2, weights)
    with pytest.raises(TypeError, match=r"losses must be a sequence of floats"):
        training_figure(["a", "b"], 2, weights)
    for bad in (0, -3, 2.5, True, "4"):
        with pytest.raises(ValueError, match=rf"steps_per_epoch must be a positive integer, got {bad!r}"):
            training_figure(fake_losses(4), bad, weights)


@pytest.mark.slow
def test_the_module_is_framework_neutral_and_needs_no_pyplot():
    code = (
        "import sys, mhsa.plots, mhsa.heatmap; "
        "bad = [m for m in ('torch', 'jax', 'flax', 'matplotlib.pyplot') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
