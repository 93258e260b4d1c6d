"""The mhsa command itself: --version, and --help that answers without loading a framework
(every command, and `python -m PACKAGE.train --help` of every trainer)."""

import subprocess
import sys

import pytest

from mhsa.cli import COMMANDS, main
from tests.backends import names, package
from tests.commands import refused

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


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_of_every_command_loads_no_framework(command):
    assert imported_frameworks("from mhsa.cli import main; sys.exit(main(sys.argv[1:]))", [command, "--help"]) == []


@pytest.mark.parametrize("name", names("train"))
def test_help_of_every_trainer_loads_no_framework(name):
    call = f"runpy.run_module('{package(name)}.train', run_name='__main__')"
    assert imported_frameworks(call, ["--help"]) == []


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


def test_a_long_row_is_cut_and_the_title_says_so(tmp_path, capsys):
    name = names("train")[0]
    assert main(["train", "--backend", name, "--seq-len", "20", "--epochs", "1", "--n-sequences", "64", "--plot", str(tmp_path / "run.png")]) == 0
    out = capsys.readouterr().out
    assert f"{name} · head 0 of 4 · attention weights on the first 12 of 20 positions of a copy-task row" in out
    assert (tmp_path / "run.png").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        ("generate --load x --max-new-tokens 70000", "--max-new-tokens: expected an integer in [0, 65536], got 70000"),
        ("generate --load x --seed 4294967296", "--seed: expected an integer in [0, 4294967295], got 4294967296"),
        ("port-check a:b c:d --int-range 0", "--int-range: expected an integer in [1, 2147483647], got 0"),
        ("bench --repeats 0", "--repeats: expected an integer in [1, 1000], got 0"),
    ],
)
def test_integer_flags_of_the_other_commands_keep_their_documented_range(capsys, argv, message):
    with pytest.raises(SystemExit) as exit:
        main(argv.split())
    assert exit.value.code == 2 and message in capsys.readouterr().err


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


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_unknown_flag_is_refused_with_the_commands_own_usage(capsys, command):
    err = refused(capsys, command, *VALID[command], "--no-such-flag")
    assert err.startswith(f"usage: mhsa {command} ")
    assert err.splitlines()[-1] == f"mhsa {command}: error: unrecognized arguments: --no-such-flag"


def test_generate_and_heads_refuse_a_flag_the_model_contradicts_with_their_usage(capsys, tmp_path):
    from shared.weights import init_weights, save
    from tests.backends import SMALL

    path = tmp_path / "model.safetensors"
    save(path, init_weights(SMALL, 0), SMALL)
    for argv, message in [
        (["generate", "--load", str(path), "--prompt", "1", "--heatmap-head", "4"], "--heatmap-head 4 is out of range: the model has 4 heads (0..3)"),
        (["generate", "--load", str(path), "--prompt", "11"], "token id 11 is out of range: ids must lie in [0, 11) for vocab_size=11"),
        (["heads", "--load", str(path), "--tokens", "1,1,1,1,1,1,1,1"], "--tokens gives 8 ids, more than the model's max_len=7"),
        (["heads", "--load", str(path), "--tokens", "11"], "token id 11 is out of range: ids must lie in [0, 11) for vocab_size=11"),
    ]:
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"usage: mhsa {argv[0]} ") and err.splitlines()[-1] == f"mhsa {argv[0]}: error: {message}", err
