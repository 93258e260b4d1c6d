"""attn_impl="fused" (F.scaled_dot_product_attention / jax.nn.dot_product_attention) against
the explicit path and numpy_ref, at docs/DESIGN.md's tolerances: outputs, logits and gradients, with
and without extra masks, including query rows that may attend to nothing."""

import dataclasses
import importlib

import numpy as np
import pytest

from shared.tolerances import assert_close, tolerance
from shared.weights import init_weights
from tests.backends import ADAPTERS, SMALL, B, T, names, new_block
from tests.tiers import first_fast

FUSED = dataclasses.replace(SMALL, attn_impl="fused")
DTYPES = ["float32", "float64"]
H = SMALL.n_heads


def _masks():
    rng = np.random.default_rng(20)
    row = np.ones((T, T), dtype=bool)
    row[2, :] = False  # query 2 may attend to nothing
    padding = np.ones((B, 1, 1, T), dtype=bool)
    padding[1, ..., 3:] = False  # sequence 1 is padded after position 2
    padding[2, ..., :] = False  # sequence 2 is all padding: every one of its rows is empty
    full = rng.random((B, H, T, T)) < 0.6
    full[0, 1, 3, :] = False
    full[:, :, 0, 0] = False  # the first query loses its only causal key
    return {"none": None, "row-masked": row, "padding": padding, "random-per-head": full}


MASKS = _masks()


def tokens_for(seed=0):
    return np.random.default_rng(seed).integers(0, SMALL.vocab_size, size=(B, T))


def embeddings(dtype, seed=0):
    return np.random.default_rng(seed).standard_normal((B, T, SMALL.d_model)).astype(dtype)


