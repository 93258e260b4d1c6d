"""Generation with a KV cache in PyTorch: the cache (K and V of every position so far in
buffers that are never trained or saved), one forward step over new positions, and
generate(), NumPy in and NumPy out (shared.protocol, capability "generate").

The cache changes the shape contract of K and V, not of Q: a chunk of T new queries at
offset p = cache.length attends to the max_len slots of the cache through rows p..p+T-1 of
the causal mask (torch_impl.attention, steps 3 and 5), at positions p..p+T-1.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from shared import sampling
from torch_impl.attention import DTYPES
from torch_impl.model import TinyLM


class KVCache(nn.Module):
    """K and V of the positions seen so far, (B, H, max_len, d_head) each, of which the first
    `length` slots are filled. Fixed size, like the causal mask; buffers, not parameters."""

    k: torch.Tensor
    v: torch.Tensor

    def __init__(self, batch: int, n_heads: int, max_len: int, d_head: int, *, dtype: str = "float32") -> None:
        super().__init__()
        shape = (batch, n_heads, max_len, d_head)
        # zeros, not empty: the unfilled slots are masked, but 0 * NaN would still be NaN
        self.register_buffer("k", torch.zeros(shape, dtype=DTYPES[dtype]), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=DTYPES[dtype]), persistent=False)
        self.length = 0  # p: how many positions are filled; the next chunk starts here

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a chunk's k, v (B, H, T, d_head) into slots length..length+T-1; returns the
        whole cache (B, H, max_len, d_head) twice, K and V."""
        T = k.shape[2]

        # 1. write the chunk at its positions
        # (in place: a buffer is mutable)
        self.k[:, :, self.length : self.length + T] = k  # slots p..p+T-1 of (B, H, max_len, d_head)
        self.v[:, :, self.length : self.length + T] = v  # slots p..p+T-1 of (B, H, max_len, d_head)

        # 2. count it
        self.length = self.length + T
        return self.k, self.v


def new_cache(model: TinyLM, batch: int) -> KVCache:
    """An empty KVCache for `batch` sequences of `model` (its sizes and dtype)."""
    config = model.config
    dtype = str(model.tok_emb.weight.dtype).removeprefix("torch.")
    return KVCache(batch, config.n_heads, config.max_len, config.d_head, dtype=dtype).to(model.tok_emb.weight.device)


def step(model: TinyLM, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
    """NumPy in, NumPy out: tokens (B, T) at positions cache.length.. -> logits (B, T, V);
    the cache is extended by them."""
    tokens = np.asarray(tokens)
    model.check(tokens, cache=cache)  # the call's one check, on the NumPy input
    return _logits(model, tokens, cache)


def _logits(model: TinyLM, tokens: np.ndarray, cache: KVCache | None = None) -> np.ndarray:
    # the model on NumPy tokens, unchecked: step checks them first, generate its whole request once
    with torch.no_grad():
        return model(torch.from_numpy(tokens).to(model.tok_emb.weight.device), cache=cache).cpu().numpy()


def cache_arrays(cache: KVCache) -> tuple[np.ndarray, np.ndarray]:
    """The filled part of the cache as NumPy: K and V (B, H, length, d_head)."""
    return cache.k[:, :, : cache.length].cpu().numpy().copy(), cache.v[:, :, : cache.length].cpu().numpy().copy()


def generate(
    model: TinyLM, prompt: np.ndarray, max_new_tokens: int, *, greedy: bool = True, temperature: float = 1.0, seed: int = 0, use_cache: bool = True
) -> np.ndarray:
    """prompt int (B, P) -> (B, P + max_new_tokens): the prompt and its continuation, NumPy.

    use_cache=True reads the prompt in one call (prefill), then one new token per call;
    use_cache=False runs the whole prefix again for every token (the reference it must equal).
    greedy picks the argmax; otherwise a draw from softmax(logits / temperature) with `seed`.
    """
    return sampling.generate(
        model, prompt, max_new_tokens, new_cache, _logits, _logits, greedy=greedy, temperature=temperature, seed=seed, use_cache=use_cache
    )
