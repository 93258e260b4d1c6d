"""Bad input, bad files, bad runs: every case raises a clear exception that names the offending
value and what was expected, identically in numpy_ref, torch_impl and jax_impl; a bad file is
refused before anything is unpickled or assigned; a failed save keeps the previous file; the
train command fails in one line with a non-zero status, never a traceback.

NaN input is not an error: it propagates within its sequence and never crashes, see
tests/implementations/test_block.py::test_nan_input_propagates_within_its_sequence_and_never_crashes.
"""

import errno
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from mhsa import registry, train_cli
from shared import weights
from shared.config import ModelConfig, TrainConfig
from shared.history import History
from shared.weights import init_weights
from tests.backends import SMALL, B, T, names, new_block, package

D, H, V, L = SMALL.d_model, SMALL.n_heads, SMALL.vocab_size, SMALL.max_len  # 24, 4, 11, 7
DESCRIBED = "ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=7, bias=True)"


def exactly(message):
    """A pytest.raises match for this exact message and nothing else (so every backend agrees)."""
    return "^" + re.escape(message) + "$"


def embeddings(shape=(B, T, D), dtype="float64"):
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


def tokens(shape=(B, T), dtype="int64"):
    return np.random.default_rng(1).integers(0, V, size=shape).astype(dtype)


def with_id(bad_id):
    ids = tokens()
    ids[1, 3] = bad_id  # one bad id in the middle of the batch
    return ids


# --- sizes of the block -------------------------------------------------------------------


def build(backend, d_model, n_heads, max_len):
    """What each backend builds its block from: a layer, or for numpy_ref's pure functions the
    ModelConfig that numpy_ref.forward takes."""
    if "layers" not in backend.backend.supports:
        return ModelConfig(vocab_size=V, d_model=d_model, n_heads=n_heads, max_len=max_len)
    return new_block(backend.name, d_model, n_heads, max_len)


BAD_SIZES = {
    "30 % 4": (
        (30, 4, L),
        ValueError,
        "d_model=30 is not divisible by n_heads=4; d_model must be a multiple of n_heads (d_head = d_model // n_heads)",
    ),
    "d_model 0": ((0, 4, L), ValueError, "d_model must be a positive integer, got 0"),
    "d_model -24": ((-24, 4, L), ValueError, "d_model must be a positive integer, got -24"),
    "n_heads 0": ((D, 0, L), ValueError, "n_heads must be a positive integer, got 0"),
    "n_heads -4": ((D, -4, L), ValueError, "n_heads must be a positive integer, got -4"),
    "max_len 0": ((D, 4, 0), ValueError, "max_len must be a positive integer, got 0"),
    "max_len -7": ((D, 4, -7), ValueError, "max_len must be a positive integer, got -7"),
    "d_model 24.0": ((24.0, 4, L), TypeError, "d_model must be an int, got 24.0 (float)"),
}


@pytest.mark.parametrize("case", BAD_SIZES, ids=str)
def test_bad_block_sizes_name_the_value_and_what_was_expected(backend, case):
    sizes, error, message = BAD_SIZES[case]
    with pytest.raises(error, match=exactly(message)):
        build(backend, *sizes)


def test_numpy_ref_attention_checks_its_n_heads():
    # its n_heads is an argument, not a config: 5 and 0 now fail inside a reshape
    from numpy_ref.attention import attention

    for n_heads, message in [(5, "d_model=24 is not divisible by n_heads=5"), (0, "n_heads must be a positive integer, got 0")]:
        with pytest.raises(ValueError, match=message):
            attention(embeddings(), init_weights(SMALL, 0, "float64"), n_heads)


# --- input to the block and the model -------------------------------------------------------

BAD_INPUTS = {
    "rank 2": (embeddings()[0], ValueError, "attention input must have rank 3 (B, T, D), got rank 2 with shape (5, 24)"),
    "rank 4": (embeddings()[None], ValueError, "attention input must have rank 3 (B, T, D), got rank 4 with shape (1, 3, 5, 24)"),
    "width 20": (embeddings((B, T, 20)), ValueError, "attention input width D=20 does not match d_model=24 (input shape (3, 5, 20))"),
    "int input": (embeddings().astype(np.int64), TypeError, "attention input must be a floating-point array (B, T, D), got dtype int64"),
}


