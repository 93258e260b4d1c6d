"""Bad input to the block and the model: every case raises a clear exception that names the
offending value and what was expected, identically in every backend, whether the NumPy-facing
functions (attend, predict, loss_and_grads) or the layer and model themselves are called; a
weight dict is checked before a model is built; each check runs once per call, where it enters.

NaN input is not an error: it propagates within its sequence and never crashes, see
tests/implementations/test_block.py::test_nan_input_propagates_within_its_sequence_and_never_crashes.
The checks of a weights file: tests/contract/test_weights.py."""

import ml_dtypes
import numpy as np
import pytest

from mhsa import registry
from shared.weights import init_weights
from tests.backends import SMALL, B, T, called_directly, names, native, new_block
from tests.samples import tokens, with_id
from tests.tiers import first_fast
from tests.weight_files import BAD_ARRAYS, exactly

D, H, V, L = SMALL.d_model, SMALL.n_heads, SMALL.vocab_size, SMALL.max_len  # 24, 4, 11, 7


def embeddings(shape=(B, T, D), dtype="float64"):
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


# --- sizes of the block ---------------------------------------------------------------------------
# numpy_ref's block is a function of a ModelConfig, whose refusals are tests/contract/test_config.py's

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


@pytest.mark.parametrize("name", names("layers"))
@pytest.mark.parametrize("case", BAD_SIZES, ids=str)
def test_a_layer_of_bad_sizes_names_the_value_and_what_was_expected(name, case):
    sizes, error, message = BAD_SIZES[case]
    with pytest.raises(error, match=exactly(message)):
        new_block(name, *sizes)


def test_numpy_ref_attention_checks_its_n_heads():
    # its n_heads is an argument, not a config: 5 and 0 would otherwise fail inside a reshape
    from numpy_ref.attention import check_attention

    for n_heads, message in [(5, "d_model=24 is not divisible by n_heads=5"), (0, "n_heads must be a positive integer, got 0")]:
        with pytest.raises(ValueError, match=message):
            check_attention(embeddings(), init_weights(SMALL, 0, "float64"), n_heads)


# --- input to the block and the model -------------------------------------------------------------

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


@pytest.mark.parametrize("dtype", ["float16", ml_dtypes.bfloat16, "float64"], ids=["float16", "bfloat16", "float64"])
def test_an_input_in_another_dtype_than_the_block_is_refused_the_same_way_everywhere(backend, dtype):
    x = np.random.default_rng(0).standard_normal((B, T, D)).astype(dtype)
    message = (
        f"attention input has dtype {np.dtype(dtype).name}, expected float32 (the block's dtype); convert it first, nothing is converted silently"
    )
    with pytest.raises(TypeError, match=exactly(message)):
        backend.attention(x, init_weights(SMALL, 0, "float32"), SMALL)


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
    "uint64 ids": (tokens(dtype="uint64"), TypeError, "tokens must be an integer array (B, T) of int32 or int64, got dtype uint64"),
    "rank 1": (tokens()[0], ValueError, "tokens must have rank 2 (B, T), got rank 1 with shape (5,)"),
    "rank 3": (tokens()[None], ValueError, "tokens must have rank 2 (B, T), got rank 3 with shape (1, 3, 5)"),
    "T > max_len": (tokens((B, 8)), ValueError, "sequence length T=8 is longer than max_len=7"),
    "T = 0": (tokens((B, 0)), ValueError, "sequence length T=0 must be at least 1"),
}


@pytest.mark.parametrize("case", BAD_TOKENS, ids=str)
def test_bad_tokens_to_predict_and_to_loss_and_grads(backend, case):
    ids, error, message = BAD_TOKENS[case]
    arrays = init_weights(SMALL, 0, "float64")
    with pytest.raises(error, match=exactly(message)):
        backend.forward(ids, arrays, SMALL)
    if "grads" in backend.backend.supports:
        with pytest.raises(error, match=exactly(message)):
            backend.loss_and_grads(ids, np.zeros(ids.shape, np.int64), arrays, SMALL)


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


# --- the same refusals from a layer or a model called directly --------------------------------------
# The NumPy-facing functions above check once, where a call enters; a user who calls the layer or
# the model itself, on the framework's own arrays, gets the same one-line errors from its check.

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
            return model.attn.check(native(backend.name, x))

    else:
        from numpy_ref.attention import check_attention

        def block(x):
            return check_attention(x, {**arrays, "attn.qkv_proj.weight": weight}, SMALL.n_heads)

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


# --- weight dicts into a model: everything checked before anything is built -----------------------


@pytest.mark.parametrize("case", BAD_ARRAYS, ids=str)
def test_bad_weight_dicts_are_refused_before_a_model_is_built(backend, case, monkeypatch):
    arrays, error, pattern = BAD_ARRAYS[case]
    # a model built and then filled is what a half-loaded one comes from: none may be built
    monkeypatch.setattr(backend.backend.model, "TinyLM", lambda *args, **kwargs: pytest.fail("a TinyLM was built before the check"))
    with pytest.raises(error, match=pattern):
        backend.forward(tokens(), arrays, SMALL)


# --- each check once per call, where the call enters ------------------------------------------------


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


@pytest.mark.parametrize("name", first_fast(names("train")))
def test_a_trainer_checks_each_batch_once_and_its_steps_check_nothing(name, counted):
    from shared.config import TrainConfig

    config = TrainConfig(epochs=2, n_sequences=96)  # 3 steps per epoch
    registry.get(name).train.train(SMALL, config)
    # shared.checks.check_batches, before each epoch's first step: the one batch shape of the epoch,
    # then the ids of all its batches at once (read batch by batch only to name a bad one)
    assert counted == {**dict.fromkeys(counted, 0), "check_tokens": config.epochs}
