"""`mhsa compare A.json B.json ...` (mhsa/compare.py): it exits by the trajectory tolerance of
docs/DESIGN.md, naming the first step beyond it, holds float64 runs to float64's tolerance and a
mixed pair to float32's, counts a NaN on one side as beyond, joins the parts of a run handed
between backends, names every field in which the runs differ, refuses a file that is not a
history in one line, never writes its plot over an input, and its figure names the runs and says
when they are identical."""

import json

import numpy as np
import pytest

from mhsa.cli import main as mhsa
from mhsa.compare import Comparison, comparison_figure
from shared.config import TrainConfig
from shared.history import History
from tests.backends import SMALL


def histories(tmp_path, b_losses, dtypes=("float32", "float32")):
    a_losses = [3.0, 2.0, 1.0, 0.5, 0.25]
    for name, losses, dtype in (("a", a_losses, dtypes[0]), ("b", b_losses, dtypes[1])):
        History("torch" if name == "a" else "jax", SMALL, TrainConfig(dtype=dtype), losses, [1.0], 1.0).save(tmp_path / f"{name}.json")
    return [str(tmp_path / "a.json"), str(tmp_path / "b.json")]


def test_compare_exits_0_when_the_runs_agree_within_the_trajectory_tolerance(tmp_path, capsys):
    assert mhsa(["compare", *histories(tmp_path, [3.0, 2.0 + 9e-5, 1.0, 0.5 - 9e-5, 0.25])]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "agree: within the trajectory tolerance 1e-04 (float32, docs/DESIGN.md) at every one of the 5 steps compared"
    )


def test_compare_exits_1_naming_the_first_step_beyond_the_tolerance(tmp_path, capsys):
    assert mhsa(["compare", *histories(tmp_path, [3.0, 2.0, 1.0 + 2e-4, 0.5, 0.25 + 1e-3])]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        "differ: beyond the trajectory tolerance 1e-04 (float32, docs/DESIGN.md) first at step 2: |A - B| = 2.000e-04 "
        "(A 1, B 1.0002); 2 of 5 steps beyond it"
    )


def test_compare_holds_float64_runs_to_float64s_tolerance_and_a_mixed_pair_to_float32s(tmp_path, capsys):
    b = [3.0, 2.0, 1.0 + 1e-6, 0.5, 0.25]
    assert mhsa(["compare", *histories(tmp_path, b, ("float64", "float64"))]) == 1
    assert "beyond the trajectory tolerance 1e-10 (float64, docs/DESIGN.md) first at step 2" in capsys.readouterr().out
    assert mhsa(["compare", *histories(tmp_path, b, ("float64", "float32"))]) == 0
    assert "within the trajectory tolerance 1e-04 (float32, docs/DESIGN.md)" in capsys.readouterr().out


def test_compare_counts_a_nan_on_one_side_as_beyond(tmp_path, capsys):
    assert mhsa(["compare", *histories(tmp_path, [3.0, float("nan"), 1.0, 0.5, 0.25])]) == 1
    assert "first at step 1: |A - B| = inf" in capsys.readouterr().out


def test_it_takes_two_or_more_files_and_joins_the_parts_of_a_run_in_step_order(tmp_path, capsys):
    whole = [3.0, 2.0, 1.0, 0.5, 0.25]
    History("torch", SMALL, TrainConfig(), whole, [1.0], 1.0).save(tmp_path / "a.json")
    parts = {"b1.json": ("numpy", 0, whole[:2]), "b2.json": ("jax", 2, whole[2:4]), "b3.json": ("torch", 4, whole[4:])}
    for name, (backend, first_step, losses) in parts.items():
        History(backend, SMALL, TrainConfig(), losses, [1.0], 1.0, first_step=first_step).save(tmp_path / name)
    with pytest.raises(SystemExit) as exit:
        mhsa(["compare", str(tmp_path / "a.json")])
    assert exit.value.code == 2 and "the following arguments are required: B.json" in capsys.readouterr().err
    given = [str(tmp_path / name) for name in ("b3.json", "b1.json", "b2.json")]  # in any order
    assert mhsa(["compare", str(tmp_path / "a.json"), *given]) == 0
    out = capsys.readouterr().out
    assert "compared 5 common steps (0..4)" in out and "max |A - B|  0.000e+00" in out
    assert mhsa(["compare", str(tmp_path / "a.json"), given[0], given[1]]) == 2  # a part missing: steps 2..3
    assert capsys.readouterr().err == "mhsa compare: error: cannot join: one part ends at step 1, the next starts at step 4\n"


