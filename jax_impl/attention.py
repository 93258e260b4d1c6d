"""Causal multi-head self-attention with one fused QKV projection, in JAX with Flax NNX."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import nnx

from shared import checks
from shared.config import ATTN_IMPLS
from shared.trace import record, recording

if TYPE_CHECKING:  # the cache's module imports this one
    from jax_impl.generate import KVCache

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

    With a KV cache (jax_impl.generate.KVCache) x is a chunk of T new positions p..p+T-1,
    p = cache.length: its K and V are written into the cache, its queries attend to all max_len
    slots of the cache through rows p..p+T-1 of the causal mask (bottom-right aligned; slots
    after p+T-1 are masked), so keys and weights have max_len columns instead of T. p may be a
    traced value: the shapes depend on max_len only, so one compiled decode step serves every p.
    """

    def __init__(
        self, d_model: int, n_heads: int, max_len: int, bias: bool = True, *, dtype: str = "float32", attn_impl: str = "explicit", rngs: nnx.Rngs
    ) -> None:
        checks.check_block(d_model, n_heads, max_len)
        if attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl must be one of {', '.join(ATTN_IMPLS)}; got {attn_impl!r}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.max_len = max_len
        self.fused = attn_impl == "fused" and dtype != "float64"  # jax.nn.dot_product_attention takes its softmax in float32
        self.qkv_proj = nnx.Linear(d_model, 3 * d_model, use_bias=bias, dtype=DTYPES[dtype], param_dtype=DTYPES[dtype], rngs=rngs)
        self.out_proj = nnx.Linear(d_model, d_model, use_bias=bias, dtype=DTYPES[dtype], param_dtype=DTYPES[dtype], rngs=rngs)
        # True = may attend: on and below the diagonal
        self.causal_mask = CausalMask(jnp.tril(jnp.ones((max_len, max_len), dtype=bool)))

    def check(self, x: Any, mask: Any = None, cache: KVCache | None = None) -> None:
        """Refuse a bad call of the block in one line (shared.checks), before any work: x must be
        (B, T, D) in the block's dtype with T <= max_len; the cache must fit the chunk; the mask
        must be boolean and broadcast to (B, H, T, S); and first the block's own weights, so that a
        weight of the wrong shape is named, not x. __call__ does not call it: whoever hands the block
        its input checks it once (model.attend; TinyLM's callers check the tokens instead)."""
        checks.check_attention_weights(self._weight_shapes(), self.d_model)
        checks.check_input(tuple(x.shape), str(x.dtype), self.d_model, self.max_len, str(self.qkv_proj.kernel.dtype))
        B, T, _ = x.shape
        filled = None if cache is None else _concrete(cache.length[...])
        checks.check_cache_and_mask(B, T, str(x.dtype), self.n_heads, self.max_len, mask, cache, filled)

    def __call__(self, x: jax.Array, mask: Any = None, return_weights: bool = False, cache: KVCache | None = None) -> Any:
        """x (B, T, D); mask optional, any array-like of bool, True = may attend, broadcastable to
        (B, H, T, S); cache optional KVCache of the positions before x. S = T without a cache,
        max_len with one.

        Returns out (B, T, D), or (out, weights (B, H, T, S)) with return_weights=True.
        A query row that no key may attend gets all-zero weights.
        """
        B, T, D = x.shape
        start = 0 if cache is None else cache.length[...]  # p: the positions already in the cache

        # 1. project: one matmul makes Q, K and V
        qkv = self.qkv_proj(x)  # (B, T, 3D)

        # 2. split
        q, k, v = jnp.split(qkv, 3, axis=-1)  # 3 x (B, T, D)

        # 3. reshape into heads
        q = q.reshape(B, T, self.n_heads, self.d_head).transpose(0, 2, 1, 3)  # (B, H, T, d_head)
        k = k.reshape(B, T, self.n_heads, self.d_head).transpose(0, 2, 1, 3)  # (B, H, T, d_head)
        v = v.reshape(B, T, self.n_heads, self.d_head).transpose(0, 2, 1, 3)  # (B, H, T, d_head)
        record(qkv=qkv, q=q, k=k, v=v)
        if cache is not None:  # this chunk's K and V join the cached ones in slots p..p+T-1
            k, v = cache.update(k, v)  # (B, H, max_len, d_head)
        if self.fused and not return_weights and not recording():
            return self.out_proj(self._fused_attention(q, k, v, mask, start))  # (B, T, D)

        # 4. score and scale: keeps the score variance independent of d_head
        q = q * (1.0 / math.sqrt(self.d_head))  # Q, not the scores: (B, H, T, d_head) products instead of (B, H, T, S)
        scores = q @ k.swapaxes(-2, -1)  # (B, H, T, S)
        record(scores=scores)

        # 5. mask: no query may see a later key
        allowed = self._allowed(start, T, k.shape[2], mask)  # (T, S), or (B, H, T, S) with a mask
        scores = jnp.where(allowed, scores, -jnp.inf)

        # 6. softmax over keys
        weights = nnx.softmax(scores, axis=-1)  # (B, H, T, S)
        if mask is not None:
            # a row with no allowed key is all -inf, which softmax turns into NaN: make it 0
            weights = jnp.where(allowed.any(axis=-1, keepdims=True), weights, 0.0)

        # 7. weight the values
        context = weights @ v  # (B, H, T, d_head)

        # 8. merge heads
        merged = context.transpose(0, 2, 1, 3).reshape(B, T, D)  # (B, T, D)

        # 9. project out: mixes the heads
        out = self.out_proj(merged)  # (B, T, D)
        record(weights=weights, context=context, merged=merged, attn_out=out)
        return (out, weights) if return_weights else out

    def _weight_shapes(self):
        # the block's parameters by exchange name, in the exchange layout: a Flax kernel is (in, out)
        shapes = {}
        for name in ("qkv_proj", "out_proj"):
            layer = getattr(self, name)
            shapes[f"attn.{name}.weight"] = layer.kernel.shape[::-1]
            if layer.bias is not None:
                shapes[f"attn.{name}.bias"] = layer.bias.shape
        return shapes

    def _allowed(self, start, T, S, mask):
        """Where a chunk of T queries at positions start..start+T-1 may attend among S keys: rows
        start..start+T-1 of the causal mask, bottom-right aligned (without a cache, start 0 and
        S = T: the top-left (T, T); with one, never that corner), ANDed with `mask`, made a
        jax array here when it is another array-like of bool. start may be traced, so the rows
        are a dynamic slice (a Python slice needs concrete bounds)."""
        allowed = jax.lax.dynamic_slice_in_dim(self.causal_mask[...], start, T)[:, :S]  # (T, S)
        return allowed if mask is None else allowed & jnp.asarray(mask)  # (B, H, T, S) or broadcastable

    def _fused_attention(self, q, k, v, mask, start):
        """Steps 4 to 8 in one call of the framework's kernel: q (B, H, T, d_head) and k, v
        (B, H, S, d_head) -> (B, T, D), for the chunk of queries at positions start..start+T-1.

        Only the causal mask and no cache: is_causal (XLA on CPU still builds the (T, T) scores;
        the cuDNN kernel on a GPU does not). Otherwise the mask is step 5's (is_causal with S != T
        would align it top-left), and a query row with no allowed key gets a zero context, as the
        explicit path's zero weights give.
        """
        B, H, T, d_head = q.shape
        q, k, v = q.swapaxes(1, 2), k.swapaxes(1, 2), v.swapaxes(1, 2)  # jax's kernel takes positions before heads
        if mask is None and k.shape[1] == T:
            context = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # (B, T, H, d_head)
            return context.reshape(B, T, H * d_head)  # (B, T, D)
        allowed = self._allowed(start, T, k.shape[1], mask)  # (T, S), or (B, H, T, S) with a mask
        context = jax.nn.dot_product_attention(q, k, v, mask=allowed)  # (B, T, H, d_head)
        # a query with no allowed key: SDPA gives a zero context, jax.nn.dot_product_attention the mean of V
        has_key = jnp.broadcast_to(allowed.any(axis=-1), (B, H, T)).swapaxes(1, 2)  # (B, T, H)
        context = jnp.where(has_key[..., None], context, 0.0)  # (B, T, H, d_head)
        return context.reshape(B, T, H * d_head)  # (B, T, D)


def _concrete(value):
    """The value of a count known now, or None while jax traces it (then only its shape is known).
    jax.core.Tracer is public API in jax 0.10.2 (jax/core.py re-exports it)."""
    return None if isinstance(value, jax.core.Tracer) else int(value)
