"""The exchange format (shared/weights.py): its names and shapes, init, the safetensors round
trip, and every refusal of a weight dict or a weights file: a missing or extra key, a wrong shape
or dtype, a config that disagrees, an empty, truncated, crafted or pickled file, each named in one
line before anything is unpickled or more than the header is read."""

import errno
import json
import os
import pickle
import re
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from shared import checks, weights
from shared.config import ModelConfig
from shared.weights import init_weights
from tests.backends import SMALL
from tests.weight_files import BAD_ARRAYS, IN_A_FILE, Payload, changed, exactly, good_bytes, write_exchange

D, H, V, L = SMALL.d_model, SMALL.n_heads, SMALL.vocab_size, SMALL.max_len  # 24, 4, 11, 7

# --- the format -----------------------------------------------------------------------------------


def test_param_shapes_follow_the_torch_state_dict():
    # the names and shapes are the file format users' files are written in: spelled out, so that
    # a change to them is a change of the format, never a side effect
    assert weights.param_shapes(SMALL) == {
        "tok_emb.weight": (11, 24),
        "pos_emb.weight": (7, 24),
        "attn.qkv_proj.weight": (72, 24),
        "attn.qkv_proj.bias": (72,),
        "attn.out_proj.weight": (24, 24),
        "attn.out_proj.bias": (24,),
        "lm_head.weight": (11, 24),
        "lm_head.bias": (11,),
    }
    no_bias = weights.param_shapes(ModelConfig(vocab_size=V, d_model=D, n_heads=H, max_len=L, bias=False))
    assert not any(name.endswith("bias") for name in no_bias)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_init_is_deterministic_and_torch_like(dtype):
    a = weights.init_weights(SMALL, seed=0, dtype=dtype)
    b = weights.init_weights(SMALL, seed=0, dtype=dtype)
    c = weights.init_weights(SMALL, seed=1, dtype=dtype)
    assert weights.validate(a, SMALL) == dtype
    assert all((a[name] == b[name]).all() for name in a)
    assert not (a["attn.qkv_proj.weight"] == c["attn.qkv_proj.weight"]).all()
    bound = 1 / np.sqrt(D)
    for name in ("attn.qkv_proj.weight", "attn.out_proj.bias", "lm_head.weight"):
        assert np.abs(a[name]).max() <= bound and np.abs(a[name]).max() > 0.8 * bound
    assert 0.8 < a["tok_emb.weight"].std() < 1.2  # N(0, 1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_save_load_round_trip_is_bit_identical(tmp_path, dtype):
    arrays = weights.init_weights(SMALL, seed=3, dtype=dtype)
    path = tmp_path / "model.safetensors"
    weights.save(path, arrays, SMALL)
    loaded, config = weights.load(path)
    assert config == SMALL
    assert set(loaded) == set(arrays)
    for name in arrays:
        assert loaded[name].dtype == arrays[name].dtype
        assert loaded[name].tobytes() == arrays[name].tobytes()
    assert os.listdir(tmp_path) == ["model.safetensors"]  # no temporary left behind


def test_metadata_holds_the_config_as_json(tmp_path):
    path = tmp_path / "model.safetensors"
    weights.save(path, weights.init_weights(SMALL, 0), SMALL)
    raw = path.read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    assert json.loads(header["__metadata__"]["config"]) == SMALL.to_dict()


# --- weight dicts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", BAD_ARRAYS, ids=str)
def test_a_bad_weight_dict_is_refused_naming_the_key_and_what_was_expected(case):
    arrays, error, pattern = BAD_ARRAYS[case]
    with pytest.raises(error, match=pattern):
        weights.validate(arrays, SMALL)


def test_weights_in_another_dtype_than_asked_for_are_refused():
    with pytest.raises(ValueError, match=exactly("weights are float32, expected float64")):
        weights.validate(weights.init_weights(SMALL, 0), SMALL, dtype="float64")


def test_an_invalid_save_never_touches_the_previous_file(tmp_path):
    path = tmp_path / "model.safetensors"
    weights.save(path, init_weights(SMALL, 0), SMALL)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"missing key"):
        weights.save(path, changed(drop="lm_head.bias"), SMALL)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["model.safetensors"]


