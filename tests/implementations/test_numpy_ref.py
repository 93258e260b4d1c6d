"""numpy_ref against values worked out by hand, and its own contract (trace, loss)."""

import math

import numpy as np
import pytest

from numpy_ref import attention as numpy_attention
from numpy_ref import model as numpy_model
from shared.config import ModelConfig
from shared.trace import STAGES
from shared.weights import init_weights


def identity_params(D):
    """q = k = v = x and out_proj = identity, so the attention maths is visible by hand."""
    eye = np.eye(D)
    return {
        "attn.qkv_proj.weight": np.concatenate([eye, eye, eye]),  # (3D, D): Q, K, V rows
        "attn.qkv_proj.bias": np.zeros(3 * D),
        "attn.out_proj.weight": eye,
        "attn.out_proj.bias": np.zeros(D),
    }


def test_hand_worked_t2_one_head():
    x = np.array([[[1.0, 0.0], [0.0, 1.0]]])  # (1, 2, 2)
    out, weights = numpy_attention.attention(x, identity_params(2), n_heads=1, return_weights=True)
    a = 1 / math.sqrt(2)  # scores = x x^T / sqrt(2) = [[a, 0], [0, a]]
    # row 0 sees only key 0; row 1 softmaxes [0, a]
    expected_weights = np.array([[1.0, 0.0], [1 / (1 + math.exp(a)), math.exp(a) / (1 + math.exp(a))]])
    np.testing.assert_allclose(weights[0, 0], expected_weights, rtol=0, atol=1e-15)
    np.testing.assert_allclose(out[0], expected_weights @ x[0], rtol=0, atol=1e-15)


def test_hand_worked_t3_two_heads():
    x = np.array([[[1.0, 0.0], [2.0, 1.0], [0.0, 3.0]]])  # (1, 3, 2); head h reads column h
    out, weights = numpy_attention.attention(x, identity_params(2), n_heads=2, return_weights=True)
    e = math.e
    # head 0 values [1, 2, 0]: row 2 has q = 0, so all three scores are 0 -> uniform
    np.testing.assert_allclose(weights[0, 0, 2], [1 / 3] * 3, atol=1e-15)
    # head 1 values [0, 1, 3], d_head = 1 so no scaling: row 1 scores [0, 1], row 2 scores [0, 3, 9]
    np.testing.assert_allclose(weights[0, 1, 1], [1 / (1 + e), e / (1 + e), 0], atol=1e-15)
    z = 1 + e**3 + e**9
    np.testing.assert_allclose(weights[0, 1, 2], [1 / z, e**3 / z, e**9 / z], atol=1e-15)
    expected_out = np.array(
        [
            [1.0, 0.0],
            [(1 + 2 * e**2) / (1 + e**2), e / (1 + e)],
            [1.0, (e**3 + 3 * e**9) / z],
        ]
    )  # head 0 row 1: scores [2, 4] -> weights [1, e^2] / (1 + e^2)
    np.testing.assert_allclose(out[0], expected_out, atol=1e-13)


def test_trace_records_every_stage_of_the_real_forward():
    config = ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=5)
    params = init_weights(config, seed=0, dtype="float64")
    tokens = np.random.default_rng(0).integers(0, 11, size=(3, 5))
    trace = numpy_model.intermediates(tokens, params, config)
    assert tuple(trace) == STAGES
    assert trace["scores"].shape == (3, 4, 5, 5) and trace["q"].shape == (3, 4, 5, 6)
    np.testing.assert_array_equal(trace["logits"], numpy_model.forward(tokens, params, config))


def test_cross_entropy_of_uniform_logits_is_log_v():
    logits = np.zeros((3, 5, 11))
    targets = np.zeros((3, 5), dtype=np.int64)
    assert numpy_model.cross_entropy(logits, targets) == pytest.approx(math.log(11), abs=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_is_kept_throughout(dtype):
    config = ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=5)
    params = init_weights(config, seed=0, dtype=np.dtype(dtype).name)
    tokens = np.zeros((3, 5), dtype=np.int64)
    trace = numpy_model.intermediates(tokens, params, config)
    assert {value.dtype for value in trace.values()} == {np.dtype(dtype)}
    assert numpy_model.loss(params, tokens, tokens, config).dtype == dtype
