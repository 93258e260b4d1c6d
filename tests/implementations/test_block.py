"""The lesson's properties of the attention block and TinyLM, checked once per registered
backend on the same exchange weights. The invariants every shape and mask must keep (weight
rows summing to 1, exact zeros above the diagonal and where masked, a fully masked row's zero
weights and bias-only output, causality, agreement with numpy_ref) are test_properties.py's,
over random shapes and masks."""

import numpy as np
import pytest

from shared.trace import STAGES
from shared.weights import init_weights
from tests.backends import SMALL, B, T

DTYPES = ["float32", "float64"]


def tokens_for(seed=0, shape=(B, T)):
    return np.random.default_rng(seed).integers(0, SMALL.vocab_size, size=shape)


def embeddings(dtype, seed=0):
    return np.random.default_rng(seed).standard_normal((B, T, SMALL.d_model)).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_shape_conventions(backend, dtype):
    arrays = init_weights(SMALL, seed=1, dtype=dtype)
    out, weights = backend.attention(embeddings(dtype), arrays, SMALL, return_weights=True)
    assert out.shape == (B, T, SMALL.d_model) and out.dtype == dtype
    assert weights.shape == (B, SMALL.n_heads, T, T) and weights.dtype == dtype
    logits, weights = backend.forward(tokens_for(), arrays, SMALL, return_weights=True)
    assert logits.shape == (B, T, SMALL.vocab_size) and logits.dtype == dtype
    assert backend.attention(embeddings(dtype), arrays, SMALL).shape == (B, T, SMALL.d_model)


def test_every_stage_is_traced_with_its_shape(backend):
    trace = {}
    backend.forward(tokens_for(), init_weights(SMALL, 0), SMALL, trace=trace)
    H, D, d = SMALL.n_heads, SMALL.d_model, SMALL.d_head
    assert {name: value.shape for name, value in trace.items()} == {
        "embed": (B, T, D),
        "qkv": (B, T, 3 * D),
        "q": (B, H, T, d),
        "k": (B, H, T, d),
        "v": (B, H, T, d),
        "scores": (B, H, T, T),
        "weights": (B, H, T, T),
        "context": (B, H, T, d),
        "merged": (B, T, D),
        "attn_out": (B, T, D),
        "logits": (B, T, SMALL.vocab_size),
    }
    assert tuple(trace) == STAGES


def heads(x):
    """(B, T, D) -> (B, H, T, d_head): head h holds columns h * d_head .. (h + 1) * d_head - 1."""
    return x.reshape(B, T, SMALL.n_heads, SMALL.d_head).transpose(0, 2, 1, 3)


def test_merging_the_heads_is_the_inverse_of_splitting_them(backend):
    trace = {}
    backend.forward(tokens_for(), init_weights(SMALL, 0), SMALL, trace=trace)
    np.testing.assert_array_equal(heads(trace["merged"]), trace["context"])


@pytest.mark.parametrize("head", range(SMALL.n_heads))
def test_changing_one_heads_rows_changes_only_that_heads_weights(backend, head):
    arrays = init_weights(SMALL, 5, "float64")
    _, before = backend.forward(tokens_for(), arrays, SMALL, return_weights=True)
    d = SMALL.d_head
    changed = dict(arrays)
    qkv = arrays["attn.qkv_proj.weight"].copy()
    qkv[head * d : (head + 1) * d] *= 3.0  # head h's rows of Q
    changed["attn.qkv_proj.weight"] = qkv
    _, after = backend.forward(tokens_for(), changed, SMALL, return_weights=True)
    for other in range(SMALL.n_heads):
        if other == head:
            assert not np.allclose(after[:, other], before[:, other])
        else:
            np.testing.assert_array_equal(after[:, other], before[:, other], err_msg=f"head {other} changed")


def test_qkv_proj_holds_q_k_and_v_in_that_order_each_split_into_heads(backend):
    # the exchange layout of the fused projection: rows 0..D-1 of qkv_proj are Q's (out, in)
    # weights, then K's, then V's, the order of torch.nn.MultiheadAttention's in_proj_weight
    rng = np.random.default_rng(7)
    D = SMALL.d_model
    separate = {name: (rng.uniform(-1, 1, (D, D)), rng.uniform(-1, 1, D)) for name in "qkv"}  # (out, in), (out,)
    arrays = init_weights(SMALL, 7, "float64")
    arrays["attn.qkv_proj.weight"] = np.concatenate([weight for weight, _ in separate.values()])  # (3D, D)
    arrays["attn.qkv_proj.bias"] = np.concatenate([bias for _, bias in separate.values()])  # (3D,)
    trace = {}
    backend.forward(tokens_for(), arrays, SMALL, trace=trace)
    x = trace["embed"]  # (B, T, D)
    projected = {name: x @ weight.T + bias for name, (weight, bias) in separate.items()}  # each (B, T, D)
    np.testing.assert_allclose(trace["qkv"], np.concatenate(list(projected.values()), axis=-1), rtol=0, atol=1e-12)
    for index, (name, value) in enumerate(projected.items()):
        assert trace[name].shape == (B, SMALL.n_heads, T, SMALL.d_head), name
        np.testing.assert_allclose(trace[name], heads(value), rtol=0, atol=1e-12, err_msg=name)
        np.testing.assert_array_equal(trace[name], heads(trace["qkv"][..., index * D : (index + 1) * D]), err_msg=name)  # a reshape, exactly


