"""Every printed figure is true: the final line says what its seconds measure and how long the
process has run; --quiet prints that line alone; --compile says on stderr that it compiles and
roughly for how long; counts are singular or plural as they should be; `mhsa compare` exits by
the trajectory tolerance of docs/DESIGN.md, naming the first step beyond it."""

import os
import re
import subprocess
import sys
import time

import pytest

from mhsa import registry, train_outputs
from mhsa.cli import main as mhsa
from shared.config import TrainConfig
from shared.history import History
from tests.backends import SMALL, names, package
from tests.commands import run_cli

FINAL = re.compile(
    r"final loss \S+ \(step (\d+)\) · (\d+) steps? in (\d+\.\d\d) s of training \(set-up and compilation included\) "
    r"· (\d+\.\d\d) s since the process started"
)


@pytest.mark.timeout(120)
def test_quiet_prints_only_the_final_line_whose_seconds_say_what_they_measure(tmp_path):
    argv = [sys.executable, "-m", f"{package(names('train')[0])}.train", "--quiet", "--epochs", "1", "--n-sequences", "64"]
    argv += ["--save", "p.safetensors", "--history", "p.json", "--plot", "p.png"]
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=100)
    wall = time.perf_counter() - started
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert len(done.stdout.splitlines()) == 1, done.stdout
    final = FINAL.fullmatch(done.stdout.rstrip("\n"))
    assert final is not None, done.stdout
    step, steps, training, process = int(final.group(1)), int(final.group(2)), float(final.group(3)), float(final.group(4))
    assert (step, steps) == (1, 2)
    # the process's own time covers its start-up (imports) and the training, and no more than the parent saw
    assert training <= process <= wall + 0.05, (training, process, wall)
    assert History.load(tmp_path / "p.json").seconds == pytest.approx(training, abs=0.006)
    assert sorted(os.listdir(tmp_path)) == ["p.adam.safetensors", "p.json", "p.png", "p.safetensors"]


def test_a_one_step_run_says_1_step(tmp_path):
    result = run_cli(names("train")[0], "--quiet", "--epochs", "1", "--n-sequences", "32", "--batch-size", "32", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert " · 1 step in " in result.stdout and FINAL.fullmatch(result.stdout.rstrip("\n"))
    loud = run_cli(names("train")[0], "--epochs", "1", "--n-sequences", "32", "--batch-size", "32", cwd=tmp_path)
    assert " (1 step/epoch) " in loud.stdout


@pytest.mark.parametrize("name", names("compile"))
def test_compile_says_on_stderr_that_it_compiles_and_for_about_how_long(tmp_path, monkeypatch, name):
    module = registry.get(name).train
    real, asked = module.train, []

    def without_compiling(*args, compile=False, **options):  # the note is the command's; the compilation is tested with the trainer
        asked.append(compile)
        return real(*args, **options)

    monkeypatch.setattr(module, "train", without_compiling)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    result = run_cli(name, "--epochs", "1", "--n-sequences", "32", "--compile", cwd=tmp_path)
    assert result.returncode == 0 and asked == [True], result.stderr
    assert result.stderr == (
        f"torch.compile: compiling the whole step before step 0, about 20 s (inductor's cache {tmp_path / 'inductor'} is empty)\n"
    )
    assert "torch.compile" not in result.stdout
    (tmp_path / "inductor").mkdir()
    (tmp_path / "inductor" / "fxgraph").mkdir()
    assert train_outputs.compile_note() == (
        f"torch.compile: compiling the whole step before step 0, about 3 s if inductor's cache {tmp_path / 'inductor'} "
        "holds this model's step, up to about 20 s if not"
    )


# --- mhsa compare as a check ------------------------------------------------------------------------


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


def test_compares_help_says_how_many_files_it_takes(capsys):
    with pytest.raises(SystemExit):
        mhsa(["compare", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "two or more --history files" in help_text and "exit 1 when they differ beyond the trajectory tolerance" in help_text
    assert "(two or more files in all)" in help_text
