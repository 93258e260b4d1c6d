"""Where a trainer computes (capability "device"): train(..., device=...) checks the device before
any work, and "cuda" where the framework sees no GPU is refused in one line. The GPU path itself
needs a GPU; on a machine without one the refusal is what is tested. The command's --device and
--full-precision: tests/tools/test_train_cli.py."""

import re

import pytest

from mhsa import registry
from shared.config import TrainConfig
from tests.backends import SMALL, names, skip_where_cuda_is_seen


def _no_work(*args, **kwargs):
    raise AssertionError("train() started work before checking its device")


@pytest.mark.parametrize("name", names("device"))
def test_a_trainer_checks_its_device_before_any_work(monkeypatch, name):
    trainer = registry.get(name).train
    monkeypatch.setattr(trainer.training, "initial_weights", _no_work)
    with pytest.raises(ValueError, match=f"^{re.escape('device ' + repr('tpu') + ': expected one of cpu, cuda')}$"):
        trainer.train(SMALL, TrainConfig(), device="tpu")


@pytest.mark.parametrize("name", names("device"))
def test_cuda_where_the_framework_sees_no_gpu_is_refused_before_any_work(monkeypatch, name):
    trainer = registry.get(name).train
    skip_where_cuda_is_seen(name)
    monkeypatch.setattr(trainer.training, "initial_weights", _no_work)
    with pytest.raises(ValueError, match=f"^device 'cuda': {name} sees no CUDA device \\({name} "):
        trainer.train(SMALL, TrainConfig(), on_step=_no_work, device="cuda")
