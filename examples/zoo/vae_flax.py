"""The VAE-decoder-like block of vae_torch.py in Flax NNX, its attention written as the popular
diffusion library's Flax twin writes it: a faithful port, module for module and name for name
(attn.group_norm, attn.to_q, ...), on channels-last maps.

What differs between the two sides, and why it is still the same model:
- Images and feature maps are NHWC (B, H, W, C), torch's NCHW.
- attn.group_norm normalizes the map (B, H, W, C) itself, where torch's sees (B, C, H*W): both
  take each group's channels over every position (nnx.GroupNorm reduces over every axis but the
  batch's, the channel axis split into groups), and the map is flattened to (B, H*W, C) after it.
- GroupNorm's eps is passed explicitly (the block's 1e-6, which is also Flax's default; torch's is
  1e-5), and so are its groups: nnx.GroupNorm's default num_groups is 32.
- Positions flattened row-major, p = h*W + w: what torch's view of the NCHW map gives.
- Conv kernels are (kH, kW, in, out), torch's (out, in, kH, kW); Linear kernels (in, out). The
  convs pad 1 on every side ('SAME' at stride 1 with a 3x3 kernel).
- Every layer computes in `dtype`, parameters included (float64 needs jax_enable_x64).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from examples.zoo.convert import jax_dtype
from examples.zoo.vae_torch import TINY, VAEConfig, images_nhwc


class AttentionBlock(nnx.Module):
    """(B, H, W, C) -> (B, H, W, C): GroupNorm, attention over the H*W positions, a residual."""

    def __init__(self, config: VAEConfig, *, dtype, rngs: nnx.Rngs):
        C = config.channels
        self.n_heads, self.d_head = config.n_heads, config.d_head
        dtypes = dict(dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.group_norm = nnx.GroupNorm(C, num_groups=config.groups, epsilon=config.group_norm_eps, **dtypes)
        self.to_q, self.to_k, self.to_v = nnx.Linear(C, C, **dtypes), nnx.Linear(C, C, **dtypes), nnx.Linear(C, C, **dtypes)
        self.to_out = nnx.Linear(C, C, **dtypes)

    def flatten(self, x):
        """(B, H, W, C) -> (B, H*W, C): position p = h*W + w, row-major, as torch's view of (B, C, H, W)."""
        B, H, W, C = x.shape
        return x.reshape(B, H * W, C)

    def heads(self, x):
        """(B, N, C) -> (B, heads, N, d_head)."""
        B, N, _ = x.shape
        return x.reshape(B, N, self.n_heads, self.d_head).transpose(0, 2, 1, 3)

    def attend(self, h):
        """(B, H*W, C) normalized -> (B, H*W, C): the heads' context, before to_out."""
        B, N, C = h.shape
        q, k, v = self.heads(self.to_q(h)), self.heads(self.to_k(h)), self.heads(self.to_v(h))  # (B, heads, H*W, d_head)
        scores = (q @ k.swapaxes(-2, -1)) / jnp.asarray(math.sqrt(self.d_head), h.dtype)  # (B, heads, H*W, H*W)
        context = jax.nn.softmax(scores, axis=-1) @ v  # (B, heads, H*W, d_head)
        return context.transpose(0, 2, 1, 3).reshape(B, N, C)  # (B, H*W, C)

    def __call__(self, x):
        out = self.to_out(self.attend(self.flatten(self.group_norm(x))))  # (B, H*W, C)
        return x + out.reshape(x.shape)  # (B, H, W, C): row-major, flatten's inverse


class Decoder(nnx.Module):
    """images (B, H, W, C_in) -> (B, H, W, C_out)."""

    def __init__(self, config: VAEConfig = TINY, *, dtype: str = "float32", rngs: nnx.Rngs):
        dtype = jax_dtype(dtype)
        self.conv_in = nnx.Conv(config.in_channels, config.channels, (3, 3), padding=1, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.attn = AttentionBlock(config, dtype=dtype, rngs=rngs)
        self.conv_out = nnx.Conv(config.channels, config.out_channels, (3, 3), padding=1, dtype=dtype, param_dtype=dtype, rngs=rngs)

    def __call__(self, images):
        return self.conv_out(jax.nn.silu(self.attn(self.conv_in(images))))  # (B, H, W, C_out)


def fresh(dtype: str = "float32"):
    """A port as built, Flax's initializers, and the reference's images in NHWC: a factory for `mhsa port-check`."""
    return Decoder(TINY, dtype=dtype, rngs=nnx.Rngs(0)), (images_nhwc(TINY),)