def test_every_parameter_gets_a_finite_nonzero_gradient_even_with_a_fully_masked_row(autodiff_backend):
    backend = autodiff_backend
    arrays = init_weights(SMALL, 6, "float64")
    keep = np.ones((B, 1, T, T), dtype=bool)
    keep[0, 0, 1, :] = False  # query 1 of sequence 0 may attend to nothing
    tokens = tokens_for(8)
    loss, grads = backend.loss_and_grads(tokens, tokens, arrays, SMALL, mask=keep)
    assert np.isfinite(loss)
    assert set(grads) == set(arrays)
    for name, grad in grads.items():
        assert grad.shape == arrays[name].shape, name
        assert np.isfinite(grad).all(), f"{name} has a non-finite gradient"
        assert np.abs(grad).max() > 1e-8, f"{name} gets no gradient"


def test_padding_mask_broadcast_from_b_1_1_t(backend):
    arrays = init_weights(SMALL, 9, "float64")
    keep = np.ones((B, 1, 1, T), dtype=bool)
    keep[1, ..., 3:] = False  # row 1 is padded after position 2
    _, weights = backend.forward(tokens_for(), arrays, SMALL, mask=keep, return_weights=True)
    assert (weights[1, :, :, 3:] == 0).all()
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-12)
    # the unpadded prefix of row 1 is exactly what a 3-token sequence gives
    short = backend.forward(tokens_for()[:, :3], arrays, SMALL)
    full = backend.forward(tokens_for(), arrays, SMALL, mask=keep)
    np.testing.assert_allclose(full[1, :3], short[1], atol=1e-12)


def test_nan_input_propagates_within_its_sequence_and_never_crashes(backend):
    # decided behaviour: a NaN in position t of one sequence makes that position and every
    # later one NaN, and never touches another sequence of the batch. Earlier positions of
    # the same sequence give weight exactly 0 to it, and 0 * NaN is NaN in IEEE arithmetic:
    # XLA computes it (they become NaN in JAX) while NumPy's and torch's BLAS kernels skip
    # zero weights (they stay finite). So earlier positions are not asserted.
    x = embeddings("float64")
    x[1, 2, 0] = np.nan
    out = backend.attention(x, init_weights(SMALL, 0, "float64"), SMALL)
    assert np.isnan(out[1, 2:]).all()
    assert np.isfinite(out[[0, 2]]).all()


def test_a_mask_is_any_array_like_of_bool_in_every_backend(backend):
    """One rule for masks: a NumPy array, nested lists or the framework's own array of bool, given
    to the NumPy-facing functions or to the layer and model themselves, is converted once where
    the call enters, and every form gives the same numbers (torch's masked_fill_ refuses a mask
    that is not a bool tensor on the scores' device: the block converts it first)."""
    from tests.backends import called_directly, native

    arrays = init_weights(SMALL, 12, "float64")
    keep = np.random.default_rng(13).random((B, 1, T, T)) < 0.7  # (B, 1, T, T): per sequence, every head
    x = embeddings("float64", seed=14)
    forms = {"numpy": keep, "lists": keep.tolist(), "native": native(backend.name, keep)}
    block, whole = called_directly(backend.name, arrays)
    expected_out = backend.attention(x, arrays, SMALL, mask=keep)
    expected_logits = backend.forward(tokens_for(15), arrays, SMALL, mask=keep)
    for form, mask in forms.items():
        got = {
            "attend": backend.attention(x, arrays, SMALL, mask=mask),
            "predict": backend.forward(tokens_for(15), arrays, SMALL, mask=mask),
            "the layer": host(block(x, mask=mask)),
            "the model": host(whole(tokens_for(15), mask=mask)),
        }
        for where, value in got.items():
            expected = expected_out if where in ("attend", "the layer") else expected_logits
            np.testing.assert_array_equal(value, expected, err_msg=f"{backend.name}: a mask as {form} given to {where}")


def host(array):
    """A framework's array as NumPy (a torch tensor that requires grad is detached first)."""
    return array.detach().numpy() if hasattr(array, "detach") else np.asarray(array)