# --- weights files --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", IN_A_FILE, ids=str)
def test_a_file_holding_bad_weights_is_refused_naming_the_file_and_the_problem(tmp_path, case):
    arrays, _, pattern = BAD_ARRAYS[case]
    path = write_exchange(tmp_path / "bad.safetensors", arrays)
    with pytest.raises(ValueError, match=rf"^weights file '{re.escape(str(path))}': {pattern.removeprefix('^')}"):
        weights.load(path)


def test_a_file_whose_config_disagrees_with_the_requested_one(tmp_path):
    path = tmp_path / "model.safetensors"
    weights.save(path, init_weights(SMALL, 0), SMALL)
    other = ModelConfig(vocab_size=V, d_model=D, n_heads=6, max_len=L + 1)
    with pytest.raises(
        ValueError,
        match=exactly(f"weights file {str(path)!r} was saved with a different model config: n_heads=4 (expected 6), max_len=7 (expected 8)"),
    ):
        weights.load(path, expect=other)


@pytest.mark.parametrize(
    "config, pattern",
    [
        ({**SMALL.to_dict(), "d_model": 30}, r"d_model=30 is not divisible by n_heads=4"),
        ({key: value for key, value in SMALL.to_dict().items() if key != "vocab_size"}, r"missing field\(s\) \['vocab_size'\]"),
    ],
    ids=["indivisible", "no vocab_size, refused not defaulted"],
)
def test_a_file_whose_metadata_config_is_invalid(tmp_path, config, pattern):
    path = write_exchange(tmp_path / "bad.safetensors", init_weights(SMALL, 0), config)
    with pytest.raises(ValueError, match=rf"has an invalid config in its metadata: {pattern}"):
        weights.load(path)


def test_plain_safetensors_without_config_is_refused(tmp_path):
    path = tmp_path / "plain.safetensors"
    safetensors.numpy.save_file(weights.init_weights(SMALL, 0), str(path))
    with pytest.raises(ValueError, match=r"not in the mhsa-exchange format"):
        weights.load(path)


NOT_A_SAFETENSORS_FILE = r"is not a safetensors file \(no valid header; a pickle or torch.save file is refused and never unpickled\)"


@pytest.mark.parametrize(
    "content, pattern",
    [
        (lambda good: b"", r"is not a safetensors file: it is empty \(0 bytes\)"),
        (lambda good: good[:5], r"is not a safetensors file: only 5 bytes"),
        (lambda good: good[:8], r"is truncated: its header announces \d+ bytes but only 0 follow"),
        (lambda good: good[:40], r"is truncated: its header announces \d+ bytes but only 32 follow"),
        (lambda good: good[:-1], r"is truncated: its header describes more data than the file holds"),
        (lambda good: b"garbage!", NOT_A_SAFETENSORS_FILE),
        (lambda good: b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!", NOT_A_SAFETENSORS_FILE),
    ],
    ids=["empty", "cut in the length", "cut after the length", "cut in the header", "cut in the data", "garbage", "not JSON"],
)
def test_an_empty_truncated_or_garbage_file_is_refused(tmp_path, content, pattern):
    path = tmp_path / "cut.safetensors"
    path.write_bytes(content(good_bytes(tmp_path)))
    with pytest.raises(ValueError, match=rf"^weights file '{re.escape(str(path))}' {pattern}"):
        weights.load(path)


@pytest.mark.parametrize("kind", ["pickle", "torch.save"])
def test_a_pickle_renamed_safetensors_is_refused_and_never_unpickled(tmp_path, kind):
    marker = tmp_path / "unpickled"
    path = tmp_path / "model.safetensors"
    if kind == "pickle":
        path.write_bytes(pickle.dumps({"tok_emb.weight": Payload(marker)}))
    else:
        import torch

        torch.save({"tok_emb.weight": Payload(marker)}, path)  # a zip holding a pickle
    with pytest.raises(ValueError, match=NOT_A_SAFETENSORS_FILE):
        weights.load(path)
    assert not marker.exists()


def test_a_missing_file_is_named(tmp_path):
    path = tmp_path / "none.safetensors"
    with pytest.raises(FileNotFoundError, match=exactly(f"weights file {str(path)!r} does not exist")):
        weights.load(path)


def test_an_unreadable_file_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    weights.save(path, init_weights(SMALL, 0), SMALL)
    path.chmod(0)
    if os.geteuid() == 0:  # root opens a mode-000 file anyway: make the open fail as it would for a user
        import shared.files

        real = os.open

        def denied(name, *args, **kwargs):
            if Path(name) == path:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(name))
            return real(name, *args, **kwargs)

        monkeypatch.setattr(shared.files.os, "open", denied)
    try:
        with pytest.raises(ValueError, match=exactly(f"weights file {str(path)!r} cannot be read: Permission denied")):
            weights.load(path)
    finally:
        path.chmod(0o644)


