"""The convolutional ViT of vit_torch.py in Flax NNX: a faithful port, module for module and name
for name.

What differs between the two sides, and why it is still the same model:
- Images are NHWC (B, H, W, C), torch's NCHW; every conv output is channels-last, and the patches
  come out in the same row-major order.
- Conv kernels are (kH, kW, in, out), torch's (out, in, kH, kW); Linear kernels (in, out).
- The stem's first conv pads 'SAME', torch's padding=1: at stride 1 with a 3x3 kernel both pad one
  pixel on every side. Its stride-2 conv pads 1 explicitly: 'SAME' there would pad (0, 1) on an
  even-sized input, torch (1, 1). The patch embedding pads nothing ('VALID', torch's default 0).
- BatchNorm reads its running statistics (use_running_average=True, torch's eval mode) and keeps
  momentum 0.9, which is torch's 0.1 read the other way; eps 1e-5 in both. nnx.BatchNorm holds
  its statistics in float32 whatever param_dtype (flax 0.12): exact for statistics converted from a
  float32 checkpoint, rounded for a float64 port that trains.
- GELU is jax.nn.gelu(approximate=False), torch's exact nn.GELU; its default is the tanh one.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from examples.zoo import inputs
from examples.zoo.configs import ViTConfig
from examples.zoo.convert import jax_dtype

TINY = ViTConfig()


class Stem(nnx.Module):
    """(B, H, W, C) -> (B, ceil(H / 2), ceil(W / 2), S): a 3x3 conv, BatchNorm, ReLU, a 3x3 conv of stride 2."""

    def __init__(self, config: ViTConfig, *, dtype, rngs: nnx.Rngs):
        self.conv = nnx.Conv(config.in_channels, config.stem_channels, (3, 3), padding="SAME", dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.bn = nnx.BatchNorm(
            config.stem_channels, use_running_average=True, momentum=0.9, epsilon=config.batch_norm_eps, dtype=dtype, param_dtype=dtype, rngs=rngs
        )
        self.down = down_conv(config, padding=1, dtype=dtype, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.relu(self.bn(self.conv(x))))  # (B, ceil(H / 2), ceil(W / 2), S)


def down_conv(config: ViTConfig, *, padding, dtype, rngs: nnx.Rngs) -> nnx.Conv:
    """The stem's 3x3 conv of stride 2: padding 1 is torch's padding=1, on every side."""
    return nnx.Conv(config.stem_channels, config.stem_channels, (3, 3), strides=(2, 2), padding=padding, dtype=dtype, param_dtype=dtype, rngs=rngs)


class Attention(nnx.Module):
    """(B, N, D) -> (B, N, D): multi-head attention over all tokens, one fused projection qkv."""

    def __init__(self, config: ViTConfig, *, dtype, rngs: nnx.Rngs):
        self.n_heads, self.d_head = config.n_heads, config.d_model // config.n_heads
        self.qkv = nnx.Linear(config.d_model, 3 * config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.proj = nnx.Linear(config.d_model, config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)

    def weights(self, scores):
        """(B, H, N, N) -> attention weights: a softmax over the keys, the last axis."""
        return jax.nn.softmax(scores, axis=-1)

    def __call__(self, x):
        B, N, D = x.shape
        q, k, v = jnp.split(self.qkv(x), 3, axis=-1)  # 3 x (B, N, D)
        q, k, v = (t.reshape(B, N, self.n_heads, self.d_head).transpose(0, 2, 1, 3) for t in (q, k, v))  # (B, H, N, d_head)
        scores = q @ k.swapaxes(-2, -1) / jnp.asarray(math.sqrt(self.d_head), x.dtype)  # (B, H, N, N)
        context = self.weights(scores) @ v  # (B, H, N, d_head)
        return self.proj(context.transpose(0, 2, 1, 3).reshape(B, N, D))  # (B, N, D)


class MLP(nnx.Module):
    """(B, N, D) -> (B, N, D): widen, exact GELU, narrow."""

    def __init__(self, config: ViTConfig, *, dtype, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(config.d_model, config.d_mlp, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.fc2 = nnx.Linear(config.d_mlp, config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))  # (B, N, D)


def layer_norm(config: ViTConfig, *, dtype, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(config.d_model, epsilon=config.layer_norm_eps, dtype=dtype, param_dtype=dtype, rngs=rngs)


class Block(nnx.Module):
    """(B, N, D) -> (B, N, D): pre-LayerNorm attention and MLP, each with a residual."""

    def __init__(self, config: ViTConfig, *, dtype, rngs: nnx.Rngs):
        self.norm1 = layer_norm(config, dtype=dtype, rngs=rngs)
        self.attn = Attention(config, dtype=dtype, rngs=rngs)
        self.norm2 = layer_norm(config, dtype=dtype, rngs=rngs)
        self.mlp = MLP(config, dtype=dtype, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.norm1(x))  # (B, N, D)
        return x + self.mlp(self.norm2(x))  # (B, N, D)


class ConvViT(nnx.Module):
    """images (B, H, W, C) -> logits (B, classes)."""

    def __init__(self, config: ViTConfig = TINY, *, dtype: str = "float32", rngs: nnx.Rngs):
        dtype = jax_dtype(dtype)
        patch = (config.patch, config.patch)
        self.stem = Stem(config, dtype=dtype, rngs=rngs)
        self.patch_embed = nnx.Conv(
            config.stem_channels, config.d_model, patch, strides=patch, padding="VALID", dtype=dtype, param_dtype=dtype, rngs=rngs
        )
        self.pos_embed = nnx.Param(0.1 * jax.random.normal(rngs.params(), (1, config.n_patches, config.d_model), dtype))
        self.blocks = nnx.List([Block(config, dtype=dtype, rngs=rngs) for _ in range(config.n_layers)])
        self.norm = layer_norm(config, dtype=dtype, rngs=rngs)
        self.head = nnx.Linear(config.d_model, config.n_classes, dtype=dtype, param_dtype=dtype, rngs=rngs)

    def __call__(self, images):
        x = self.patch_embed(self.stem(images))  # (B, H / (2 patch), W / (2 patch), D)
        x = x.reshape(x.shape[0], -1, x.shape[-1]) + self.pos_embed[...]  # (B, N, D): patches in row-major order
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(axis=1))  # (B, classes)


def fresh(dtype: str = "float32"):
    """A port as built, Flax's initializers, and the reference's images in NHWC: a factory for `mhsa port-check`."""
    return ConvViT(TINY, dtype=dtype, rngs=nnx.Rngs(0)), (inputs.images_nhwc(TINY),)
