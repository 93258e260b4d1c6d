"""What the train command prints (mhsa/train_outputs.py), and every printed figure is true: the
same lines and the same history schema for every backend, the heatmap's causal triangle, the
final line that says what its seconds measure and how long the process has run; --quiet prints
that line alone; --compile says on stderr that it compiles and roughly for how long; counts are
singular or plural as they should be; a row too long for the heatmap is cut and the title says so."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

from mhsa import registry, train_outputs
from mhsa.cli import main
from shared import weights
from shared.config import ModelConfig
from shared.history import KEYS, History
from tests.backends import names, package
from tests.commands import run_cli

TRAINERS = names("train")


def runs_of_every_backend(folder, *flags) -> dict:
    """backend: (its train command's result, its History, folder) of `train FLAGS --history --save` in folder."""
    runs = {}
    for backend in TRAINERS:
        result = run_cli(backend, *flags, "--history", f"{backend}.json", "--save", f"{backend}.safetensors", cwd=folder)
        assert result.returncode == 0, result.stderr
        runs[backend] = (result, History.load(folder / f"{backend}.json"), folder)
    return runs


@pytest.fixture(scope="module")
def default_runs(tmp_path_factory):
    """The default float32 run of each backend, with a user's flags and nothing else."""
    return runs_of_every_backend(tmp_path_factory.mktemp("default"))


@pytest.fixture(scope="module")
def short_runs(tmp_path_factory):
    """Two steps of the default model in each backend: its weights file and its heatmap, whose
    triangle is the causal mask's, trained or not."""
    return runs_of_every_backend(tmp_path_factory.mktemp("short"), "--epochs", "1", "--n-sequences", "64")


@pytest.mark.slow  # a default training in every backend
def test_the_output_and_the_history_schema_are_the_same_for_every_backend(default_runs):
    lines = {}
    for backend, (result, _, folder) in default_runs.items():
        out = result.stdout
        assert out.startswith(f"backend {backend}\nmodel  vocab_size=64 d_model=32 n_heads=4 (d_head=8) max_len=12")
        for epoch in (1, 2, 3):
            assert f"epoch {epoch}/3  mean loss " in out
        assert "final loss " in out and "head 0 of 4" in out and "shade:" in out
        assert result.stderr == ""  # not a terminal: no progress bar
        data = json.loads((folder / f"{backend}.json").read_text())
        assert sorted(data) == sorted(KEYS + ("first_step", "init", "source", "source_sha256", "compile_seconds"))
        assert data["backend"] == backend and data["first_step"] == 0 and data["init"] == "shared" and data["source"] is None
        assert data["compile_seconds"] is None  # no --compile
        # identical lines apart from the backend's name and the numbers
        lines[backend] = [re.sub(r"\d[\d,]*(\.\d+)?(e-?\d+)?", "N", line.replace(backend, "BACKEND")) for line in out.splitlines()]
    first, *others = TRAINERS
    assert all(lines[other] == lines[first] for other in others), lines
    heatmap_rows = [line for line in default_runs[first][0].stdout.splitlines() if line.strip()[:1].isdigit() and "|" in line]
    assert len(heatmap_rows) == 12


def test_the_saved_weights_reload_and_the_heatmap_shows_the_causal_triangle(short_runs):
    for backend, (result, _, folder) in short_runs.items():
        arrays, config = weights.load(folder / f"{backend}.safetensors")
        assert config == ModelConfig()
        rows = [line.split("|")[1] for line in result.stdout.splitlines() if line.count("|") == 2 and line.strip()[:1].isdigit()]
        assert len(rows) == 12, f"{backend}: the heatmap has {len(rows)} query rows, expected 12"
        for query, row in enumerate(rows):
            cell = len(row) // 12
            assert row[(query + 1) * cell :].strip() == "", f"{backend}: row {query} shows a later key"
            assert row[query * cell : (query + 1) * cell].strip() != ""


def test_a_long_row_is_cut_and_the_title_says_so(tmp_path, capsys):
    name = TRAINERS[0]
    assert main(["train", "--backend", name, "--seq-len", "20", "--epochs", "1", "--n-sequences", "64", "--plot", str(tmp_path / "run.png")]) == 0
    out = capsys.readouterr().out
    assert f"{name} · head 0 of 4 · attention weights on the first 12 of 20 positions of a copy-task row" in out
    assert (tmp_path / "run.png").exists()


FINAL = re.compile(
    r"final loss \S+ \(step (\d+)\) · (\d+) steps? in (\d+\.\d\d) s of training \(set-up and compilation included\) "
    r"· (\d+\.\d\d) s since the process started"
)


@pytest.mark.slow
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