@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize("dtype", first_fast(DTYPES))
def test_fused_block_equals_explicit_block(fused_backend, dtype, mask_name):
    arrays = init_weights(SMALL, 1, dtype)
    mask = MASKS[mask_name]
    x = embeddings(dtype)
    explicit = fused_backend.attention(x, arrays, SMALL, mask=mask)
    fused = fused_backend.attention(x, arrays, FUSED, mask=mask)
    assert fused.dtype == dtype and fused.shape == (B, T, SMALL.d_model)
    assert np.isfinite(fused).all()
    assert_close(f"{fused_backend.name} fused vs explicit", fused, explicit, tolerance("stage", dtype))
    reference = ADAPTERS["numpy"].attention(x, arrays, SMALL, mask=mask)
    assert_close(f"{fused_backend.name} fused vs numpy_ref", fused, reference, tolerance("stage", dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_empty_row_gets_zero_context_so_the_output_is_the_out_proj_bias(fused_backend, dtype):
    arrays = init_weights(SMALL, 2, dtype)
    out = fused_backend.attention(embeddings(dtype), arrays, FUSED, mask=MASKS["row-masked"])
    bias = np.broadcast_to(arrays["attn.out_proj.bias"], (B, SMALL.d_model))
    assert_close("output of the empty row", out[:, 2], bias, tolerance("stage", dtype))


@pytest.mark.parametrize("mask_name", ["none", "random-per-head"])
@pytest.mark.parametrize("dtype", first_fast(DTYPES))
def test_fused_model_logits_equal_numpy_ref(fused_backend, dtype, mask_name):
    arrays = init_weights(SMALL, 3, dtype)
    mask = MASKS[mask_name]
    expected = ADAPTERS["numpy"].forward(tokens_for(), arrays, SMALL, mask=mask)
    actual = fused_backend.forward(tokens_for(), arrays, FUSED, mask=mask)
    assert_close(f"{fused_backend.name} fused logits", actual, expected, tolerance("stage", dtype))


@pytest.mark.parametrize("mask_name", ["none", "random-per-head"])
@pytest.mark.parametrize("dtype", first_fast(DTYPES))
def test_fused_gradients_equal_explicit_gradients(fused_backend, dtype, mask_name):
    arrays = init_weights(SMALL, 4, dtype)
    tokens = tokens_for(5)
    mask = MASKS[mask_name]
    loss, grads = fused_backend.loss_and_grads(tokens, tokens, arrays, SMALL, mask=mask)
    fused_loss, fused_grads = fused_backend.loss_and_grads(tokens, tokens, arrays, FUSED, mask=mask)
    assert_close("loss", fused_loss, loss, tolerance("stage", dtype))
    for name, grad in grads.items():
        assert np.isfinite(fused_grads[name]).all(), name
        assert_close(f"d loss / d {name}", fused_grads[name], grad, tolerance("grad", dtype))


def test_weights_or_a_trace_take_the_explicit_path(fused_backend, monkeypatch):
    calls = _count_kernel_calls(fused_backend.name, monkeypatch)
    arrays = init_weights(SMALL, 6, "float32")
    x = embeddings("float32")
    fused_backend.attention(x, arrays, FUSED)
    assert calls == [1]
    out, weights = fused_backend.attention(x, arrays, FUSED, return_weights=True)
    assert calls == [1] and weights.shape == (B, H, T, T)
    explicit, explicit_weights = fused_backend.attention(x, arrays, SMALL, return_weights=True)
    np.testing.assert_array_equal(out, explicit)
    np.testing.assert_array_equal(weights, explicit_weights)
    trace = {}
    fused_backend.forward(tokens_for(), arrays, FUSED, trace=trace)
    assert calls == [1] and "weights" in trace
    fused_backend.forward(tokens_for(), arrays, FUSED, mask=MASKS["padding"])
    assert calls == [2]
    fused_backend.forward(tokens_for(), arrays, SMALL)
    assert calls == [2]  # attn_impl="explicit" never calls the kernel


# the kernel behind attn_impl="fused" in each backend that has one (a fused backend missing here
# fails the kernel-counting tests with its name), and whether float64 runs it:
# jax.nn.dot_product_attention takes its softmax in float32 whatever the input (3e-8 off in
# float64, against the 1e-10 tolerance), so the JAX block keeps float64 on the explicit path
KERNELS = {
    "torch": ("torch.nn.functional", "scaled_dot_product_attention", True),
    "jax": ("jax.nn", "dot_product_attention", False),
}


def test_float64_runs_the_kernel_only_where_it_keeps_float64(fused_backend, monkeypatch):
    calls = _count_kernel_calls(fused_backend.name, monkeypatch)
    fused_backend.attention(embeddings("float64"), init_weights(SMALL, 6, "float64"), FUSED)
    assert calls == [1 if KERNELS[fused_backend.name][2] else 0]


def _count_kernel_calls(name, monkeypatch):
    calls = [0]
    module_name, attribute, _ = KERNELS[name]
    module = importlib.import_module(module_name)
    kernel = getattr(module, attribute)

    def counted(*args, **kwargs):
        calls[0] += 1
        return kernel(*args, **kwargs)

    monkeypatch.setattr(module, attribute, counted)
    return calls


def test_fused_jax_block_under_jit_equals_explicit():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jax_impl.model import from_exchange

    arrays = init_weights(SMALL, 7, "float32")
    x = jnp.asarray(embeddings("float32"))
    mask = jnp.asarray(MASKS["random-per-head"])
    fused_block = from_exchange(arrays, FUSED).attn
    graphdef, state = nnx.split(fused_block)
    compiled = jax.jit(lambda state, x, mask: nnx.merge(graphdef, state)(x, mask=mask))
    explicit = from_exchange(arrays, SMALL).attn(x, mask=mask)
    assert_close("jitted fused vs explicit", compiled(state, x, mask), explicit, tolerance("stage", "float32"))


@pytest.mark.parametrize("name", names("layers"))
def test_an_unknown_attn_impl_is_refused(name):
    with pytest.raises(ValueError, match="attn_impl must be one of explicit, fused; got 'flash'"):
        new_block(name, 24, 4, 7, attn_impl="flash")
