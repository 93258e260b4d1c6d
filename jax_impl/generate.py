"""Generation with a KV cache in JAX/Flax NNX: the cache (K and V of every position so far in
nnx.Cache variables, state that is not a parameter), one forward step over new positions, and
generate(), NumPy in and NumPy out (shared.protocol, capability "generate").

The cache changes the shape contract of K and V, not of Q: a chunk of T new queries at
offset p = cache.length attends to the max_len slots of the cache through rows p..p+T-1 of
the causal mask (jax_impl.attention, steps 3 and 5), at positions p..p+T-1. Every shape
depends on max_len only and p is a traced value, so the one-token step compiles once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_impl.attention import DTYPES
from jax_impl.model import TinyLM, _forward
from shared import sampling


class KVCache(nnx.Module):
    """K and V of the positions seen so far, (B, H, max_len, d_head) each, of which the first
    `length` slots are filled. Fixed size, like the causal mask; nnx.Cache, not nnx.Param."""

    def __init__(self, batch: int, n_heads: int, max_len: int, d_head: int, *, dtype: str = "float32") -> None:
        shape = (batch, n_heads, max_len, d_head)
        # zeros, not empty: the unfilled slots are masked, but 0 * NaN would still be NaN
        self.k = nnx.Cache(jnp.zeros(shape, dtype=DTYPES[dtype]))
        self.v = nnx.Cache(jnp.zeros(shape, dtype=DTYPES[dtype]))
        self.length = nnx.Cache(jnp.array(0, dtype=jnp.int32))  # p: how many positions are filled

    def update(self, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Write a chunk's k, v (B, H, T, d_head) into slots length..length+T-1; returns the
        whole cache (B, H, max_len, d_head) twice, K and V."""
        T = k.shape[2]

        # 1. write the chunk at its positions
        # (the offset is traced under jit: dynamic_update_slice, not a slice assignment)
        start = self.length[...]
        self.k[...] = jax.lax.dynamic_update_slice_in_dim(self.k[...], k, start, axis=2)  # slots p..p+T-1 of (B, H, max_len, d_head)
        self.v[...] = jax.lax.dynamic_update_slice_in_dim(self.v[...], v, start, axis=2)  # slots p..p+T-1 of (B, H, max_len, d_head)

        # 2. count it
        self.length[...] = start + T
        return self.k[...], self.v[...]


def new_cache(model: TinyLM, batch: int) -> KVCache:
    """An empty KVCache for `batch` sequences of `model` (its sizes and dtype)."""
    config = model.config
    dtype = str(model.tok_emb.embedding.dtype)
    # on the model's device (a GPU after train(..., device="cuda")), so the compiled step can donate it
    with jax.default_device(next(iter(model.tok_emb.embedding[...].devices()))):
        return KVCache(batch, config.n_heads, config.max_len, config.d_head, dtype=dtype)


def step(model: TinyLM, tokens: np.ndarray, cache: KVCache) -> np.ndarray:
    """NumPy in, NumPy out: tokens (B, T) at positions cache.length.. -> logits (B, T, V);
    the cache is extended by them."""
    tokens = np.asarray(tokens)
    model.check(tokens, cache=cache)  # here, where the ids and the count are known; the compiled step sees neither
    return _logits(model, tokens, cache)


def _logits(model: TinyLM, tokens: np.ndarray, cache: KVCache | None = None) -> np.ndarray:
    # the model on NumPy tokens, compiled and unchecked: step checks them first, generate its whole request once
    if cache is None:
        return np.asarray(_forward(*nnx.split(model), tokens, None, False))
    cache_graphdef, cache_state = nnx.split(cache)
    logits, cache_state = _step(*nnx.split(model), cache_graphdef, cache_state, tokens)
    nnx.update(cache, cache_state)
    return np.asarray(logits)


@functools.partial(jax.jit, static_argnums=(0, 2), donate_argnums=3)
def _step(graphdef, state, cache_graphdef, cache_state, tokens):
    # one compilation per (B, T) and cache size: the offset p is part of cache_state, a value
    model, cache = nnx.merge(graphdef, state), nnx.merge(cache_graphdef, cache_state)
    logits = model(tokens, cache=cache)
    return logits, nnx.state(cache)


def cache_arrays(cache: KVCache) -> tuple[np.ndarray, np.ndarray]:
    """The filled part of the cache as NumPy: K and V (B, H, length, d_head)."""
    length = int(cache.length[...])
    return np.array(cache.k[...][:, :, :length]), np.array(cache.v[...][:, :, :length])


def generate(
    model: TinyLM, prompt: np.ndarray, max_new_tokens: int, *, greedy: bool = True, temperature: float = 1.0, seed: int = 0, use_cache: bool = True
) -> np.ndarray:
    """prompt int (B, P) -> (B, P + max_new_tokens): the prompt and its continuation, NumPy.

    use_cache=True reads the prompt in one call (prefill), then one new token per call;
    use_cache=False runs the whole prefix again for every token (the reference it must equal;
    it compiles once per prefix length).
    greedy picks the argmax; otherwise a draw from softmax(logits / temperature) with `seed`.
    """
    return sampling.generate(
        model, prompt, max_new_tokens, new_cache, _logits, _logits, greedy=greedy, temperature=temperature, seed=seed, use_cache=use_cache
    )