def test_compare_names_every_differing_field_and_never_calls_different_inits_parity(capsys, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    History("torch", SMALL, TrainConfig(), [2.0, 1.0], [1.5], 0.1, init="shared").save(a)
    History(
        "jax", SMALL.__class__(**{**SMALL.to_dict(), "attn_impl": "fused"}), TrainConfig(lr=0.02, seed=3), [2.0, 1.0], [1.5], 0.1, init="native"
    ).save(b)
    assert mhsa(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "model_config differs: attn_impl 'explicit' vs 'fused'" in out
    assert "train_config differs: lr 0.01 vs 0.02, seed 0 vs 3" in out
    assert "the runs' initial weights differ or are unknown (A: shared, B: native)" in out and "not a parity check" in out


def test_a_file_that_is_not_a_history_is_refused_in_one_line(capsys, tmp_path):
    # every way a history is refused: tests/contract/test_history.py
    good = tmp_path / "good.json"
    History("numpy", SMALL, TrainConfig(), [1.0], [1.0], 0.1).save(good)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(good.read_text()), "losses": ["1.0"]}))
    assert mhsa(["compare", str(good), str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"mhsa compare: error: history file {str(bad)!r}: losses must be a flat list of numbers\n", err


def test_a_plot_over_an_input_is_refused(capsys, tmp_path):
    history = tmp_path / "h.png"
    History("numpy", SMALL, TrainConfig(), [1.0], [1.0], 0.1).save(history)
    before = history.read_bytes()
    assert mhsa(["compare", str(history), str(history), "--plot", str(history)]) == 2
    assert "is the input A.json" in capsys.readouterr().err
    assert history.read_bytes() == before


def test_the_compare_figure_names_the_runs_and_says_when_they_are_identical():

    steps, losses = np.arange(5), np.array([3.0, 2.0, 1.0, 0.5, 0.25])
    same = Comparison(steps, losses, losses.copy(), np.zeros(5))
    labels = ("A = a.json (torch, float32)", "B = b.json (jax, float32)")
    figure = comparison_figure(same, labels)
    assert figure.get_suptitle() == "loss per step: A = a.json (torch, float32) vs B = b.json (jax, float32)"
    curves, gaps = figure.axes
    assert [text.get_text() for text in curves.get_legend().get_texts()] == list(labels)
    assert [text.get_text() for text in gaps.texts] == ["A and B are identical at every one of the 5 steps compared"]
    assert gaps.get_lines() == []  # no empty curve on a meaningless log axis
    apart = Comparison(steps, losses, losses + 1e-3, np.full(5, 1e-3))
    assert comparison_figure(apart, labels).axes[1].get_lines() != []


def test_the_gap_figures_caption_counts_in_the_singular_and_the_plural():

    steps, losses = np.arange(3), np.array([3.0, 2.0, 1.0])
    labels = ("A = a.json (torch, float32)", "B = b.json (jax, float32)")
    one_exact = Comparison(steps, losses, losses + [0.0, 1e-3, 2e-3], np.array([0.0, 1e-3, 2e-3]))
    assert comparison_figure(one_exact, labels).axes[1].get_title() == "max 2.00e-03 at step 2, mean 1.00e-03; 1 step identical (not drawn)"
    two_exact = Comparison(steps, losses, losses + [0.0, 0.0, 2e-3], np.array([0.0, 0.0, 2e-3]))
    assert comparison_figure(two_exact, labels).axes[1].get_title().endswith("; 2 steps identical (not drawn)")
    single = Comparison(steps[:1], losses[:1], losses[:1].copy(), np.zeros(1))
    assert [text.get_text() for text in comparison_figure(single, labels).axes[1].texts] == ["A and B are identical at the 1 step compared"]
