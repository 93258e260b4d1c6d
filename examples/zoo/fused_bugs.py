"""Broken ports of the fused-attention pair, each the faithful port of fused_flax.py with the
reference's weights converted by fused_convert.py, and exactly one classic porting bug planted: a
converter that lays the head-shaped kernels out one step wrong (every one of them still fits the
kernel's shape, so `load_nnx`'s shape check passes), or an attention that scales or masks its
scores otherwise. examples/zoo/catalog.py lists them with the module where each must be found."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from examples.zoo import fused_convert, fused_flax
from examples.zoo.convert import abstract, jax_dtype
from examples.zoo.fused_torch import TINY, FusedConfig, example_inputs


class OverDAttention(fused_flax.CausalSelfAttention):
    """Scores scaled by 1/d_head instead of 1/sqrt(d_head)."""

    def __init__(self, config: FusedConfig, *, dtype, rngs: nnx.Rngs):
        super().__init__(config, dtype=dtype, rngs=rngs)
        self.scale = 1.0 / config.d_head


class UnmaskedAttention(fused_flax.CausalSelfAttention):
    def keep(self, T: int):
        """(T, T) all True: every query sees every key, the later ones too (the reference's mask is causal)."""
        return jnp.ones((T, T), dtype=bool)


def _port(dtype: str, swap=None) -> fused_flax.Decoder:
    """The faithful port, built abstractly, with `swap(model)` applied to it first."""
    return abstract(lambda: fused_flax.Decoder(TINY, dtype=dtype, rngs=nnx.Rngs(0)), swap)


def per_head_qkv(state, config: FusedConfig = TINY):
    """fused_convert.to_flax, except that the fused weight is read in GPT-NeoX's layout, q, k and v
    interleaved per head: the output axis reshaped as (H, 3, d_head) and then transposed to
    (3, H, d_head). The reference's is (3, H, d_head) already, so q, k, v and the heads trade rows."""
    arrays = fused_convert.to_flax(state, config)
    D, H, d_head = config.d_model, config.n_heads, config.d_head
    for i in range(config.n_layers):
        weight, bias = state[f"blocks.{i}.attn.qkv.weight"], state[f"blocks.{i}.attn.qkv.bias"]
        arrays[f"blocks.{i}.attn.qkv.kernel"] = weight.T.reshape(D, H, 3, d_head).transpose(0, 2, 1, 3)  # (D, 3, H, d_head)
        arrays[f"blocks.{i}.attn.qkv.bias"] = bias.reshape(H, 3, d_head).transpose(1, 0, 2)  # (3, H, d_head)
    return arrays


def qkv_heads_interleaved(dtype: str = "float32"):
    """The faithful port, its fused kernel converted as if the checkpoint interleaved q, k, v per head."""
    return fused_convert.port(_port(dtype), per_head_qkv), example_inputs(TINY)


def reshapes_before_transposing(state, config: FusedConfig = TINY):
    """fused_convert.to_flax, except that the fused weight (3D, D) is reshaped straight into
    (D, 3, H, d_head) with no transpose: as many numbers, so it fits, but row r of the kernel is
    no longer input feature r."""
    arrays = fused_convert.to_flax(state, config)
    for i in range(config.n_layers):
        weight = state[f"blocks.{i}.attn.qkv.weight"]
        arrays[f"blocks.{i}.attn.qkv.kernel"] = weight.reshape(config.d_model, 3, config.n_heads, config.d_head)  # (D, 3, H, d_head)
    return arrays


def qkv_untransposed(dtype: str = "float32"):
    """The faithful port, its fused kernel reshaped without the transpose."""
    return fused_convert.port(_port(dtype), reshapes_before_transposing), example_inputs(TINY)


def heads_minor_proj(state, config: FusedConfig = TINY):
    """fused_convert.to_flax, except that proj's input axis is split as (d_head, H), heads minor,
    and then transposed to (H, d_head, D): the kernel's shape, but torch's context is flattened
    heads major, so each head's rows go to the wrong head and channel."""
    arrays = fused_convert.to_flax(state, config)
    for i in range(config.n_layers):
        weight = state[f"blocks.{i}.attn.proj.weight"]
        arrays[f"blocks.{i}.attn.proj.kernel"] = weight.T.reshape(config.d_head, config.n_heads, config.d_model).transpose(1, 0, 2)  # (H, d_head, D)
    return arrays


def proj_head_axes_swapped(dtype: str = "float32"):
    """The faithful port, its output projection's head axes laid out in the wrong order."""
    return fused_convert.port(_port(dtype), heads_minor_proj), example_inputs(TINY)


def _swap_attention(cls, dtype: str):
    def swap(model):
        for block in model.blocks:
            block.attn = cls(TINY, dtype=jax_dtype(dtype), rngs=nnx.Rngs(0))

    return swap


def scores_over_d_head(dtype: str = "float32"):
    """Attention scores scaled by 1/d_head, not 1/sqrt(d_head)."""
    return fused_convert.port(_port(dtype, _swap_attention(OverDAttention, dtype))), example_inputs(TINY)


def causal_mask_off(dtype: str = "float32"):
    """Attention without the causal mask: every position sees the ones after it."""
    return fused_convert.port(_port(dtype, _swap_attention(UnmaskedAttention, dtype))), example_inputs(TINY)
