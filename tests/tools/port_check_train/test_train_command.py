"""`mhsa port-check TORCH_FACTORY FLAX_FACTORY --train N`: exit 0 when every step agrees, 1 when
the trainings part or a setting differs, 2 on a flag error (the usage, then one line) or a factory
it cannot use (one line)."""

import argparse
import json
import subprocess
import sys

import pytest

from mhsa.port_check import command
from tests.paths import ROOT

MODELS = "tests.tools.port_check_train.models"


def port_check(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mhsa port-check")
    command.add_arguments(parser)
    return command.run(parser.parse_args(argv))


@pytest.mark.slow  # the command, twice: trainings in float32 and float64
def test_a_matched_pair_exits_0_and_a_planted_default_exits_1_naming_it(capsys):
    assert port_check([f"{MODELS}:torch_adamw", f"{MODELS}:flax_adamw", "--train", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mhsa port-check --train 3 · TorchMLP (torch, AdamW) vs FlaxMLP (jax, optax) · float32")
    assert "PASS: all 3 steps agree" in out
    assert port_check([f"{MODELS}:torch_adamw", f"{MODELS}:flax_adamw_default_decay", "--train", "3"]) == 1
    out = capsys.readouterr().out
    assert "optimizer lint: 1 difference(s)\n  weight decay: optax.adamw's default weight_decay is 0.0001, torch AdamW's 0.01" in out
    assert "<- the trainings part here" in out.split("\n|    1 |")[1].splitlines()[0]
    assert "FAIL: the trainings part at step 1, at ln.weight" in out


def test_a_renamed_module_pairs_by_structure_or_through_the_map_and_an_unpaired_parameter_stops_it(tmp_path, capsys):
    name_map = tmp_path / "map.json"
    name_map.write_text(json.dumps({"ln": "norm"}))
    assert port_check([f"{MODELS}:torch_adamw", f"{MODELS}:flax_adamw_renamed", "--train", "2", "--map", str(name_map), "--no-probes"]) == 0
    assert "weights: 6 parameters copied torch -> jax" in capsys.readouterr().out
    assert port_check([f"{MODELS}:torch_adamw", f"{MODELS}:flax_adamw_renamed", "--train", "2", "--no-probes"]) == 0
    out = capsys.readouterr().out
    assert "weights: 6 parameters copied torch -> jax before step 1\n  modules under other names in jax: ln -> norm" in out, out
    # a reference parameter the port has no room for: no training is compared, in one line
    assert port_check([f"{MODELS}:torch_adamw", f"{MODELS}:flax_adamw_no_bias", "--train", "2", "--no-probes"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        "mhsa port-check: error: 1 parameter of the reference (torch) pairs with none of the port's (jax): fc1.bias\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([f"{MODELS}:torch_adamw", f"{MODELS}:flax_adamw", "--train", "2", "--input-shape", "3,7"], "--input-shape: not with --train"),
        ([f"{MODELS}:torch_adamw", f"{MODELS}:flax_adamw", "--train", "2", "--no-transfer", "--grads"], "--no-transfer, --grads: not with --train"),
        ([f"{MODELS}:torch_adamw", f"{MODELS}:flax_adamw", "--train", "2", "--write-map", "m.json"], "--write-map: not with --train"),
        ([f"{MODELS}:torch_adamw", f"{MODELS}:flax_adamw", "--train", "0"], "argument --train: expected an integer in [1, 100000], got 0"),
    ],
)
def test_a_usage_error_exits_2_with_the_usage_and_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        port_check(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: mhsa port-check ") and message in err.splitlines()[-1], err
    assert err.splitlines()[-1].startswith("mhsa port-check: error: ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["examples.torch_block:block", f"{MODELS}:flax_adamw", "--train", "2"],
            "the reference factory returned tuple; with --train it must return a mapping",
        ),
        ([f"{MODELS}:torch_adamw", f"{MODELS}:nothing", "--train", "2"], f"cannot load factory '{MODELS}:nothing'"),
    ],
)
def test_a_factory_the_check_cannot_use_exits_2_with_one_line_and_no_usage(argv, message, capsys):
    assert port_check(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("mhsa port-check: error: ") and message in err and err.count("\n") == 1, err


def test_a_factory_that_raises_exits_2_with_one_line_naming_it(capsys):
    assert port_check([f"{MODELS}:torch_adamw", f"{MODELS}:raising", "--train", "2"]) == 2
    err = capsys.readouterr().err
    said = f"mhsa port-check: error: FLAX_FACTORY '{MODELS}:raising' raised RuntimeError: no such checkpoint: model.pt (at "
    assert err.startswith(said) and err.count("\n") == 1, err


@pytest.mark.slow
def test_mhsa_port_check_runs_the_training_check_with_train():
    argv = [sys.executable, "-m", "mhsa.cli", "port-check", f"{MODELS}:torch_adamw", f"{MODELS}:flax_adamw", "--train", "2", "--no-probes"]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("mhsa port-check --train 2 · TorchMLP (torch, AdamW) vs FlaxMLP (jax, optax) · float32")


@pytest.mark.slow
def test_the_commands_parser_takes_the_train_flag_without_starting_a_framework():
    code = "import sys, mhsa.port_check.command; print(sorted(m for m in ('torch', 'jax', 'flax', 'optax') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
