"""Generation with a KV cache in pure NumPy: the cache (K and V of every position so far),
one forward step over new positions, and generate() (shared.protocol, capability "generate").

The cache changes the shape contract of K and V, not of Q: a chunk of T new queries at
offset p = cache.length attends to the max_len slots of the cache through rows p..p+T-1 of
the causal mask (numpy_ref.attention, steps 3 and 5), at positions p..p+T-1.
"""

from __future__ import annotations

import numpy as np

from numpy_ref.model import TinyLM
from shared import sampling


class KVCache:
    """K and V of the positions seen so far, (B, H, max_len, d_head) each, of which the first
    `length` slots are filled. Fixed size, like the frameworks' caches."""

    def __init__(self, batch: int, n_heads: int, max_len: int, d_head: int, *, dtype: str = "float32") -> None:
        shape = (batch, n_heads, max_len, d_head)
        # zeros, not empty: the unfilled slots are masked, but 0 * NaN would still be NaN
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.length = 0  # p: how many positions are filled; the next chunk starts here

    def update(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write a chunk's k, v (B, H, T, d_head) into slots length..length+T-1; returns the
        whole cache (B, H, max_len, d_head) twice, K and V."""
        T = k.shape[2]

        # 1. write the chunk at its positions
        self.k[:, :, self.length : self.length + T] = k  # slots p..p+T-1 of (B, H, max_len, d_head)
        self.v[:, :, self.length : self.length + T] = v  # slots p..p+T-1 of (B, H, max_len, d_head)

        # 2. count it
        self.length = self.length + T
        return self.k, self.v


def new_cache(model: TinyLM, batch: int) -> KVCache:
    """An empty KVCache for `batch` sequences of `model` (its sizes and dtype)."""
    config = model.config
    return KVCache(batch, config.n_heads, config.max_len, config.d_head, dtype=model.params["tok_emb.weight"].dtype.name)


def step(model: TinyLM, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
    """tokens (B, T) at positions cache.length.. -> logits (B, T, V); the cache is extended by them."""
    tokens = np.asarray(tokens)
    model.check(tokens, cache=cache)  # the call's one check
    return _logits(model, tokens, cache)


def _logits(model: TinyLM, tokens: np.ndarray, cache: KVCache | None = None) -> np.ndarray:
    # the model on NumPy tokens, unchecked: step checks them first, generate its whole request once
    return model(np.asarray(tokens), cache=cache)


def cache_arrays(cache: KVCache) -> tuple[np.ndarray, np.ndarray]:
    """The filled part of the cache: K and V (B, H, length, d_head), copies."""
    return cache.k[:, :, : cache.length].copy(), cache.v[:, :, : cache.length].copy()


def generate(
    model: TinyLM, prompt: np.ndarray, max_new_tokens: int, *, greedy: bool = True, temperature: float = 1.0, seed: int = 0, use_cache: bool = True
) -> np.ndarray:
    """prompt int (B, P) -> (B, P + max_new_tokens): the prompt and its continuation.

    use_cache=True reads the prompt in one call (prefill), then one new token per call;
    use_cache=False runs the whole prefix again for every token (the reference it must equal).
    greedy picks the argmax; otherwise a draw from softmax(logits / temperature) with `seed`.
    """
    return sampling.generate(
        model, prompt, max_new_tokens, new_cache, _logits, _logits, greedy=greedy, temperature=temperature, seed=seed, use_cache=use_cache
    )
