"""The Llama-style decoder of llama_torch.py in Flax NNX: a faithful port, module for module and
name for name, so that every submodule's output has a counterpart.

What differs between the two sides, and why it is still the same model:
- Linear kernels are (in, out), torch's weights (out, in): llama_convert.py transposes them.
- RMSNorm's eps is passed explicitly: Flax's default 1e-6 is not the config's 1e-5.
- The tied output layer is `embed_tokens.attend(h)` (h @ embedding^T), torch's F.linear with the
  embedding: the same single parameter.
- The grouped kv heads are repeated with jnp.repeat (repeat_interleave), never jnp.tile.
- Every layer computes in `dtype`, parameters included (float64 needs jax_enable_x64).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from examples.zoo import inputs
from examples.zoo.configs import LlamaConfig
from examples.zoo.convert import jax_dtype

TINY = LlamaConfig()


def rotate_half(x):
    """(..., d_head) -> (..., d_head): (x1, x2) -> (-x2, x1) over the two halves."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


class Rotary(nnx.Module):
    """(B, heads, T, d_head) -> the same, rotated: at position t, channels i and i + d_head/2
    turn together by the angle t * base^(-2i/d_head)."""

    def __init__(self, d_head: int, base: float):
        self.d_head, self.base = d_head, base

    def __call__(self, x):
        T = x.shape[-2]
        inv_freq = self.base ** (-jnp.arange(0, self.d_head, 2, dtype=x.dtype) / self.d_head)  # (d_head/2,)
        angles = jnp.arange(T, dtype=x.dtype)[:, None] * inv_freq  # (T, d_head/2)
        angles = jnp.concatenate([angles, angles], axis=-1)  # (T, d_head): each half turns by the same angles
        return x * jnp.cos(angles) + rotate_half(x) * jnp.sin(angles)


class Attention(nnx.Module):
    """(B, T, D), keep (B, 1, T, T) -> (B, T, D): causal grouped-query attention with rotary q and k."""

    def __init__(self, config: LlamaConfig, *, dtype, rngs: nnx.Rngs):
        self.n_heads, self.n_kv_heads, self.d_head = config.n_heads, config.n_kv_heads, config.d_head
        linear = dict(use_bias=False, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.q_proj = nnx.Linear(config.d_model, config.n_heads * config.d_head, **linear)
        self.k_proj = nnx.Linear(config.d_model, config.n_kv_heads * config.d_head, **linear)
        self.v_proj = nnx.Linear(config.d_model, config.n_kv_heads * config.d_head, **linear)
        self.o_proj = nnx.Linear(config.n_heads * config.d_head, config.d_model, **linear)
        self.rotary = Rotary(config.d_head, config.rope_base)

    def repeat_kv(self, x):
        """(B, n_kv_heads, T, d_head) -> (B, n_heads, T, d_head): kv head j serves query heads j*g .. j*g + g - 1."""
        return jnp.repeat(x, self.n_heads // self.n_kv_heads, axis=1)

    def __call__(self, x, keep):
        B, T, _ = x.shape
        q = self.q_proj(x).reshape(B, T, self.n_heads, self.d_head).transpose(0, 2, 1, 3)  # (B, H, T, d_head)
        k = self.k_proj(x).reshape(B, T, self.n_kv_heads, self.d_head).transpose(0, 2, 1, 3)  # (B, KV, T, d_head)
        v = self.v_proj(x).reshape(B, T, self.n_kv_heads, self.d_head).transpose(0, 2, 1, 3)  # (B, KV, T, d_head)
        q, k = self.rotary(q), self.rotary(k)
        k, v = self.repeat_kv(k), self.repeat_kv(v)  # (B, H, T, d_head)
        scores = q @ k.swapaxes(-2, -1) / jnp.asarray(math.sqrt(self.d_head), x.dtype)  # (B, H, T, T)
        scores = jnp.where(keep, scores, jnp.finfo(scores.dtype).min)
        context = jax.nn.softmax(scores, axis=-1) @ v  # (B, H, T, d_head)
        return self.o_proj(context.transpose(0, 2, 1, 3).reshape(B, T, self.n_heads * self.d_head))  # (B, T, D)


class MLP(nnx.Module):
    """(B, T, D) -> (B, T, D): SwiGLU, down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig, *, dtype, rngs: nnx.Rngs):
        linear = dict(use_bias=False, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.gate_proj = nnx.Linear(config.d_model, config.d_ff, **linear)
        self.up_proj = nnx.Linear(config.d_model, config.d_ff, **linear)
        self.down_proj = nnx.Linear(config.d_ff, config.d_model, **linear)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))  # (B, T, D)


def rms_norm(config: LlamaConfig, *, dtype, rngs: nnx.Rngs) -> nnx.RMSNorm:
    return nnx.RMSNorm(config.d_model, epsilon=config.rms_norm_eps, dtype=dtype, param_dtype=dtype, rngs=rngs)  # not Flax's 1e-6


class DecoderLayer(nnx.Module):
    """(B, T, D), keep -> (B, T, D): pre-RMSNorm attention and MLP, each with a residual."""

    def __init__(self, config: LlamaConfig, *, dtype, rngs: nnx.Rngs):
        self.input_layernorm = rms_norm(config, dtype=dtype, rngs=rngs)
        self.self_attn = Attention(config, dtype=dtype, rngs=rngs)
        self.post_attention_layernorm = rms_norm(config, dtype=dtype, rngs=rngs)
        self.mlp = MLP(config, dtype=dtype, rngs=rngs)

    def __call__(self, x, keep):
        x = x + self.self_attn(self.input_layernorm(x), keep)  # (B, T, D)
        return x + self.mlp(self.post_attention_layernorm(x))  # (B, T, D)


class Llama(nnx.Module):
    """input_ids (B, T), attention_mask (B, T) or None -> logits (B, T, V)."""

    def __init__(self, config: LlamaConfig = TINY, *, dtype: str = "float32", rngs: nnx.Rngs):
        dtype = jax_dtype(dtype)
        self.embed_tokens = nnx.Embed(config.vocab_size, config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(config, dtype=dtype, rngs=rngs) for _ in range(config.n_layers)])
        self.norm = rms_norm(config, dtype=dtype, rngs=rngs)

    def attention_keep(self, attention_mask, T):
        """(B, T) 1 = token, 0 = padding, or None -> (B, 1, T, T) bool, True = may attend."""
        causal = jnp.tril(jnp.ones((T, T), dtype=bool))  # (T, T)
        if attention_mask is None:
            return causal[None, None]
        return causal[None, None] & attention_mask[:, None, None, :].astype(bool)

    def unembed(self, h):
        """(B, T, D) -> (B, T, V): the tied output layer."""
        return self.embed_tokens.attend(h)

    def __call__(self, input_ids, attention_mask=None):
        h = self.embed_tokens(input_ids)  # (B, T, D)
        keep = self.attention_keep(attention_mask, input_ids.shape[1])
        for layer in self.layers:
            h = layer(h, keep)
        return self.unembed(self.norm(h))  # (B, T, V)


def fresh(dtype: str = "float32"):
    """A port as built, Flax's initializers, no converted weights, and the reference's inputs: a
    factory for `mhsa port-check`."""
    return Llama(TINY, dtype=dtype, rngs=nnx.Rngs(0)), inputs.llama(TINY)


def fresh_keywords(dtype: str = "float32"):
    """`fresh` with {"input_ids", "attention_mask"} as keyword inputs."""
    return Llama(TINY, dtype=dtype, rngs=nnx.Rngs(0)), inputs.llama_keywords(TINY)