# --- crafted headers: refused before the body is read -------------------------------------------


def crafted(tmp_path, header: bytes, length: int | None = None, body: bytes = b"") -> Path:
    path = tmp_path / "crafted.safetensors"
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + body)
    return path


def test_a_header_with_broken_offsets(tmp_path):
    header = json.dumps({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, "8"]}}).encode()
    path = crafted(tmp_path, header, body=bytes(8))
    with pytest.raises(ValueError, match=r"not a valid safetensors file: tensor 'x' has no \[begin, end\] data_offsets"):
        weights.load(path)


def test_an_oversized_header_is_refused_before_it_is_read(tmp_path):
    path = crafted(tmp_path, b"{" + b" " * 64, length=weights.MAX_HEADER + 1)
    with open(path, "r+b") as file:  # sparse: the announced header exists on disk
        file.truncate(8 + weights.MAX_HEADER + 1)
    with pytest.raises(ValueError, match=rf"its header announces {weights.MAX_HEADER + 1} bytes, more than the {weights.MAX_HEADER}-byte limit"):
        weights.load(path)


def test_a_deeply_nested_header_is_refused_without_recursion(tmp_path):
    path = crafted(tmp_path, b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    with pytest.raises(ValueError, match=r"its header nests 100001 levels deep, more than the 3 a safetensors header has"):
        weights.load(path)


def test_a_huge_sparse_file_is_refused_before_its_body_is_read(tmp_path):
    path = tmp_path / "huge.safetensors"
    weights.save(path, init_weights(SMALL, 0), SMALL)
    with open(path, "r+b") as file:
        file.truncate(path.stat().st_size + (1 << 40))  # a terabyte of holes after the data
    with pytest.raises(ValueError, match=r"1099511627776 bytes follow the data its header describes"):
        weights.load(path)


def test_a_body_larger_than_memory_is_refused_naming_the_estimate(tmp_path):
    config = ModelConfig(vocab_size=2**28, d_model=64, n_heads=4, max_len=7)  # tok_emb alone: 64 GiB
    header, offset = {"__metadata__": {"format": weights.FORMAT, "format_version": "1", "config": json.dumps(config.to_dict())}}, 0
    for name, shape in weights.param_shapes(config).items():
        size = int(np.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    if offset <= checks.available_memory():
        pytest.skip("this machine has more memory than the crafted file declares")
    path = crafted(tmp_path, json.dumps(header).encode())
    with open(path, "r+b") as file:
        file.truncate(path.stat().st_size + offset)
    with pytest.raises(ValueError, match=r"reading weights file .* needs an estimated [\d.]+ GiB of memory, more than the .* available"):
        weights.load(path)


def test_overlapping_tensors_are_refused_in_one_line(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    path = crafted(tmp_path, json.dumps(header).encode(), body=bytes(12))
    with pytest.raises(ValueError, match=r"tensor 'b' starts at byte 4, expected 8 \(tensors overlap or leave a gap\)"):
        weights.load(path)


def test_bfloat16_weights_are_named_as_such(tmp_path):
    arrays = {name: value.astype(ml_dtypes.bfloat16).view(np.uint16) for name, value in init_weights(SMALL, 0).items()}
    payload = safetensors.numpy.save(arrays, {"format": weights.FORMAT, "config": json.dumps(SMALL.to_dict())})
    length = int.from_bytes(payload[:8], "little")
    header = json.loads(payload[8 : 8 + length])
    for name in arrays:
        header[name]["dtype"] = "BF16"  # the same bytes, declared as bfloat16
    path = crafted(tmp_path, json.dumps(header).encode(), body=payload[8 + length :])
    with pytest.raises(ValueError, match=r"weights\['tok_emb.weight'\] has dtype bfloat16, expected one of float32, float64$"):
        weights.load(path)