@pytest.mark.parametrize("case", BAD_INPUTS, ids=str)
def test_bad_block_input(backend, case):
    x, error, message = BAD_INPUTS[case]
    with pytest.raises(error, match=exactly(message)):
        backend.attention(x, init_weights(SMALL, 0, "float64"), SMALL)


def test_block_input_longer_than_max_len(backend):
    # the model's block refuses it in every backend (numpy_ref's pure attention function has no
    # max_len: its causal mask is built for any T)
    with pytest.raises(ValueError, match=exactly("sequence length T=8 is longer than max_len=7")):
        backend.attention(embeddings((B, 8, D)), init_weights(SMALL, 0, "float64"), SMALL)


BAD_TOKENS = {
    "id -1": (with_id(-1), ValueError, "token id -1 is out of range: ids must lie in [0, 11) for vocab_size=11"),
    "id V": (with_id(V), ValueError, "token id 11 is out of range: ids must lie in [0, 11) for vocab_size=11"),
    "float ids": (tokens(dtype="float64"), TypeError, "tokens must be an integer array (B, T) of int32 or int64, got dtype float64"),
    "bool ids": (tokens(dtype="bool"), TypeError, "tokens must be an integer array (B, T) of int32 or int64, got dtype bool"),
    # numpy and JAX would index with uint8, torch's embedding would not: refused everywhere
    "uint8 ids": (tokens(dtype="uint8"), TypeError, "tokens must be an integer array (B, T) of int32 or int64, got dtype uint8"),
    "rank 1": (tokens()[0], ValueError, "tokens must have rank 2 (B, T), got rank 1 with shape (5,)"),
    "rank 3": (tokens()[None], ValueError, "tokens must have rank 2 (B, T), got rank 3 with shape (1, 3, 5)"),
    "T > max_len": (tokens((B, 8)), ValueError, "sequence length T=8 is longer than max_len=7"),
    "T = 0": (tokens((B, 0)), ValueError, "sequence length T=0 must be at least 1"),
}


@pytest.mark.parametrize("case", BAD_TOKENS, ids=str)
def test_bad_tokens(backend, case):
    ids, error, message = BAD_TOKENS[case]
    with pytest.raises(error, match=exactly(message)):
        backend.forward(ids, init_weights(SMALL, 0, "float64"), SMALL)


def test_int32_tokens_are_accepted(backend):
    logits = backend.forward(tokens(dtype="int32"), init_weights(SMALL, 0, "float64"), SMALL)
    assert logits.shape == (B, T, V)


BAD_MASKS = {
    "key axis too long": (np.ones((T, T + 1), bool), ValueError, "mask of shape (5, 6) does not broadcast to (B, H, T, T) = (3, 4, 5, 5)"),
    "too few queries": (np.ones((T - 1, T), bool), ValueError, "mask of shape (4, 5) does not broadcast to (B, H, T, T) = (3, 4, 5, 5)"),
    "wrong batch": (np.ones((2, 1, T, T), bool), ValueError, "mask of shape (2, 1, 5, 5) does not broadcast to (B, H, T, T) = (3, 4, 5, 5)"),
    "wrong heads": (np.ones((1, 3, T, T), bool), ValueError, "mask of shape (1, 3, 5, 5) does not broadcast to (B, H, T, T) = (3, 4, 5, 5)"),
    "rank 5": (np.ones((1, B, H, T, T), bool), ValueError, "mask of shape (1, 3, 4, 5, 5) does not broadcast to (B, H, T, T) = (3, 4, 5, 5)"),
    "float mask": (np.ones((T, T)), TypeError, "mask must be a boolean array (True = may attend), got dtype float64"),
    "int mask": (np.ones((T, T), np.int64), TypeError, "mask must be a boolean array (True = may attend), got dtype int64"),
}


