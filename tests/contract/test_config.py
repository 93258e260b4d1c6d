"""ModelConfig and TrainConfig: validation errors that name the value and what was expected,
JSON round trips."""

import json
import re

import pytest

from shared.config import ModelConfig, TrainConfig


def test_d_head_is_d_model_split_over_the_heads():
    for config in (ModelConfig(), ModelConfig(d_model=24, n_heads=4), ModelConfig(d_model=30, n_heads=5)):
        assert config.d_head * config.n_heads == config.d_model


BAD_SIZES = {
    "30 % 4": (
        {"d_model": 30, "n_heads": 4},
        ValueError,
        "d_model=30 is not divisible by n_heads=4; d_model must be a multiple of n_heads (d_head = d_model // n_heads)",
    ),
    **{
        f"{field} {value}": ({field: value}, ValueError, f"{field} must be a positive integer, got {value}")
        for field in ("d_model", "n_heads", "max_len")  # the block's own sizes: the block's message
        for value in (0, -3)
    },
    **{
        f"vocab_size {value}": ({"vocab_size": value}, ValueError, f"ModelConfig.vocab_size must be a positive integer, got {value}")
        for value in (0, -3)
    },
    "d_model 24.0": ({"d_model": 24.0}, TypeError, "d_model must be an int, got 24.0 (float)"),
}


@pytest.mark.parametrize("case", BAD_SIZES, ids=str)
def test_bad_sizes_name_the_value_and_what_was_expected(case):
    sizes, error, message = BAD_SIZES[case]
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        ModelConfig(**sizes)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"epochs": 0}, r"epochs must be a positive integer, got 0"),
        ({"batch_size": -1}, r"batch_size must be a positive integer, got -1"),
        ({"lr": 0.0}, r"lr must be a positive finite number, got 0.0"),
        ({"lr": float("nan")}, r"lr must be a positive finite number, got nan"),
        ({"betas": (0.9, 1.0)}, r"betas must be two numbers in \[0, 1\)"),
        ({"dtype": "float16"}, r"dtype must be one of float32, float64; got 'float16'"),
        ({"seed": -1}, r"seed must be an integer in \[0, 2\*\*32 - 1\], got -1"),
        ({"seed": 2**32}, r"seed must be an integer in \[0, 2\*\*32 - 1\], got 4294967296"),
    ],
)
def test_train_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


def test_configs_are_frozen():
    with pytest.raises(AttributeError):
        ModelConfig().d_model = 64


def test_json_round_trip():
    model = ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=5, bias=False)
    train = TrainConfig(epochs=2, lr=3e-3, betas=(0.8, 0.95), dtype="float64")
    assert ModelConfig.from_dict(json.loads(json.dumps(model.to_dict()))) == model
    assert TrainConfig.from_dict(json.loads(json.dumps(train.to_dict()))) == train


def test_unknown_field_is_refused():
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['heads'\]"):
        ModelConfig.from_dict({"heads": 4})
