"""Causal multi-head self-attention as small pure NumPy functions (float32 or float64)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from shared import checks
from shared.trace import record

if TYPE_CHECKING:  # the cache's module imports this one
    from numpy_ref.generate import KVCache


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x (..., in) @ weight (out, in)^T + bias (out,) -> (..., out): PyTorch layout."""
    out = x @ weight.T  # (..., out)
    return out if bias is None else out + bias


def causal_mask(T: int) -> np.ndarray:
    """(T, T) bool, True on and below the diagonal: query i may attend to keys 0..i."""
    return np.tril(np.ones((T, T), dtype=bool))


def allowed_keys(start: int, T: int, S: int, mask: Any = None) -> np.ndarray:
    """Where a chunk of T queries at positions start..start+T-1 may attend among S keys: rows
    start..start+T-1 of the causal mask, bottom-right aligned (without a cache, start 0 and
    S = T: the top-left (T, T); with one, never that corner), ANDed with `mask`, any
    array-like of bool."""
    allowed = causal_mask(S)[start : start + T]  # (T, S)
    return allowed if mask is None else allowed & np.asarray(mask)  # (B, H, T, S) or broadcastable


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """(B, T, D) -> (B, H, T, d_head)."""
    B, T, D = x.shape
    return x.reshape(B, T, n_heads, D // n_heads).transpose(0, 2, 1, 3)  # (B, H, T, d_head)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, T, d_head) -> (B, T, D), the inverse of split_heads."""
    B, H, T, d_head = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * d_head)  # (B, T, D)


def softmax(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; a row that is all -inf (no allowed key) gives zeros, not NaN."""
    row_max = scores.max(axis=-1, keepdims=True)
    row_max = np.where(np.isneginf(row_max), 0, row_max)  # subtract the max for stability
    exp = np.exp(scores - row_max)
    total = exp.sum(axis=-1, keepdims=True)
    return exp / np.where(total == 0, 1, total)


def check_attention(x: np.ndarray, params: dict[str, np.ndarray], n_heads: int, mask: Any = None, cache: KVCache | None = None) -> None:
    """Refuse a bad call of `attention` in one line (shared.checks), before any work: the `attn.*`
    weights must have the shapes of one d_model, D (out_proj's (D, D) sets it), so that a wrong
    weight is named rather than blamed on x; x must be (B, T, D) in the weights' dtype; the cache
    must fit the chunk; the mask must be boolean and broadcast to (B, H, T, S). `attention` does
    not call it: whoever hands it its input checks it once (model.attend, or the caller of the
    function itself)."""
    D = params["attn.out_proj.weight"].shape[0]
    checks.check_block(D, n_heads, max_len=None)
    checks.check_attention_weights({name: value.shape for name, value in params.items() if name.startswith("attn.")}, D)
    checks.check_input(x.shape, x.dtype.name, D, max_len=None, block_dtype=params["attn.qkv_proj.weight"].dtype.name)  # no context limit
    B, T, _ = x.shape
    max_len = T if cache is None else cache.k.shape[2]  # the pure function's context is its cache's, or unlimited
    filled = None if cache is None else cache.length
    checks.check_cache_and_mask(B, T, x.dtype.name, n_heads, max_len, mask, cache, filled)


def attention(
    x: np.ndarray, params: dict[str, np.ndarray], n_heads: int, mask: Any = None, return_weights: bool = False, cache: KVCache | None = None
) -> Any:
    """Causal self-attention of x (B, T, D) with the `attn.*` arrays of the exchange dict.

    mask: optional, any array-like of bool, True = may attend, broadcastable to (B, H, T, S),
    ANDed with the causal mask. cache: optional KVCache (numpy_ref.generate) of the positions
    before x; x is then the chunk at positions p..p+T-1, p = cache.length, whose K and V are
    written into the cache, and S = the cache's max_len (T without a cache). Returns out
    (B, T, D), or (out, weights (B, H, T, S)).
    """
    B, T, D = x.shape
    start = 0 if cache is None else cache.length  # p: the positions already in the cache

    # 1. project: one matmul makes Q, K and V
    qkv = linear(x, params["attn.qkv_proj.weight"], params.get("attn.qkv_proj.bias"))  # (B, T, 3D)

    # 2. split
    q, k, v = np.split(qkv, 3, axis=-1)  # 3 x (B, T, D)

    # 3. reshape into heads
    q = split_heads(q, n_heads)  # (B, H, T, d_head)
    k = split_heads(k, n_heads)  # (B, H, T, d_head)
    v = split_heads(v, n_heads)  # (B, H, T, d_head)
    record(qkv=qkv, q=q, k=k, v=v)
    if cache is not None:  # this chunk's K and V join the cached ones in slots p..p+T-1
        k, v = cache.update(k, v)  # (B, H, max_len, d_head)

    # 4. score and scale: keeps the score variance independent of d_head
    q = q * (1.0 / math.sqrt(D // n_heads))  # Q, not the scores: (B, H, T, d_head) products instead of (B, H, T, S)
    scores = q @ k.swapaxes(-2, -1)  # (B, H, T, S)
    record(scores=scores)

    # 5. mask: no query may see a later key
    allowed = allowed_keys(start, T, k.shape[2], mask)  # (T, S), or (B, H, T, S) with a mask
    scores = np.where(allowed, scores, -np.inf)

    # 6. softmax over keys
    weights = softmax(scores)  # (B, H, T, S)

    # 7. weight the values
    context = weights @ v  # (B, H, T, d_head)

    # 8. merge heads
    merged = merge_heads(context)  # (B, T, D)

    # 9. project out: mixes the heads
    out = linear(merged, params["attn.out_proj.weight"], params.get("attn.out_proj.bias"))  # (B, T, D)
    record(weights=weights, context=context, merged=merged, attn_out=out)
    return (out, weights) if return_weights else out
