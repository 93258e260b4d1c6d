"""ModelConfig and TrainConfig: defaults, validation errors, JSON round trips."""

import json

import pytest

from shared.config import ModelConfig, TrainConfig


def test_defaults_match_the_lesson():
    config = ModelConfig()
    assert (config.vocab_size, config.d_model, config.n_heads, config.max_len, config.bias) == (64, 32, 4, 12, True)
    assert config.d_head == 8
    assert ModelConfig(d_model=24, n_heads=4).d_head == 6


def test_indivisible_heads_name_both_numbers():
    with pytest.raises(ValueError, match=r"d_model=30.*n_heads=4"):
        ModelConfig(d_model=30, n_heads=4)


@pytest.mark.parametrize("field", ["vocab_size", "d_model", "n_heads", "max_len"])
@pytest.mark.parametrize("value", [0, -3])
def test_non_positive_sizes_are_refused(field, value):
    with pytest.raises(ValueError, match=rf"{field} must be a positive integer, got {value}"):
        ModelConfig(**{field: value})


def test_non_integer_size_is_a_type_error():
    with pytest.raises(TypeError, match=r"d_model must be an int, got 32.0"):
        ModelConfig(d_model=32.0)


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