@pytest.mark.parametrize("case", BAD_MASKS, ids=str)
def test_bad_masks_in_the_block_and_the_model(backend, case):
    mask, error, message = BAD_MASKS[case]
    arrays = init_weights(SMALL, 0, "float64")
    with pytest.raises(error, match=exactly(message)):
        backend.attention(embeddings(), arrays, SMALL, mask=mask)
    with pytest.raises(error, match=exactly(message)):
        backend.forward(tokens(), arrays, SMALL, mask=mask)


# --- the same refusals from a layer or a model called directly ------------------------------
# The NumPy-facing functions above check once, where a call enters; a user who calls the layer or
# the model itself, on the framework's own arrays, gets the same one-line errors from its entry.


def native(name, array):
    """A NumPy array as the framework's own array, what a user hands a layer or a model."""
    framework = registry.get(name).framework
    if framework == "torch":
        import torch

        return torch.from_numpy(np.asarray(array))
    if framework == "jax":
        import jax.numpy as jnp

        return jnp.asarray(array)
    return np.asarray(array)


def called_directly(name, arrays, config=SMALL):
    """(block(x, mask=None), model(tokens, mask=None)) of backend `name`, called as a user calls
    them: the framework's layer and model on its own arrays (x and tokens are converted here, a
    mask is passed as it is given); numpy_ref's attention function and TinyLM on NumPy arrays."""
    backend = registry.get(name)
    model = backend.model.from_exchange(arrays, config)
    if "layers" in backend.supports:

        def block(x, mask=None):
            return model.attn(native(name, x), mask=mask)

    else:
        from numpy_ref.attention import attention

        def block(x, mask=None):
            return attention(x, model.params, config.n_heads, mask=mask)

    def whole(ids, mask=None):
        return model(native(name, ids), mask=mask)

    return block, whole


DIRECT = [("the layer", case) for case in BAD_INPUTS] + [("the model", case) for case in BAD_TOKENS]


@pytest.mark.parametrize("called, case", DIRECT, ids=[f"{called}: {case}" for called, case in DIRECT])
def test_a_layer_or_a_model_called_directly_refuses_bad_input_alike(backend, called, case):
    value, error, message = (BAD_INPUTS if called == "the layer" else BAD_TOKENS)[case]
    block, whole = called_directly(backend.name, init_weights(SMALL, 0, "float64"))
    with pytest.raises(error, match=exactly(message)):
        (block if called == "the layer" else whole)(value)


@pytest.mark.parametrize("name", names("layers"))
def test_a_layer_called_directly_refuses_a_longer_input_and_another_dtype(name):
    block, _ = called_directly(name, init_weights(SMALL, 0, "float64"))
    with pytest.raises(ValueError, match=exactly("sequence length T=8 is longer than max_len=7")):
        block(embeddings((B, 8, D)))
    message = "attention input has dtype float32, expected float64 (the block's dtype); convert it first, nothing is converted silently"
    with pytest.raises(TypeError, match=exactly(message)):
        block(embeddings(dtype="float32"))


@pytest.mark.parametrize("case", BAD_MASKS, ids=str)
def test_a_layer_and_a_model_called_directly_refuse_bad_masks_alike(backend, case):
    mask, error, message = BAD_MASKS[case]
    block, whole = called_directly(backend.name, init_weights(SMALL, 0, "float64"))
    for given in (mask, native(backend.name, mask)):  # NumPy, and the framework's own array
        with pytest.raises(error, match=exactly(message)):
            block(embeddings(), mask=given)
        with pytest.raises(error, match=exactly(message)):
            whole(tokens(), mask=given)


