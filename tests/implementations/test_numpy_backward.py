"""numpy_ref's backward pass by hand: every parameter's gradient against each framework's
autodiff and against a fourth-order finite difference, each backward step on its own, and a
planted fault that the gradient comparison names at the right parameter."""

import numpy as np
import pytest

from numpy_ref import backward
from numpy_ref import model as numpy_model
from numpy_ref.attention import softmax
from shared.config import ModelConfig
from shared.tolerances import assert_close, tolerance
from shared.weights import init_weights
from tests.backends import ADAPTERS, SMALL, B, T, central_difference, names

OTHERS = [name for name in names("grads") if name != "numpy"]
# the backward pass visits the parameters in this order: read-out first, embeddings last
BACKWARD_ORDER = (
    "lm_head.weight",
    "lm_head.bias",
    "attn.out_proj.weight",
    "attn.out_proj.bias",
    "attn.qkv_proj.weight",
    "attn.qkv_proj.bias",
    "pos_emb.weight",
    "tok_emb.weight",
)


def inputs(config=SMALL, seed=0):
    """Tokens with repeated ids, targets, and a (B, H, T, T) mask with padding and one fully masked row."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab_size, (B, T))
    tokens[0, :3] = 4  # one id three times in a row: its embedding gradient is a sum
    targets = rng.integers(0, config.vocab_size, (B, T))
    mask = np.ones((B, config.n_heads, T, T), dtype=bool)
    mask[0, ..., T - 2 :] = False  # sequence 0: the last two keys are padding
    mask[1, 2, 3, :] = False  # sequence 1, head 2, query 3 may attend to nothing
    return tokens, targets, mask


def numpy_grads(arrays, config, tokens, targets, mask):
    return ADAPTERS["numpy"].loss_and_grads(tokens, targets, arrays, config, mask=mask)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("other", OTHERS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_every_gradient_matches_the_frameworks_autodiff(other, dtype, bias):
    config = ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=7, bias=bias)
    arrays = init_weights(config, 3, dtype)
    tokens, targets, mask = inputs(config)
    loss, grads = numpy_grads(arrays, config, tokens, targets, mask)
    their_loss, theirs = ADAPTERS[other].loss_and_grads(tokens, targets, arrays, config, mask=mask)
    assert sorted(grads) == sorted(theirs) == sorted(arrays)
    assert_close(f"{dtype} loss numpy vs {other}", loss, their_loss, tolerance("stage", dtype))
    for name in arrays:
        assert grads[name].dtype == arrays[name].dtype and grads[name].shape == arrays[name].shape, name
        assert_close(f"{dtype} grad {name} numpy vs {other}", grads[name], theirs[name], tolerance("grad", dtype))


def test_every_gradient_matches_the_fourth_order_finite_difference():
    arrays = init_weights(SMALL, 5, "float64")
    tokens, targets, mask = inputs()
    _, grads = numpy_grads(arrays, SMALL, tokens, targets, mask)
    rng = np.random.default_rng(1)
    for name, value in arrays.items():
        coords = [tuple(int(rng.integers(0, size)) for size in value.shape) for _ in range(4)]
        if name == "tok_emb.weight":
            coords.append((4, 0))  # the repeated id
        reference = [central_difference(arrays, name, c, tokens, targets, SMALL, mask) for c in coords]
        assert_close(f"grad {name} numpy vs finite difference", [grads[name][c] for c in coords], reference, 1e-9)


def test_masked_scores_and_a_fully_masked_row_get_zero_gradient():
    arrays = init_weights(SMALL, 2, "float64")
    tokens, _, mask = inputs()
    trace = numpy_model.intermediates(tokens, arrays, SMALL, mask=mask)
    g_weights = np.random.default_rng(0).standard_normal(trace["weights"].shape)
    g_scores = backward.softmax_backward(g_weights, trace["weights"])
    allowed = np.tril(np.ones((T, T), dtype=bool)) & mask
    g_scores = backward.mask_backward(g_scores, allowed)
    assert np.all(g_scores[~np.broadcast_to(allowed, g_scores.shape)] == 0)
    assert np.all(g_scores[1, 2, 3] == 0)  # the fully masked row
    np.testing.assert_allclose(g_scores.sum(axis=-1), 0, atol=1e-15)  # shift invariance of the softmax


def test_softmax_backward_is_the_jacobian_vector_product():
    rng = np.random.default_rng(4)
    scores = rng.standard_normal(7)
    w = softmax(scores)
    jacobian = np.diag(w) - np.outer(w, w)  # dw_j / ds_k = w_j ([j == k] - w_k)
    g = rng.standard_normal(7)
    np.testing.assert_allclose(backward.softmax_backward(g, w), jacobian.T @ g, atol=1e-15)


def test_cross_entropy_backward_is_probabilities_minus_one_hot():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((B, T, 11))
    targets = rng.integers(0, 11, (B, T))
    loss, g = backward.cross_entropy_backward(logits, targets)
    assert loss == numpy_model.cross_entropy(logits, targets)  # the same arithmetic as the forward's loss
    np.testing.assert_allclose(g.sum(axis=-1), 0, atol=1e-16)  # probabilities sum to 1, the one-hot too
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    expected = (probs - np.eye(11)[targets]) / (B * T)
    np.testing.assert_allclose(g, expected, atol=1e-16)


def test_embedding_gradient_adds_every_use_of_an_id():
    g_x = np.arange(2 * 3 * 2, dtype=np.float64).reshape(2, 3, 2)  # (B=2, T=3, D=2)
    tokens = np.array([[1, 1, 0], [1, 2, 2]])
    g_tok, g_pos = backward.embed_backward(g_x, tokens, vocab_size=5, max_len=4)
    np.testing.assert_array_equal(g_tok[1], g_x[0, 0] + g_x[0, 1] + g_x[1, 0])  # id 1, three times
    np.testing.assert_array_equal(g_tok[2], g_x[1, 1] + g_x[1, 2])
    np.testing.assert_array_equal(g_tok[3:], 0)  # never looked up
    np.testing.assert_array_equal(g_pos[:3], g_x.sum(axis=0))
    np.testing.assert_array_equal(g_pos[3], 0)  # a position beyond T


def first_failing(grads, reference, dtype):
    """The first parameter, in backward order, whose gradient is outside the tolerance."""
    for name in BACKWARD_ORDER:
        try:
            assert_close(f"grad {name}", grads[name], reference[name], tolerance("grad", dtype))
        except AssertionError as error:
            return name, str(error)
    return None, ""


@pytest.mark.parametrize("other", OTHERS)
def test_a_softmax_gradient_without_the_subtraction_is_named_at_the_qkv_projection(other, monkeypatch):
    arrays = init_weights(SMALL, 6, "float64")
    tokens, targets, mask = inputs()
    _, theirs = ADAPTERS[other].loss_and_grads(tokens, targets, arrays, SMALL, mask=mask)
    _, honest = numpy_grads(arrays, SMALL, tokens, targets, mask)
    assert first_failing(honest, theirs, "float64") == (None, "")

    monkeypatch.setattr(backward, "softmax_backward", lambda g_weights, weights: weights * g_weights)  # the fault
    _, faulty = numpy_grads(arrays, SMALL, tokens, targets, mask)
    name, message = first_failing(faulty, theirs, "float64")
    # the read-out and out_proj come before the softmax in the backward pass: still right
    assert name == "attn.qkv_proj.weight", message
    assert message.startswith("grad attn.qkv_proj.weight: max abs difference") and "tolerance 1e-10" in message
