"""Broken ports of the Llama pair, each the faithful port of llama_flax.py with the reference's
weights written in by llama_convert.py, and exactly one classic porting bug planted: a subclass
that overrides one method, a layer built with Flax's default, or a converter that forgets one step.
examples/zoo/catalog.py lists them with the module where each must be found."""

from __future__ import annotations

import dataclasses
import inspect

import jax.numpy as jnp
from flax import nnx

from examples.zoo import inputs, llama_convert, llama_flax
from examples.zoo.configs import LlamaConfig
from examples.zoo.convert import abstract, jax_dtype

TINY = LlamaConfig()
FLAX_RMS_EPS = inspect.signature(nnx.RMSNorm.__init__).parameters["epsilon"].default  # 1e-6 in flax 0.12


class InterleavedRotary(llama_flax.Rotary):
    """Meta's original convention: channels 2i and 2i + 1 turn together (the reference turns i with i + d_head/2)."""

    def __call__(self, x):
        T = x.shape[-2]
        inv_freq = self.base ** (-jnp.arange(0, self.d_head, 2, dtype=x.dtype) / self.d_head)  # (d_head/2,)
        angles = jnp.repeat(jnp.arange(T, dtype=x.dtype)[:, None] * inv_freq, 2, axis=-1)  # (T, d_head): one angle per pair
        pairs = x.reshape(*x.shape[:-1], -1, 2)  # (..., d_head/2, 2)
        rotated = jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)
        return x * jnp.cos(angles) + rotated * jnp.sin(angles)


class TiledAttention(llama_flax.Attention):
    def repeat_kv(self, x):
        """jnp.tile: kv head j serves query heads j, j + n_kv_heads, ... (the reference: j*g .. j*g + g - 1)."""
        return jnp.tile(x, (1, self.n_heads // self.n_kv_heads, 1, 1))


class MaskedIsTrueLlama(llama_flax.Llama):
    def attention_keep(self, attention_mask, T):
        """Reads attention_mask as True = masked: every real token is hidden and the padding is seen."""
        causal = jnp.tril(jnp.ones((T, T), dtype=bool))  # (T, T)
        return causal[None, None] & ~attention_mask[:, None, None, :].astype(bool)


class UntiedLlama(llama_flax.Llama):
    """An output layer of its own, lm_head, where the reference reuses the embedding: the converter
    has nothing to fill it with, so it keeps Flax's initialization."""

    def __init__(self, config: LlamaConfig = TINY, *, dtype: str = "float32", rngs: nnx.Rngs):
        super().__init__(config, dtype=dtype, rngs=rngs)
        self.lm_head = nnx.Linear(config.d_model, config.vocab_size, use_bias=False, dtype=jax_dtype(dtype), param_dtype=jax_dtype(dtype), rngs=rngs)

    def unembed(self, h):
        return self.lm_head(h)


def _port(dtype: str, config: LlamaConfig = TINY, swap=None) -> llama_flax.Llama:
    """The faithful port, built abstractly, with `swap(model)` applied to it first."""
    return abstract(lambda: llama_flax.Llama(config, dtype=dtype, rngs=nnx.Rngs(0)), swap)


def rope_interleaved(dtype: str = "float32"):
    """Rotary embeddings over adjacent pairs, with the reference's (half-split) weights unpermuted."""

    def swap(model):
        for layer in model.layers:
            layer.self_attn.rotary = InterleavedRotary(TINY.d_head, TINY.rope_base)

    return llama_convert.port(_port(dtype, swap=swap)), inputs.llama(TINY)


def gqa_head_order(dtype: str = "float32"):
    """The kv heads repeated with jnp.tile instead of jnp.repeat."""

    def swap(model):
        for layer in model.layers:
            layer.self_attn = TiledAttention(TINY, dtype=jax_dtype(dtype), rngs=nnx.Rngs(0))

    return llama_convert.port(_port(dtype, swap=swap)), inputs.llama(TINY)


def mask_polarity(dtype: str = "float32"):
    """attention_mask read as True = masked; shows only on a batch with padding (the example's)."""
    return llama_convert.port(abstract(lambda: MaskedIsTrueLlama(TINY, dtype=dtype, rngs=nnx.Rngs(0)))), inputs.llama(TINY)


def rmsnorm_eps(dtype: str = "float32"):
    """Every RMSNorm built as nnx.RMSNorm(d) builds it: Flax's default epsilon, not the config's 1e-5."""
    return llama_convert.port(_port(dtype, dataclasses.replace(TINY, rms_norm_eps=FLAX_RMS_EPS))), inputs.llama(TINY)


def forgets_square_transpose(state, config: LlamaConfig = TINY):
    """llama_convert.to_flax, except that q_proj's weight is copied untransposed: (24, 24), so it fits."""
    arrays = llama_convert.to_flax(state, config)
    for i in range(config.n_layers):
        arrays[f"layers.{i}.self_attn.q_proj.kernel"] = state[f"layers.{i}.self_attn.q_proj.weight"]
    return arrays


def transposed_square_kernel(dtype: str = "float32"):
    """The faithful port, converted by a converter that forgets the transpose of a square kernel."""
    return llama_convert.port(_port(dtype), forgets_square_transpose), inputs.llama(TINY)


def untied_embeddings(dtype: str = "float32"):
    """An untied output layer, left at Flax's initialization (the converter fills what it knows):
    built for real, since one of its variables keeps its initial value."""
    return llama_convert.port(UntiedLlama(TINY, dtype=dtype, rngs=nnx.Rngs(0)), complete=False), inputs.llama(TINY)
