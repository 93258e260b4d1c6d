"""The mhsa command itself and what every command shares: --version; --help that answers without
loading a framework (every command, and `python -m PACKAGE.train --help` of every trainer); help
text for every flag; --threads where a command computes; weights holding NaN or infinities refused alike by every command that reads
them. The integer flags' ranges: test_flags.py."""

import subprocess
import sys

import numpy as np
import pytest

from mhsa.cli import COMMANDS, main
from shared import checkpoint
from shared.adam_state import AdamState
from shared.config import TrainConfig
from shared.weights import init_weights
from tests.backends import SMALL, names, package

FRAMEWORKS = ("flax", "jax", "optax", "torch")  # the framework modules, not the backends

# runs one entry point's --help in a fresh interpreter and prints which frameworks it imported
PROBE = """
import runpy, sys
sys.argv = [sys.argv[0], *{argv!r}]
try:
    {call}
except SystemExit as exit:
    assert exit.code == 0, exit.code
print(sorted(name for name in {frameworks!r} if name in sys.modules))
"""


def imported_frameworks(call: str, argv: list[str]) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(call=call, argv=argv, frameworks=FRAMEWORKS)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
    return eval(result.stdout.strip().splitlines()[-1])


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("mhsa ") and out.split()[1][0].isdigit()


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_of_every_command_loads_no_framework(command):
    assert imported_frameworks("from mhsa.cli import main; sys.exit(main(sys.argv[1:]))", [command, "--help"]) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", names("train"))
def test_help_of_every_trainer_loads_no_framework(name):
    call = f"runpy.run_module('{package(name)}.train', run_name='__main__')"
    assert imported_frameworks(call, ["--help"]) == []


@pytest.mark.slow
def test_the_probe_sees_a_framework_when_one_is_imported():
    # the check above can fail: a help that imports torch first is caught
    call = "import torch; from mhsa.cli import main; sys.exit(main(sys.argv[1:]))"
    assert "torch" in imported_frameworks(call, ["--help"])


THREADS_PROBE = """
import os, sys
from mhsa.threads import apply_threads
apply_threads(int(sys.argv[1]))
import torch
from threadpoolctl import threadpool_info
blas = {{pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}}
print(torch.get_num_threads(), sorted(blas), "{flag}" in os.environ.get("XLA_FLAGS", ""))
"""


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_threads_limits_torch_blas_and_xla(threads):
    from mhsa.threads import XLA_SINGLE_THREAD

    code = THREADS_PROBE.format(flag=XLA_SINGLE_THREAD)
    result = subprocess.run([sys.executable, "-c", code, str(threads)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    torch_threads, blas, xla_single = result.stdout.split(" ", 1)[0], result.stdout.split("[")[1].split("]")[0], result.stdout.split()[-1]
    assert int(torch_threads) == threads
    assert blas == str(threads)  # NumPy's OpenBLAS
    assert xla_single == str(threads == 1)  # XLA: single-threaded only for 1


def test_threads_is_a_flag_of_every_command_that_computes(capsys):
    for command in ("train --backend numpy", "parity", "heads --load x", "generate", "port-check"):
        with pytest.raises(SystemExit):
            main([*command.split(), "--threads", "0"])
        assert "--threads: expected an integer in [1, 1024], got 0" in capsys.readouterr().err, command


def test_every_flag_of_every_command_has_help_text():
    import argparse
    import importlib

    for command, (module_name, _) in COMMANDS.items():
        parser = argparse.ArgumentParser(prog=command)
        importlib.import_module(module_name).add_arguments(parser)
        silent = [action.dest for action in parser._actions if action.help is None or not action.help.strip()]
        assert silent == [], f"mhsa {command}: no help text for {silent}"


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["NaN", "Inf"])
@pytest.mark.parametrize("command", ["train --resume", "generate", "heads"])  # train --load: test_train_cli.py, per backend
def test_non_finite_weights_are_refused_alike_by_every_command_that_reads_them(capsys, tmp_path, command, bad):
    path = tmp_path / "bad.safetensors"
    arrays = init_weights(SMALL, 0)
    arrays["attn.out_proj.weight"][1, 2] = bad
    run = TrainConfig(epochs=1, n_sequences=64)
    moments = {name: np.zeros_like(value) for name, value in arrays.items()}
    checkpoint.save(path, arrays, AdamState(run.steps_per_epoch, 1, moments, moments, run), SMALL)
    argv = {
        "train --resume": ["train", "--backend", names("train")[0], "--resume", str(path), "--epochs", "2", "--n-sequences", "64"],
        "generate": ["generate", "--load", str(path), "--prompt", "1,1", "--max-new-tokens", "2"],
        "heads": ["heads", "--load", str(path)],
    }[command]
    try:
        status = main(argv)
    except SystemExit as exit:  # train refuses a file among its flags, through argparse
        status = exit.code
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    message = f"weights file {str(path)!r} holds NaN or infinite values in ['attn.out_proj.weight']; refusing to use it"
    assert err.splitlines()[-1] == f"mhsa {command.split()[0]}: error: {message}"
