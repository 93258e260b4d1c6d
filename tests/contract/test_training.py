"""What every trainer shares (shared/training.py) and checks before any work: the device a run
is asked for and how a data-parallel run splits. Each trainer's own use of them:
tests/implementations/test_device.py and test_parallel.py."""

import pytest

from shared import training
from shared.config import TrainConfig
from shared.training import check_device


def test_check_device_names_the_value_and_what_was_expected():
    assert check_device("cpu") == "cpu" and check_device("cuda") == "cuda" and check_device("cpu", dp=4) == "cpu"
    with pytest.raises(ValueError, match=r"^device 'tpu': expected one of cpu, cuda$"):
        check_device("tpu")
    with pytest.raises(ValueError, match=r"^device 'cuda' with dp=2: the data-parallel trainers run their ranks on CPU devices only$"):
        check_device("cuda", dp=2)


def test_a_dp_that_is_not_an_int_is_a_type_error():
    with pytest.raises(TypeError, match=r"dp must be an int, got 2.0 \(float\)"):
        training.check_data_parallel(TrainConfig(batch_size=12), 2.0)
