"""Where a run computes: `--device {cpu,cuda}` (capability "device") and `--full-precision` of the
train command, each refused before any work where it cannot apply. The GPU path itself needs a
GPU; on a machine without one the refusal is what is tested."""

import json
import re

import pytest

from mhsa import registry
from mhsa.cli import main
from mhsa.train_cli import full_precision
from shared.config import TrainConfig
from shared.training import DEVICES, check_device
from tests.backends import SMALL, names
from tests.commands import refused

TINY = ["--quiet", "--epochs", "1", "--n-sequences", "40", "--batch-size", "8"]
TINY += ["--d-model", "8", "--n-heads", "2", "--seq-len", "5", "--vocab-size", "7"]


def test_check_device_names_the_value_and_what_was_expected():
    assert check_device("cpu") == "cpu" and check_device("cuda") == "cuda" and check_device("cpu", dp=4) == "cpu"
    with pytest.raises(ValueError, match=r"^device 'tpu': expected one of cpu, cuda$"):
        check_device("tpu")
    with pytest.raises(ValueError, match=r"^device 'cuda' with dp=2: the data-parallel trainers run their ranks on CPU devices only$"):
        check_device("cuda", dp=2)


@pytest.mark.parametrize("name", [name for name in names("train") if "device" not in registry.get(name).supports])
def test_a_cpu_only_backend_refuses_cuda_before_any_work(capsys, name):
    err = refused(capsys, "train", "--backend", name, "--device", "cuda")
    assert f"--device cuda: the {name} backend runs on the CPU only" in err


@pytest.mark.parametrize("name", names("device"))
def test_cuda_with_data_parallel_is_refused_before_any_work(capsys, name):
    err = refused(capsys, "train", "--backend", name, "--device", "cuda", "--dp", "2")
    assert "device 'cuda' with dp=2: the data-parallel trainers run their ranks on CPU devices only" in err


def test_an_unknown_device_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["train", "--backend", names("train")[0], "--device", "tpu"])
    assert exit.value.code == 2
    assert "argument --device: invalid choice: 'tpu' (choose from " in capsys.readouterr().err


@pytest.mark.parametrize("name", names("device"))
def test_a_trainer_checks_its_device_before_any_work(monkeypatch, name):
    trainer = registry.get(name).train
    monkeypatch.setattr(trainer.training, "initial_weights", _no_work)
    with pytest.raises(ValueError, match=f"^{re.escape('device ' + repr('tpu') + ': expected one of cpu, cuda')}$"):
        trainer.train(SMALL, TrainConfig(), device="tpu")


@pytest.mark.parametrize("name", names("device"))
def test_cuda_where_the_framework_sees_no_gpu_is_refused_before_any_work(monkeypatch, capsys, name):
    trainer = registry.get(name).train
    try:
        registry.get(name).module("device").resolve("cuda")
    except ValueError:
        pass
    else:
        pytest.skip(f"{name} sees a CUDA device here")
    monkeypatch.setattr(trainer.training, "initial_weights", _no_work)
    with pytest.raises(ValueError, match=f"^device 'cuda': {name} sees no CUDA device \\({name} "):
        trainer.train(SMALL, TrainConfig(), on_step=_no_work, device="cuda")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:  # and the command line refuses it before any work, as a bad flag
        main(["train", "--backend", name, "--device", "cuda", "--quiet"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: mhsa train "), err
    assert err.splitlines()[-1].startswith(f"mhsa train: error: device 'cuda': {name} sees no CUDA device"), err


def _no_work(*args, **kwargs):
    raise AssertionError("train() started work before checking its device")


def test_devices_are_the_flag_choices():
    assert DEVICES == ("cpu", "cuda")


@pytest.mark.parametrize("name", names("device"))
def test_full_precision_sets_what_parity_sets_for_the_run_and_restores_it(name):
    before = _precision_settings()
    with full_precision(registry.get(name), True):
        torch_tf32, cudnn_tf32, torch_precision, jax_precision = _precision_settings()
        if name == "torch":
            assert (torch_tf32, cudnn_tf32, torch_precision) == (False, False, "highest")
        else:
            assert jax_precision == "highest"
    assert _precision_settings() == before
    with full_precision(registry.get(name), False):
        assert _precision_settings() == before


# a framework that compiles per precision setting (capability "jit") would compile the run twice;
# the settings test above covers it
@pytest.mark.parametrize("name", [name for name in names("train") if "jit" not in registry.get(name).supports])
def test_full_precision_trains_the_same_run_on_a_cpu(tmp_path, capsys, monkeypatch, name):
    """The run is trained inside full_precision; on a CPU float32 matmuls are always full
    precision, so the flag changes no loss."""
    from mhsa import train_cli

    asked = []
    monkeypatch.setattr(train_cli, "full_precision", lambda backend, flag: asked.append(flag) or full_precision(backend, flag))
    losses = {}
    for flag in ([], ["--full-precision"]):
        path = tmp_path / f"history{len(flag)}.json"
        assert main(["train", "--backend", name, *TINY, "--history", str(path), *flag]) == 0
        losses[bool(flag)] = json.loads(path.read_text())["losses"]
    capsys.readouterr()
    assert asked == [False, True]
    assert losses[True] == losses[False], f"{name}: --full-precision changed the losses on a CPU"


def _precision_settings() -> tuple:
    import jax
    import torch

    return (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
        jax.config.jax_default_matmul_precision,
    )
