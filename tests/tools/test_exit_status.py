"""Every command's exit status for each kind of ending that applies to it (docs/exit-status.md,
named in mhsa/exit_status.py): a flag its parser refuses (2, its usage, then one line), a file it
cannot use (2, the one line alone), a check that found a difference (1), a Ctrl-C or SIGTERM while
it runs (130, 143, one line). A parity check's planted fault: tests/tools/test_parity.py; the
signals as a terminal and `timeout` send them to a command's whole process group, and what each
trainer keeps: tests/tools/test_interrupt.py."""

import importlib
import json
import os
import signal
import time

import pytest

from mhsa import bench
from mhsa.cli import COMMANDS, main
from mhsa.exit_status import DIFFERENT, TROUBLE
from shared.config import TrainConfig
from shared.history import History
from tests.backends import SMALL, names
from tests.commands import refused, run_cli

# every argv a command accepts, so that the one flag added to it is the only thing wrong
VALID = {
    "demo": [],
    "train": ["--backend", names("train")[0]],
    "diff": ["model"],
    "heads": ["--load", "x.safetensors"],
    "parity": [],
    "generate": ["--load", "x.safetensors", "--prompt", "1"],
    "port-check": ["a:b", "c:d"],
    "compare": ["a.json", "b.json"],
    "bind": ["x.safetensors"],
    "bench": [],
}


def test_every_command_has_an_argv_to_break():
    assert sorted(VALID) == sorted(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unknown_flag_is_refused_with_the_commands_own_usage(capsys, command):
    err = refused(capsys, command, *VALID[command], "--no-such-flag")
    assert err.startswith(f"usage: mhsa {command} ")
    assert err.splitlines()[-1] == f"mhsa {command}: error: unrecognized arguments: --no-such-flag"


def status_of(capsys, argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `mhsa ARGV` run in this process."""
    try:
        status = main(argv)
    except SystemExit as exit:  # argparse's own refusals
        status = exit.code
    out, err = capsys.readouterr()
    return status, out, err


def _missing_file_argv(command: str, missing: str) -> list[str]:
    """An argv of `command` whose one fault is a file that is not there (an output's folder for
    diff, the benchmarks' folder for bench)."""
    return {
        "train": ["train", "--backend", names("train")[0], "--load", missing],
        "diff": ["diff", "attention", "--html", f"{missing}/page.html"],
        "heads": ["heads", "--load", missing],
        "generate": ["generate", "--load", missing, "--prompt", "1,2"],
        "compare": ["compare", missing, missing],
        "bind": ["bind", missing],
        "bench": ["bench", "attention"],
    }[command]


READS_OR_WRITES_FILES = ["train", "diff", "heads", "generate", "compare", "bind", "bench"]


@pytest.mark.parametrize("command", READS_OR_WRITES_FILES)
def test_a_missing_file_is_one_line_and_exit_2_in_every_command(capsys, monkeypatch, tmp_path, command):
    missing = str(tmp_path / "missing.safetensors")
    monkeypatch.setattr(bench, "benchmarks_folder", lambda: tmp_path / "no-benchmarks")
    status, out, err = status_of(capsys, _missing_file_argv(command, missing))
    assert status == TROUBLE, (status, err)
    assert out == "" and len(err.splitlines()) == 1 and err.startswith(f"mhsa {command}: "), err


def test_commands_without_files_to_read_are_the_others():
    # demo, parity and port-check read no file a user names (port-check's factories are modules: a flag)
    assert sorted(set(COMMANDS) - set(READS_OR_WRITES_FILES)) == ["demo", "parity", "port-check"]


@pytest.mark.parametrize("backend", names("train"))
def test_a_trainers_unusable_file_is_one_line_and_exit_2(tmp_path, backend):
    (tmp_path / "cut.safetensors").write_bytes(b"garbage")
    done = run_cli(backend, "--load", "cut.safetensors", cwd=tmp_path)
    assert done.returncode == TROUBLE and done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr


def test_a_history_that_is_not_one_is_exit_2_not_a_difference(capsys, tmp_path):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    History("numpy", SMALL, TrainConfig(), [1.0], [1.0], 0.1).save(good)
    bad.write_text(json.dumps({**json.loads(good.read_text()), "losses": ["1.0"]}))
    assert status_of(capsys, ["compare", str(good), str(bad)])[0] == TROUBLE


def test_compare_that_finds_a_difference_exits_1(capsys, tmp_path):
    paths = []
    for name, losses in (("a", [3.0, 2.0, 1.0]), ("b", [3.0, 2.5, 1.0])):
        History("torch", SMALL, TrainConfig(), losses, [1.0], 1.0).save(tmp_path / f"{name}.json")
        paths.append(str(tmp_path / f"{name}.json"))
    status, out, err = status_of(capsys, ["compare", *paths])
    assert status == DIFFERENT and err == "", err


@pytest.mark.slow  # builds, transfers and runs both models (about 20 s)
def test_port_check_that_finds_a_difference_exits_1(capsys):
    status, out, err = status_of(capsys, ["port-check", "examples.torch_block:block", "examples.flax_block:naive_block"])
    assert status == DIFFERENT and "FAIL" in out, (status, err)


@pytest.fixture
def shell_handlers():
    """The Ctrl-C and SIGTERM handlers of a process started from a shell, whatever the test runner
    set; the runner's back after the test."""
    previous = {
        number: signal.signal(number, handler) for number, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL))
    }
    yield
    for number, handler in previous.items():
        signal.signal(number, handler)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_signal_while_a_command_runs_is_one_line_and_128_plus_its_number(capsys, monkeypatch, shell_handlers, command, signum):
    def signalled_while_running(args):
        os.kill(os.getpid(), signum)
        time.sleep(10)  # the signal's KeyboardInterrupt ends this long before
        raise AssertionError(f"{signal.Signals(signum).name} did not interrupt mhsa {command}")

    monkeypatch.setattr(importlib.import_module(COMMANDS[command][0]), "run", signalled_while_running)
    try:
        status, out, err = status_of(capsys, [command, *VALID[command]])
    except KeyboardInterrupt:
        pytest.fail(f"mhsa {command} let {signal.Signals(signum).name} through as a KeyboardInterrupt")
    said = "interrupted" if signum == signal.SIGINT else "interrupted by SIGTERM"
    assert (status, out, err) == (128 + signum, "", f"{said}\n")