def test_a_weight_of_the_wrong_shape_is_named_not_the_input(backend):
    """A transposed qkv_proj weight in the block: the weight is named with its expected shape,
    not the input's width (numpy_ref's attention function takes its weights at every call; a
    framework layer's weight can be replaced after it is built)."""
    arrays = init_weights(SMALL, 0, "float64")
    weight = np.ascontiguousarray(arrays["attn.qkv_proj.weight"].T)  # (D, 3D) instead of (3D, D)
    if "layers" in backend.backend.supports:
        model = backend.model(arrays, SMALL)
        _replace_qkv_weight(backend.name, model.attn, weight)

        def block(x):
            return model.attn(native(backend.name, x))

    else:
        from numpy_ref.attention import attention

        def block(x):
            return attention(x, {**arrays, "attn.qkv_proj.weight": weight}, SMALL.n_heads)

    message = "weights['attn.qkv_proj.weight'] has shape (24, 72), expected (72, 24) (looks transposed: exchange weights are PyTorch (out, in))"
    with pytest.raises(ValueError, match=exactly(message)):
        block(embeddings())


def _replace_qkv_weight(name, layer, weight):
    # what a user can do to a built layer: a new parameter of any shape (weight in PyTorch layout)
    if registry.get(name).framework == "torch":
        import torch

        layer.qkv_proj.weight = torch.nn.Parameter(torch.from_numpy(weight))
    else:
        from flax import nnx

        layer.qkv_proj.kernel = nnx.Param(native(name, weight.T))  # a Flax kernel is (in, out)


# --- each check once per call, where the call enters ----------------------------------------


