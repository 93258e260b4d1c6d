"""Property-based checks (hypothesis) over random valid shapes and random boolean masks,
fully masked query rows included: outputs finite, every weight row summing to 1 (or to 0 when
no key is allowed, the output then out_proj's bias alone), exact zeros above the diagonal and
where masked, causality, and every backend agreeing with numpy_ref within the docs/DESIGN.md
tolerances. These are the one place each of these invariants is tested.

Deterministic (derandomize) and small. Eager backends see every random shape; a backend
whose calls compile per shape ("jit" in the registry, such as JAX: about a second per new
shape on a 2-core CPU) is checked on random masks, weights and inputs within a few fixed odd shapes.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from mhsa import registry
from shared.config import ModelConfig
from shared.tolerances import assert_close, tolerance
from shared.weights import init_weights
from tests.backends import ADAPTERS, names

REFERENCE, *OTHERS = names()
EAGER = [name for name in OTHERS if "jit" not in registry.get(name).supports]
JITTED = [name for name in OTHERS if "jit" in registry.get(name).supports]


def examples(n):
    return settings(
        max_examples=n, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
    )


# B, T, H, d_head, V, dtype for the compiled backends: odd and distinct, one per dtype
JIT_SHAPES = [(3, 6, 3, 5, 13, "float64"), (2, 5, 4, 2, 7, "float32")]


@st.composite
def cases(draw, shapes=None):
    """(config, B, T, dtype, seed, mask or None): B 1-3, T 1-6, H 1-4, d_head 1-5, V 2-13."""
    if shapes is None:
        B, T, H, d_head = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 4)), draw(st.integers(1, 5))
        V, dtype = draw(st.integers(2, 13)), draw(st.sampled_from(["float32", "float64"]))
        max_len = T + draw(st.integers(0, 1))  # T == max_len, or one shorter
        # every shape that broadcasts to (B, H, T, T): shared, key padding, per batch, per head
        mask_shapes = [None, (T, T), (B, 1, 1, T), (B, 1, T, T), (1, H, T, T), (B, H, T, T)]
    else:
        B, T, H, d_head, V, dtype = draw(st.sampled_from(shapes))
        max_len = T
        mask_shapes = [None, (T, T), (B, H, T, T)]  # each new mask shape is a new JAX compile
    config = ModelConfig(vocab_size=V, d_model=H * d_head, n_heads=H, max_len=max_len)
    shape = draw(st.sampled_from(mask_shapes))
    mask = None
    if shape is not None:
        mask = draw(arrays(np.bool_, shape, elements=st.booleans(), fill=st.nothing()))  # every entry drawn
        if shape[-2] == T and draw(st.booleans()):
            mask[..., draw(st.integers(0, T - 1)), :] = False  # a query row with no allowed key
    return config, B, T, dtype, draw(st.integers(0, 2**16)), mask


def allowed_keys(mask, B, H, T):
    """(B, H, T, T): what each query may attend, the causal mask ANDed with `mask`."""
    causal = np.tril(np.ones((T, T), dtype=bool))
    return np.broadcast_to(causal if mask is None else causal & mask, (B, H, T, T))


def check_weights(name, weights, allowed, dtype):
    # rows with an allowed key sum to 1; rows without one are all exactly 0, never NaN
    assert np.isfinite(weights).all(), name
    assert (weights[~allowed] == 0).all(), name  # exactly zero above the diagonal and where masked, not just small
    assert (weights[allowed] > 0).all(), name  # every allowed key gets a share
    has_key = allowed.any(axis=-1)
    np.testing.assert_allclose(weights.sum(axis=-1)[has_key], 1.0, rtol=0, atol=tolerance("weights", dtype), err_msg=name)
    assert (weights[~has_key] == 0).all(), name


def check_block(names, case, t):
    """Every property of the block for the backends `names`, and their agreement with numpy_ref."""
    config, B, T, dtype, seed, mask = case
    params = init_weights(config, seed, dtype)
    x = np.random.default_rng(seed).standard_normal((B, T, config.d_model)).astype(dtype)
    later = x.copy()
    later[:, t:] = np.random.default_rng(seed + 1).standard_normal(later[:, t:].shape)  # positions t.. change
    allowed = allowed_keys(mask, B, config.n_heads, T)
    results = {}
    for name in [REFERENCE, *names]:
        backend = ADAPTERS[name]
        out, weights = backend.attention(x, params, config, mask=mask, return_weights=True)
        assert out.shape == x.shape and out.dtype == dtype and np.isfinite(out).all(), name
        check_weights(name, weights, allowed, dtype)
        # a query with no allowed key has a zero context: its output is out_proj's bias alone
        empty = ~allowed.any(axis=-1).any(axis=1)  # (B, T): no key in any head
        bias = np.broadcast_to(params["attn.out_proj.bias"], out.shape)
        np.testing.assert_allclose(out[empty], bias[empty], rtol=0, atol=tolerance("stage", dtype), err_msg=name)
        # causality: changing positions t.. leaves every earlier output exactly as it was
        np.testing.assert_array_equal(backend.attention(later, params, config, mask=mask)[:, :t], out[:, :t], err_msg=name)
        results[name] = out, weights
    for name in names:
        assert_close(f"{name} out", results[name][0], results[REFERENCE][0], tolerance("stage", dtype))
        assert_close(f"{name} weights", results[name][1], results[REFERENCE][1], tolerance("weights", dtype))


def check_model(names, case):
    """TinyLM on random ids: finite logits, proper weights, and agreement with numpy_ref."""
    config, B, T, dtype, seed, mask = case
    params = init_weights(config, seed, dtype)
    tokens = np.random.default_rng(seed).integers(0, config.vocab_size, size=(B, T))
    allowed = allowed_keys(mask, B, config.n_heads, T)
    results = {}
    for name in [REFERENCE, *names]:
        logits, weights = ADAPTERS[name].forward(tokens, params, config, mask=mask, return_weights=True)
        assert logits.shape == (B, T, config.vocab_size) and np.isfinite(logits).all(), name
        check_weights(name, weights, allowed, dtype)
        results[name] = logits, weights
    for name in names:
        assert_close(f"{name} logits", results[name][0], results[REFERENCE][0], tolerance("stage", dtype))
        assert_close(f"{name} weights", results[name][1], results[REFERENCE][1], tolerance("weights", dtype))


@examples(30)
@given(cases(), st.data())
def test_block_properties_over_random_shapes(case, data):
    check_block(EAGER, case, data.draw(st.integers(0, case[2] - 1), label="first changed position"))


@examples(30)
@given(cases())
def test_model_properties_over_random_shapes(case):
    check_model(EAGER, case)


@pytest.mark.slow  # every drawn case compiled (jax.jit, torch.compile)
@examples(20)
@given(cases(JIT_SHAPES), st.data())
def test_compiled_backends_agree_on_random_masks_weights_and_inputs(case, data):
    check_block(JITTED, case, data.draw(st.integers(0, case[2] - 1), label="first changed position"))
    check_model(JITTED, case)
