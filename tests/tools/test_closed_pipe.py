"""A reader that leaves early (`| head -1`, `| grep -m1`) never cancels the work: the files are
written, what is printed after is dropped without a word (no "Exception ignored ...
BrokenPipeError" at exit either), and the exit status is the one the command would have had
(mhsa/cli.py, stdout_to_a_reader_that_may_leave)."""

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from mhsa.cli import COMMANDS, main
from shared import weights
from shared.config import TrainConfig
from shared.history import History
from tests.backends import SMALL, names, package
from tests.paths import ROOT

QUIET_STDERR = ("Traceback", "Exception ignored", "BrokenPipeError")


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", names("train"))
def test_a_training_command_whose_reader_leaves_after_one_line_still_writes_its_three_files(tmp_path, name):
    argv = [sys.executable, "-m", f"{package(name)}.train", "--epochs", "1", "--n-sequences", "64"]
    argv += ["--save", "p.safetensors", "--history", "p.json", "--plot", "p.png"]
    child = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == f"backend {name}\n"
        child.stdout.close()  # the reader leaves, as `head -1` does; the run has not trained yet
        err = child.stderr.read()
        child.wait(timeout=200)
    finally:
        child.kill()
    assert child.returncode == 0 and not any(word in err for word in QUIET_STDERR), err
    assert sorted(os.listdir(tmp_path)) == ["p.adam.safetensors", "p.json", "p.png", "p.safetensors"]
    assert len(History.load(tmp_path / "p.json").losses) == 2


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_mhsa_train_piped_into_grep_m1_still_writes_its_files_and_exits_as_it_would_have(tmp_path):
    mhsa = [sys.executable, "-m", "mhsa.cli"]
    command = " ".join([*mhsa, "train", "--backend", names("train")[0], "--epochs", "3", "--n-sequences", "64", "--save", "p.safetensors"])
    shell = f"{command} | grep -m1 epoch; echo status=${{PIPESTATUS[0]}}"
    done = subprocess.run(
        ["bash", "-c", shell], cwd=tmp_path, capture_output=True, text=True, timeout=200, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    # grep leaves at the banner's "train  epochs=3 ..." line, before the first step
    assert done.stdout.startswith("train  epochs=3 ") and done.stdout.endswith("\nstatus=0\n"), done.stdout
    assert not any(word in done.stderr for word in QUIET_STDERR), done.stderr
    assert sorted(os.listdir(tmp_path)) == ["p.adam.safetensors", "p.safetensors"]


@contextlib.contextmanager
def stdout_whose_reader_left():
    """sys.stdout on a real pipe whose reader has closed it, in this process."""
    read, write = os.pipe()
    os.close(read)
    saved = sys.stdout
    sys.stdout = io.TextIOWrapper(io.FileIO(write, "w"), encoding="utf-8")
    try:
        yield
    finally:
        stream, sys.stdout = sys.stdout, saved
        with contextlib.suppress(OSError):
            stream.close()


def command_lines(tmp_path):
    """One command line per command that prints, each with what it needs (its exit status when all is well)."""
    model = tmp_path / "model.safetensors"
    weights.save(model, weights.init_weights(SMALL, 0), SMALL)
    history = tmp_path / "h.json"
    History("numpy", SMALL, TrainConfig(), [2.0, 1.0], [1.5], 0.1).save(history)
    tiny = ["--n-heads", "2", "--d-model", "8", "--seq-len", "3", "--vocab-size", "5"]
    return {
        "demo": None,  # starts a process per backend: the trainers' own command lines, tested above
        "train": ["train", "--backend", names("train")[0], "--epochs", "1", "--n-sequences", "32", "--history", str(tmp_path / "t.json")],
        "diff": ["diff", "model"],
        "heads": ["heads", "--load", str(model)],
        "parity": ["parity", "--epochs", "0", "--dp", "0", "--no-decode", "--samples", "1", "--no-jax-cache", *tiny],
        "generate": ["generate", "--load", str(model), "--prompt", "3,3", "--max-new-tokens", "2"],
        "port-check": ["port-check", "examples.torch_block:block", "examples.flax_block:block"],
        "compare": ["compare", str(history), str(history)],
        "bind": None,  # prints one line after its one write: tests/tools/test_bind.py runs it
        "bench": ["bench", "--quick", "--repeats", "1", "generate"],
    }


@pytest.mark.timeout(300)
@pytest.mark.slow  # every command run whole
def test_every_command_that_prints_finishes_its_work_when_its_reader_has_left(tmp_path, capsys):
    lines = command_lines(tmp_path)
    assert set(lines) == set(COMMANDS), "a command was added: give it a command line here"
    for command, argv in lines.items():
        if argv is None:
            continue
        with stdout_whose_reader_left():
            status = main(argv)
        assert status == 0, (command, capsys.readouterr().err)
        err = capsys.readouterr().err
        assert not any(word in err for word in QUIET_STDERR), (command, err)
    assert json.loads((tmp_path / "t.json").read_text())["losses"]  # train wrote its file


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "argv", [["-m", "mhsa.cli", "--help"], ["-m", "mhsa.cli", "train", "--help"], ["-m", f"{package(names('train')[0])}.train", "--help"]]
)
def test_help_into_a_closed_pipe_exits_0_without_a_word_at_exit(argv):
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, *argv], cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True, timeout=100)
    finally:
        os.close(write)
    assert done.returncode == 0 and done.stderr == "", done.stderr