@pytest.fixture
def counted(monkeypatch):
    """How often each input check of shared.checks runs: {name: calls}."""
    from shared import checks

    calls = dict.fromkeys(("check_input", "check_tokens", "check_mask", "check_cache", "check_generate"), 0)
    for name in calls:
        real = getattr(checks, name)

        def counting(*args, _name=name, _real=real, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(checks, name, counting)
    return calls


def test_each_input_check_runs_once_per_call(backend, counted):
    """The NumPy-facing functions check their arrays where the call enters and the model and its
    block inside do not check them again; a generate checks its request once, not at every token."""
    arrays = init_weights(SMALL, 0, "float64")
    model = backend.model(arrays, SMALL)
    module = backend.backend.model
    mask = np.ones((T, T), bool)
    runs = {
        "attend": (lambda: module.attend(model, embeddings(), mask=mask), {"check_input": 1, "check_mask": 1}),
        "predict": (lambda: module.predict(model, tokens(), mask=mask), {"check_tokens": 1, "check_mask": 1}),
        "predict with a trace": (lambda: module.predict(model, tokens(), trace={}), {"check_tokens": 1}),
        "loss_and_grads": (lambda: module.loss_and_grads(model, tokens(), tokens(), mask=mask), {"check_tokens": 1, "check_mask": 1}),
    }
    if "generate" in backend.backend.supports:
        generate = backend.backend.module("generate")
        cache = generate.new_cache(model, B)
        runs["step"] = (lambda: generate.step(model, tokens((B, 2)), cache), {"check_tokens": 1, "check_cache": 1})
        runs["generate"] = (lambda: generate.generate(model, tokens((B, 2)), 3), {"check_generate": 1, "check_tokens": 1})
    for what, (run, expected) in runs.items():
        counted.update(dict.fromkeys(counted, 0))
        run()
        assert counted == {**dict.fromkeys(counted, 0), **expected}, f"{backend.name} {what}"


@pytest.mark.parametrize("name", names("train"))
def test_a_trainer_checks_each_batch_once_and_its_steps_check_nothing(name, counted):
    config = TrainConfig(epochs=2, n_sequences=96)  # 3 steps per epoch
    registry.get(name).train.train(SMALL, config)
    # shared.checks.check_batches, before each epoch's first step: the one batch shape of the epoch,
    # then the ids of all its batches at once (read batch by batch only to name a bad one)
    assert counted == {**dict.fromkeys(counted, 0), "check_tokens": config.epochs}


def test_a_run_of_batches_is_checked_as_its_forwards_would_check_it_batch_by_batch():
    """shared.checks.check_batches, the trainers' one check of an epoch: the first bad batch in
    order is the one named, with the message its own forward would give."""
    from shared import checks

    batches = [(tokens(), tokens()) for _ in range(6)]
    batches[2] = (with_id(V), tokens())
    batches[4] = (with_id(-1), tokens())
    with pytest.raises(ValueError, match=exactly(f"token id {V} is out of range: ids must lie in [0, {V}) for vocab_size={V}")):
        checks.check_batches(batches, V, L)
    batches[1] = (tokens(dtype="float64"), tokens())  # a dtype is refused before any id is read
    with pytest.raises(TypeError, match=exactly("tokens must be an integer array (B, T) of int32 or int64, got dtype float64")):
        checks.check_batches(batches, V, L)
    checks.check_batches([(tokens(), tokens()), (tokens((2, T), "int32"), tokens())], V, L)  # a shorter last batch, int32: fine


# --- weight dicts into a model: everything checked before anything is built ---------------


def changed(name=None, value=None, drop=None, dtype=None):
    arrays = init_weights(SMALL, 0)
    if drop is not None:
        del arrays[drop]
    if name is not None:
        arrays[name] = value
    if dtype is not None:
        arrays = {key: array.astype(dtype) for key, array in arrays.items()}
    return arrays


def transposed(name):
    return np.ascontiguousarray(init_weights(SMALL, 0)[name].T)


BAD_ARRAYS = {
    "missing key": (
        changed(drop="lm_head.bias"),
        ValueError,
        rf"^weights are missing key\(s\) 'lm_head.bias' \(11,\) required by {re.escape(DESCRIBED)}$",
    ),
    "extra key": (
        changed("attn.causal_mask", np.ones((L, L), np.float32)),
        ValueError,
        r"^weights have unexpected key\(s\) \['attn.causal_mask'\]; .* expects exactly \['tok_emb.weight', ",
    ),
    "wrong shape": (
        changed("lm_head.weight", np.zeros((V, D - 1), np.float32)),
        ValueError,
        exactly("weights['lm_head.weight'] has shape (11, 23), expected (11, 24)"),
    ),
    "transposed qkv kernel": (
        changed("attn.qkv_proj.weight", transposed("attn.qkv_proj.weight")),
        ValueError,
        exactly("weights['attn.qkv_proj.weight'] has shape (24, 72), expected (72, 24) (looks transposed: exchange weights are PyTorch (out, in))"),
    ),
    "transposed lm_head kernel": (
        changed("lm_head.weight", transposed("lm_head.weight")),
        ValueError,
        r"has shape \(24, 11\), expected \(11, 24\) \(looks transposed",
    ),
    "float16": (changed(dtype=np.float16), ValueError, exactly("weights['tok_emb.weight'] has dtype float16, expected one of float32, float64")),
    "int64": (changed(dtype=np.int64), ValueError, exactly("weights['tok_emb.weight'] has dtype int64, expected one of float32, float64")),
    "mixed dtypes": (
        changed("lm_head.bias", np.zeros(V, np.float64)),
        ValueError,
        r"^weights mix dtypes \{'float32': \[.*\], 'float64': \['lm_head.bias'\]\}; expected one dtype for every array$",
    ),
    "not an array": (changed("lm_head.bias", [0.0] * V), TypeError, exactly("weights['lm_head.bias'] must be a NumPy array, got list")),
}


@pytest.mark.parametrize("case", BAD_ARRAYS, ids=str)
def test_bad_weight_dicts_are_refused_before_a_model_is_built(backend, case, monkeypatch):
    arrays, error, pattern = BAD_ARRAYS[case]
    # a model built and then filled is what a half-loaded one comes from: none may be built
    monkeypatch.setattr(backend.backend.model, "TinyLM", lambda *args, **kwargs: pytest.fail("a TinyLM was built before the check"))
    with pytest.raises(error, match=pattern):
        backend.forward(tokens(), arrays, SMALL)


def test_weights_for_another_config_are_refused(backend):
    other = ModelConfig(vocab_size=V + 1, d_model=D, n_heads=H, max_len=L)
    with pytest.raises(ValueError, match=exactly("weights['tok_emb.weight'] has shape (11, 24), expected (12, 24)")):
        backend.model(init_weights(SMALL, 0), other)


# --- weight files -------------------------------------------------------------------------


def write_exchange(path, arrays, config=None):
    """A file in the exchange format that bypasses weights.save's own validation (config: SMALL's by default)."""
    config = SMALL.to_dict() if config is None else config
    metadata = {"format": weights.FORMAT, "format_version": weights.FORMAT_VERSION, "config": json.dumps(config)}
    safetensors.numpy.save_file(arrays, str(path), metadata)
    return path


class Payload:
    """Unpickling this creates `marker`: proof that nothing was unpickled if it stays absent."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def good_bytes(tmp_path):
    path = tmp_path / "good.safetensors"
    weights.save(path, init_weights(SMALL, 0), SMALL)
    return path.read_bytes()


BAD_FILE_CONTENTS = {
    # name: (arrays written with write_exchange, or None for raw bytes built in the test; pattern)
    "missing key": (changed(drop="lm_head.bias"), r"weights are missing key\(s\) 'lm_head.bias' \(11,\)"),
    "extra key": (changed("extra", np.zeros(2, np.float32)), r"weights have unexpected key\(s\) \['extra'\]"),
    "wrong shape": (changed("lm_head.bias", np.zeros(V + 1, np.float32)), r"weights\['lm_head.bias'\] has shape \(12,\), expected \(11,\)"),
    "transposed kernel": (
        changed("attn.qkv_proj.weight", transposed("attn.qkv_proj.weight")),
        r"weights\['attn.qkv_proj.weight'\] has shape \(24, 72\), expected \(72, 24\) \(looks transposed",
    ),
    "float16": (changed(dtype=np.float16), r"weights\['tok_emb.weight'\] has dtype float16, expected one of float32, float64"),
    "mixed dtypes": (changed("lm_head.bias", np.zeros(V, np.float64)), r"weights mix dtypes"),
}


@pytest.mark.parametrize("case", BAD_FILE_CONTENTS, ids=str)
def test_bad_weight_files_name_the_file_and_the_problem(tmp_path, case):
    arrays, pattern = BAD_FILE_CONTENTS[case]
    path = write_exchange(tmp_path / "bad.safetensors", arrays)
    with pytest.raises(ValueError, match=rf"^weights file '{re.escape(str(path))}': {pattern}"):
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


def test_a_file_whose_metadata_config_is_invalid(tmp_path):
    path = write_exchange(tmp_path / "bad.safetensors", init_weights(SMALL, 0), {**SMALL.to_dict(), "d_model": 30})
    with pytest.raises(ValueError, match=r"has an invalid config in its metadata: d_model=30 is not divisible by n_heads=4"):
        weights.load(path)


@pytest.mark.parametrize(
    "cut, pattern",
    [
        (0, r"is not a safetensors file: it is empty \(0 bytes\)"),
        (5, r"is not a safetensors file: only 5 bytes"),
        (8, r"is truncated: its header announces \d+ bytes but only 0 follow"),
        (40, r"is truncated: its header announces \d+ bytes but only 32 follow"),
        (-1, r"is truncated: its header describes more data than the file holds"),
    ],
    ids=["empty", "in the length", "after the length", "in the header", "in the data"],
)
def test_truncated_and_empty_files(tmp_path, cut, pattern):
    raw = good_bytes(tmp_path)
    path = tmp_path / "cut.safetensors"
    path.write_bytes(raw[:cut])
    with pytest.raises(ValueError, match=rf"^weights file '{re.escape(str(path))}' {pattern}"):
        weights.load(path)


def test_a_header_with_broken_offsets(tmp_path):
    header = json.dumps({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, "8"]}}).encode()
    path = tmp_path / "odd.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    with pytest.raises(ValueError, match=r"not a valid safetensors file: tensor 'x' has no \[begin, end\] data_offsets"):
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
    with pytest.raises(
        ValueError, match=r"is not a safetensors file \(no valid header; a pickle or torch.save file is refused and never unpickled\)"
    ):
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


@pytest.mark.parametrize("name", names("train"))
def test_a_file_in_the_wrong_dtype_for_the_run_is_refused_before_training(tmp_path, name):
    path = tmp_path / "model.safetensors"
    weights.save(path, init_weights(SMALL, 0, "float32"), SMALL)
    trainer = registry.get(name).train
    with pytest.raises(ValueError, match=exactly(f"weights file {str(path)!r}: weights are float32, expected float64 (the run's dtype)")):
        trainer.train(SMALL, TrainConfig(epochs=1, n_sequences=64, dtype="float64"), init=path)


# --- atomic saves ---------------------------------------------------------------------------


def test_a_weights_save_that_fails_midway_keeps_the_previous_file(tmp_path, monkeypatch):
    import shared.files

    path = tmp_path / "model.safetensors"
    weights.save(path, init_weights(SMALL, 0), SMALL)
    before = path.read_bytes()
    real_fdopen = os.fdopen

    class HalfWritten:
        # the disk fills up after half of the new payload has been written
        def __init__(self, file):
            self.file = file

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, data):
            self.file.write(data[: len(data) // 2])
            self.file.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shared.files.os, "fdopen", lambda fd, mode: HalfWritten(real_fdopen(fd, mode)))
    with pytest.raises(OSError, match="No space left on device"):
        weights.save(path, init_weights(SMALL, 1), SMALL)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.safetensors"]  # no temporary file left behind
    monkeypatch.undo()
    arrays, _ = weights.load(path)
    assert (arrays["lm_head.weight"] == init_weights(SMALL, 0)["lm_head.weight"]).all()


def test_an_invalid_weights_save_never_touches_the_previous_file(tmp_path):
    path = tmp_path / "model.safetensors"
    weights.save(path, init_weights(SMALL, 0), SMALL)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"missing key"):
        weights.save(path, changed(drop="lm_head.bias"), SMALL)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["model.safetensors"]


@pytest.mark.parametrize("failure", [OSError(errno.EXDEV, "Invalid cross-device link"), KeyboardInterrupt()], ids=["rename fails", "interrupted"])
def test_a_history_save_that_fails_at_the_rename_keeps_the_previous_file(tmp_path, monkeypatch, failure):
    import shared.files

    path = tmp_path / "history.json"
    History("torch", SMALL, TrainConfig(), [4.0, 3.0], [3.5], 1.0).save(path)
    before = path.read_bytes()

    def fail(*args):
        raise failure

    monkeypatch.setattr(shared.files.os, "replace", fail)
    with pytest.raises(type(failure)):
        History("torch", SMALL, TrainConfig(), [9.0], [9.0], 2.0).save(path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["history.json"]
    monkeypatch.undo()
    assert History.load(path).losses == [4.0, 3.0]


# --- the train command ----------------------------------------------------------------------


def run_main(capsys, backend, *flags):
    """train_cli.main in this process: (exit status, stdout, stderr)."""
    try:
        status = train_cli.main(backend, ["--quiet", *flags])
    except SystemExit as exit:
        status = exit.code
    out, err = capsys.readouterr()
    return status, out, err


BAD_FLAGS = {
    "--epochs -1": (["--epochs", "-1"], r"error: argument --epochs: expected an integer in \[1, 1000000\], got -1"),
    "--n-heads 5 --d-model 32": (["--n-heads", "5", "--d-model", "32"], r"error: d_model=32 is not divisible by n_heads=5"),
    "--dtype float16": (["--dtype", "float16"], r"error: argument --dtype: invalid choice: 'float16' \(choose from 'float32', 'float64'\)"),
    "--lr 0": (["--lr", "0"], r"error: argument --lr: expected a positive finite number, got 0"),
    "--heatmap-head 4": (["--heatmap-head", "4"], r"error: --heatmap-head 4 is out of range: the model has 4 heads \(0..3\)"),
    "--save in a missing folder": (
        ["--save", "no/such/folder/w.safetensors"],
        r"error: --save 'no/such/folder/w.safetensors': folder 'no/such/folder' does not exist",
    ),
    "--history a folder": (["--history", "."], r"error: --history '.' is a directory, expected a file name"),
}


@pytest.mark.parametrize("backend_name", names("train"))
@pytest.mark.parametrize("case", BAD_FLAGS, ids=str)
def test_bad_flags_exit_2_with_an_argparse_message_before_any_training(capsys, backend_name, case):
    flags, pattern = BAD_FLAGS[case]
    status, out, err = run_main(capsys, backend_name, *flags)
    assert status == 2
    assert err.startswith("usage: ")
    assert re.search(rf"^python -m {package(backend_name)}.train: {pattern}", err, re.MULTILINE), err
    assert "Traceback" not in err and out == ""  # refused before a single step


@pytest.mark.parametrize("backend_name", names("train"))
@pytest.mark.parametrize("case", ["missing key", "truncated", "pickle"])
def test_a_bad_load_file_exits_2_naming_it(capsys, tmp_path, backend_name, case):
    path = tmp_path / "bad.safetensors"
    if case == "missing key":
        write_exchange(path, changed(drop="lm_head.bias"))
    elif case == "truncated":
        path.write_bytes(good_bytes(tmp_path)[:-1])
    else:
        path.write_bytes(pickle.dumps(Payload(tmp_path / "unpickled")))
    status, out, err = run_main(capsys, backend_name, "--load", str(path))
    assert status == 2 and out == ""
    assert f"error: weights file {str(path)!r}" in err.splitlines()[-1]
    assert not (tmp_path / "unpickled").exists()


SMALL_RUN = ["--epochs", "1", "--n-sequences", "64", "--seq-len", "5", "--vocab-size", "11", "--d-model", "24"]


@pytest.mark.parametrize("backend_name", names("train"))
def test_a_run_whose_loss_overflows_stops_in_one_line(capsys, tmp_path, backend_name):
    # lr 1e30 overflows float32 at the first update (lr 1e6 does not: Adam moves each weight by
    # about lr per step and the copy task still learns when saturated)
    status, out, err = run_main(capsys, backend_name, *SMALL_RUN, "--lr", "1e30", "--save", str(tmp_path / "w.safetensors"))
    assert status == 1
    assert err.splitlines() == [
        f"python -m {package(backend_name)}.train: error: loss became non-finite at step 1 (epoch 1): nan; training stopped (try a smaller --lr)"
    ]
    assert os.listdir(tmp_path) == []  # nothing saved from a diverged run


@pytest.mark.parametrize("backend_name", names("train"))
def test_a_weights_file_holding_nan_is_refused_before_the_banner(capsys, tmp_path, backend_name):
    config = ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=5)
    arrays = init_weights(config, 0)
    arrays["pos_emb.weight"][2, 5] = np.nan
    path = tmp_path / "nan.safetensors"
    weights.save(path, arrays, config)
    status, out, err = run_main(capsys, backend_name, "--epochs", "1", "--n-sequences", "64", "--load", str(path))
    assert status == 2 and out == ""
    assert err.splitlines()[-1].endswith(f"error: weights file {str(path)!r} holds NaN or infinite values in ['pos_emb.weight']; refusing to use it")


def test_as_a_command_the_errors_are_one_line_without_traceback(tmp_path):
    # the same two failures in a real process: the exit status and stderr a user sees
    diverged = subprocess.run(
        [sys.executable, "-m", f"{package(names('train')[0])}.train", "--quiet", *SMALL_RUN, "--lr", "1e30"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert diverged.returncode == 1
    assert diverged.stderr.splitlines() == [
        f"python -m {package(names('train')[0])}.train: error: loss became non-finite at step 1 (epoch 1): nan; training stopped (try a smaller --lr)"
    ]
    bad_flags = subprocess.run(
        [sys.executable, "-m", "mhsa.cli", "train", "--backend", names("train")[0], "--n-heads", "5", "--d-model", "32"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad_flags.returncode == 2
    assert bad_flags.stderr.splitlines()[-1] == (
        "mhsa train: error: d_model=32 is not divisible by n_heads=5; d_model must be a multiple of n_heads (d_head = d_model // n_heads)"
    )
    assert "Traceback" not in diverged.stderr + bad_flags.stderr
