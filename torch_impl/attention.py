"""Causal multi-head self-attention with one fused QKV projection, in PyTorch."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from shared import checks
from shared.config import ATTN_IMPLS
from shared.trace import record, recording

if TYPE_CHECKING:  # the cache's module imports this one
    from torch_impl.generate import KVCache

DTYPES = {"float32": torch.float32, "float64": torch.float64}


class MultiHeadSelfAttention(nn.Module):
    """(B, T, D) -> (B, T, D) with H heads of d_head = D // H; position t sees only 0..t.

    The only parameters are qkv_proj (D -> 3D) and out_proj (D -> D). The causal mask is a
    boolean buffer built once for max_len: not a parameter, not saved, sliced to (T, T).
    attn_impl="fused" runs steps 4 to 8 as one call of the framework's attention kernel
    whenever neither the weights nor a trace are asked for; "explicit" always runs them one by one.

    With a KV cache (torch_impl.generate.KVCache) x is a chunk of T new positions p..p+T-1,
    p = cache.length: its K and V are written into the cache, its queries attend to all max_len
    slots of the cache through rows p..p+T-1 of the causal mask (bottom-right aligned; slots
    after p+T-1 are masked), so keys and weights have max_len columns instead of T.
    """

    def __init__(self, d_model: int, n_heads: int, max_len: int, bias: bool = True, *, dtype: str = "float32", attn_impl: str = "explicit") -> None:
        super().__init__()
        checks.check_block(d_model, n_heads, max_len)
        if attn_impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl must be one of {', '.join(ATTN_IMPLS)}; got {attn_impl!r}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.max_len = max_len
        self.fused = attn_impl == "fused"
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias, dtype=DTYPES[dtype])
        self.out_proj = nn.Linear(d_model, d_model, bias=bias, dtype=DTYPES[dtype])
        # True = may attend: on and below the diagonal
        self.register_buffer("causal_mask", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)), persistent=False)

    def check(self, x: Any, mask: Any = None, cache: KVCache | None = None) -> None:
        """Refuse a bad call of the block in one line (shared.checks), before any work: x must be
        (B, T, D) in the block's dtype with T <= max_len; the cache must fit the chunk; the mask
        must be boolean and broadcast to (B, H, T, S); and first the block's own weights, so that a
        weight of the wrong shape is named, not x. forward does not call it: whoever hands the block
        its input checks it once (model.attend; TinyLM's callers check the tokens instead)."""
        checks.check_attention_weights({f"attn.{name}": tuple(value.shape) for name, value in self.named_parameters()}, self.d_model)
        checks.check_input(tuple(x.shape), str(x.dtype), self.d_model, self.max_len, str(self.qkv_proj.weight.dtype))
        B, T, _ = x.shape
        filled = None if cache is None else cache.length
        checks.check_cache_and_mask(B, T, str(x.dtype), self.n_heads, self.max_len, mask, cache, filled)

    def forward(self, x: torch.Tensor, mask: Any = None, return_weights: bool = False, cache: KVCache | None = None) -> Any:
        """x (B, T, D); mask optional, any array-like of bool, True = may attend, broadcastable to
        (B, H, T, S); cache optional KVCache of the positions before x. S = T without a cache,
        max_len with one.

        Returns out (B, T, D), or (out, weights (B, H, T, S)) with return_weights=True.
        A query row that no key may attend gets all-zero weights.
        """
        B, T, D = x.shape
        start = 0 if cache is None else cache.length  # p: the positions already in the cache

        # 1. project: one matmul makes Q, K and V
        qkv = self.qkv_proj(x)  # (B, T, 3D)

        # 2. split
        q, k, v = qkv.split(D, dim=-1)  # 3 x (B, T, D)

        # 3. reshape into heads
        q = q.reshape(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)
        k = k.reshape(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)
        v = v.reshape(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)
        record(qkv=qkv, q=q, k=k, v=v)
        if cache is not None:  # this chunk's K and V join the cached ones in slots p..p+T-1
            k, v = cache.update(k, v)  # (B, H, max_len, d_head)
        if self.fused and not return_weights and not recording():
            return self.out_proj(self._fused_attention(q, k, v, mask, start))  # (B, T, D)

        # 4. score and scale: keeps the score variance independent of d_head
        q = q * (1.0 / math.sqrt(self.d_head))  # Q, not the scores: (B, H, T, d_head) products instead of (B, H, T, S)
        scores = q @ k.transpose(-2, -1)  # (B, H, T, S)
        record(scores=scores)

        # 5. mask: no query may see a later key
        allowed = self._allowed(start, T, k.shape[2], mask)  # (T, S), or (B, H, T, S) with a mask
        scores = scores.masked_fill(~allowed, float("-inf"))

        # 6. softmax over keys
        weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
        if mask is not None:
            # a row with no allowed key is all -inf, which softmax turns into NaN: make it 0
            weights = weights.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)

        # 7. weight the values
        context = weights @ v  # (B, H, T, d_head)

        # 8. merge heads
        merged = context.transpose(1, 2).reshape(B, T, D)  # (B, T, D)

        # 9. project out: mixes the heads
        out = self.out_proj(merged)  # (B, T, D)
        record(weights=weights, context=context, merged=merged, attn_out=out)
        return (out, weights) if return_weights else out

    def _allowed(self, start, T, S, mask):
        """Where a chunk of T queries at positions start..start+T-1 may attend among S keys: rows
        start..start+T-1 of the causal mask, bottom-right aligned (without a cache, start 0 and
        S = T: the top-left (T, T); with one, never that corner), ANDed with `mask`, made a
        tensor here when it is another array-like of bool."""
        allowed = self.causal_mask[start : start + T, :S]  # (T, S)
        return allowed if mask is None else allowed & torch.as_tensor(mask, device=allowed.device)  # (B, H, T, S) or broadcastable

    def _fused_attention(self, q, k, v, mask, start):
        """Steps 4 to 8 in one call of the framework's kernel: q (B, H, T, d_head) and k, v
        (B, H, S, d_head) -> (B, T, D), for the chunk of queries at positions start..start+T-1.

        Only the causal mask and no cache: is_causal, so no (T, T) scores are built at all.
        Otherwise the mask is step 5's (is_causal with S != T would align it top-left), and a
        query row with no allowed key gets a zero context, as the explicit path's zero weights give.
        """
        B, H, T, d_head = q.shape
        if mask is None and k.shape[2] == T:
            context = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)  # (B, T, H, d_head)
            return context.reshape(B, T, H * d_head)  # (B, T, D)
        allowed = self._allowed(start, T, k.shape[2], mask)  # (T, S), or (B, H, T, S) with a mask
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed).transpose(1, 2)  # (B, T, H, d_head)
        # a query with no allowed key: SDPA gives a zero context, jax.nn.dot_product_attention the mean of V
        has_key = allowed.any(dim=-1).expand(B, H, T).transpose(1, 2)  # (B, T, H)
        context = torch.where(has_key[..., None], context, 0.0)  # (B, T, H, d_head)
        return context.reshape(B, T, H * d_head)  # (B, T, D)
