"""Causal multi-head self-attention with one fused QKV projection, in JAX with Flax NNX."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from shared import checks
from shared.config import ATTN_IMPLS
from shared.trace import record

DTYPES = {"float32": jnp.float32, "float64": jnp.float64}


class CausalMask(nnx.Variable):
    """The register_buffer of Flax: state that is not an nnx.Param, so it is never
    differentiated, never updated by the optimizer and never part of the exchange dict."""


class MultiHeadSelfAttention(nnx.Module):
    """(B, T, D) -> (B, T, D) with H heads of d_head = D // H; position t sees only 0..t.

    The only parameters are qkv_proj (D -> 3D) and out_proj (D -> D). The causal mask is a
    boolean buffer built once for max_len: not a parameter, not saved, sliced to (T, T).
    attn_impl="fused" runs steps 4 to 8 as one call of the framework's attention kernel
    whenever neither the weights nor a trace are asked for; "explicit" always runs them one by one.
    float64 always runs explicitly: the kernel computes its softmax in float32.
    """

    def __init__(self, d_model, n_heads, max_len, bias=True, *, dtype="float32", attn_impl="explicit", rngs: nnx.Rngs):
        checks.check_block(d_model, n_heads, max_len)
        if attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl must be one of {', '.join(ATTN_IMPLS)}; got {attn_impl!r}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.max_len = max_len
        self.attn_impl = attn_impl
        dtype = DTYPES[dtype]
        self.qkv_proj = nnx.Linear(d_model, 3 * d_model, use_bias=bias, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.out_proj = nnx.Linear(d_model, d_model, use_bias=bias, dtype=dtype, param_dtype=dtype, rngs=rngs)
        # True = may attend: on and below the diagonal
        self.causal_mask = CausalMask(jnp.tril(jnp.ones((max_len, max_len), dtype=bool)))

    def __call__(self, x, mask=None, return_weights=False, trace=None):
        """x (B, T, D); mask optional bool, True = may attend, broadcastable to (B, H, T, T).

        Returns out (B, T, D), or (out, weights (B, H, T, T)) with return_weights=True.
        A query row that no key may attend gets all-zero weights.
        """
        checks.check_input(tuple(x.shape), str(x.dtype), self.d_model, self.max_len, str(self.qkv_proj.kernel.dtype))
        B, T, D = x.shape
        if mask is not None:
            checks.check_mask(tuple(mask.shape), str(mask.dtype), (B, self.n_heads, T, T))

        # 1. project: one matmul makes Q, K and V
        qkv = self.qkv_proj(x)  # (B, T, 3D)
        record(trace, "qkv", qkv)

        # 2. split
        q, k, v = jnp.split(qkv, 3, axis=-1)  # 3 x (B, T, D)

        # 3. reshape into heads
        q = q.reshape(B, T, self.n_heads, self.d_head)  # (B, T, H, d_head)
        k = k.reshape(B, T, self.n_heads, self.d_head)  # (B, T, H, d_head)
        v = v.reshape(B, T, self.n_heads, self.d_head)  # (B, T, H, d_head)
        fused = self.attn_impl == "fused" and not return_weights and trace is None
        # jax.nn.dot_product_attention always takes its softmax in float32 (3e-8 off in float64)
        fused = fused and x.dtype != jnp.float64
        if fused:
            return self.out_proj(self._fused_attention(q, k, v, mask))  # (B, T, D)
        q, k, v = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # (B, H, T, d_head)
        record(trace, "q", q)
        record(trace, "k", k)
        record(trace, "v", v)

        # 4. score and scale: keeps the score variance independent of d_head
        q = q * (1.0 / math.sqrt(self.d_head))  # scaling Q is T / d_head times cheaper than scaling the scores
        scores = q @ k.swapaxes(-2, -1)  # (B, H, T, T)
        record(trace, "scores", scores)

        # 5. mask: no query may see a later key
        allowed = self.causal_mask[:T, :T]  # (T, T)
        if mask is not None:
            allowed = allowed & mask  # (B, H, T, T) or broadcastable
        scores = jnp.where(allowed, scores, -jnp.inf)

        # 6. softmax over keys
        weights = nnx.softmax(scores, axis=-1)  # (B, H, T, T)
        if mask is not None:
            # a row with no allowed key is all -inf, which softmax turns into NaN: make it 0
            weights = jnp.where(allowed.any(axis=-1, keepdims=True), weights, 0.0)
        record(trace, "weights", weights)

        # 7. weight the values
        context = weights @ v  # (B, H, T, d_head)
        record(trace, "context", context)

        # 8. merge heads
        merged = context.transpose(0, 2, 1, 3).reshape(B, T, D)  # (B, T, D)
        record(trace, "merged", merged)

        # 9. project out: mixes the heads
        out = self.out_proj(merged)  # (B, T, D)
        record(trace, "attn_out", out)
        return (out, weights) if return_weights else out

    def _fused_attention(self, q, k, v, mask):
        """Steps 4 to 8 in one call of the framework's kernel: q, k, v (B, T, H, d_head) -> (B, T, D).

        Only the causal mask: is_causal (XLA on CPU still builds the (T, T) scores; the cuDNN
        kernel on a GPU does not). An extra mask is ANDed with the causal one exactly as in
        step 5, and a query row with no allowed key gets a zero context, as the explicit path's
        zero weights give.
        """
        B, T, H, d_head = q.shape

        # 1. attend: score, scale, mask, softmax and weight the values in one kernel
        # (jax.nn.dot_product_attention takes (B, T, H, d_head) as it is; its mask is (B, H, T, T))
        if mask is None:
            context = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # (B, T, H, d_head)
            return context.reshape(B, T, H * d_head)  # (B, T, D)
        allowed = self.causal_mask[:T, :T] & mask  # (B, H, T, T) or broadcastable
        context = jax.nn.dot_product_attention(q, k, v, mask=allowed)  # (B, T, H, d_head)

        # 2. a query with no allowed key gets zero context (SDPA gives 0, jax.nn.dot_product_attention the mean of V)
        has_key = jnp.broadcast_to(allowed.any(axis=-1), (B, H, T)).swapaxes(1, 2)  # (B, T, H)
        context = jnp.where(has_key[..., None], context, 0.0)  # (B, T, H, d_head)

        # 3. merge heads
        return context.reshape(B, T, H * d_head)  # (B, T, D)
