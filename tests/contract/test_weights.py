"""The exchange format: shapes, init, safetensors round trip, validation errors, refusals."""

import json
import os
import pickle

import numpy as np
import pytest

from shared import weights
from shared.config import ModelConfig

CONFIG = ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=5)


def test_param_shapes_follow_the_torch_state_dict():
    shapes = weights.param_shapes(CONFIG)
    assert shapes == {
        "tok_emb.weight": (11, 24),
        "pos_emb.weight": (5, 24),
        "attn.qkv_proj.weight": (72, 24),
        "attn.qkv_proj.bias": (72,),
        "attn.out_proj.weight": (24, 24),
        "attn.out_proj.bias": (24,),
        "lm_head.weight": (11, 24),
        "lm_head.bias": (11,),
    }
    no_bias = weights.param_shapes(ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=5, bias=False))
    assert not any(name.endswith("bias") for name in no_bias)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_init_is_deterministic_and_torch_like(dtype):
    a = weights.init_weights(CONFIG, seed=0, dtype=dtype)
    b = weights.init_weights(CONFIG, seed=0, dtype=dtype)
    c = weights.init_weights(CONFIG, seed=1, dtype=dtype)
    assert weights.validate(a, CONFIG) == dtype
    assert all((a[name] == b[name]).all() for name in a)
    assert not (a["attn.qkv_proj.weight"] == c["attn.qkv_proj.weight"]).all()
    bound = 1 / np.sqrt(24)
    for name in ("attn.qkv_proj.weight", "attn.out_proj.bias", "lm_head.weight"):
        assert np.abs(a[name]).max() <= bound and np.abs(a[name]).max() > 0.8 * bound
    assert 0.8 < a["tok_emb.weight"].std() < 1.2  # N(0, 1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_save_load_round_trip_is_bit_identical(tmp_path, dtype):
    arrays = weights.init_weights(CONFIG, seed=3, dtype=dtype)
    path = tmp_path / "model.safetensors"
    weights.save(path, arrays, CONFIG)
    loaded, config = weights.load(path)
    assert config == CONFIG
    assert set(loaded) == set(arrays)
    for name in arrays:
        assert loaded[name].dtype == arrays[name].dtype
        assert loaded[name].tobytes() == arrays[name].tobytes()
    assert os.listdir(tmp_path) == ["model.safetensors"]  # no temporary left behind


def test_validate_missing_key():
    arrays = weights.init_weights(CONFIG, 0)
    del arrays["attn.out_proj.bias"]
    with pytest.raises(ValueError, match=r"missing key\(s\) 'attn.out_proj.bias' \(24,\)"):
        weights.validate(arrays, CONFIG)


def test_validate_extra_key():
    arrays = weights.init_weights(CONFIG, 0)
    arrays["attn.causal_mask"] = np.ones((5, 5), np.float32)
    with pytest.raises(ValueError, match=r"unexpected key\(s\) \['attn.causal_mask'\]"):
        weights.validate(arrays, CONFIG)


def test_validate_wrong_shape_names_key_expected_and_actual():
    arrays = weights.init_weights(CONFIG, 0)
    arrays["attn.qkv_proj.weight"] = arrays["attn.qkv_proj.weight"].T
    with pytest.raises(ValueError, match=r"'attn.qkv_proj.weight'\] has shape \(24, 72\), expected \(72, 24\).*transposed"):
        weights.validate(arrays, CONFIG)


def test_validate_wrong_dtype():
    arrays = weights.init_weights(CONFIG, 0)
    arrays["lm_head.bias"] = arrays["lm_head.bias"].astype(np.float16)
    with pytest.raises(ValueError, match=r"'lm_head.bias'\] has dtype float16, expected one of float32, float64"):
        weights.validate(arrays, CONFIG)
    arrays["lm_head.bias"] = arrays["lm_head.bias"].astype(np.float64)
    with pytest.raises(ValueError, match=r"mix dtypes"):
        weights.validate(arrays, CONFIG)
    with pytest.raises(ValueError, match=r"weights are float32, expected float64"):
        weights.validate(weights.init_weights(CONFIG, 0), CONFIG, dtype="float64")


def test_pickle_under_safetensors_name_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "model.safetensors"
    path.write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ValueError, match=r"not a safetensors file.*never unpickled"):
        weights.load(path)
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"garbage!", b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!"])
def test_garbage_and_empty_files_are_refused(tmp_path, content):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"is not a safetensors file"):
        weights.load(path)


def test_plain_safetensors_without_config_is_refused(tmp_path):
    import safetensors.numpy

    path = tmp_path / "plain.safetensors"
    safetensors.numpy.save_file(weights.init_weights(CONFIG, 0), str(path))
    with pytest.raises(ValueError, match=r"not in the mhsa-exchange format"):
        weights.load(path)


def test_load_refuses_a_config_other_than_expected(tmp_path):
    path = tmp_path / "model.safetensors"
    weights.save(path, weights.init_weights(CONFIG, 0), CONFIG)
    other = ModelConfig(vocab_size=11, d_model=24, n_heads=6, max_len=5)
    with pytest.raises(ValueError, match=r"different model config: n_heads=4 \(expected 6\)"):
        weights.load(path, expect=other)


def test_metadata_holds_the_config_as_json(tmp_path):
    path = tmp_path / "model.safetensors"
    weights.save(path, weights.init_weights(CONFIG, 0), CONFIG)
    raw = path.read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    assert json.loads(header["__metadata__"]["config"]) == CONFIG.to_dict()
