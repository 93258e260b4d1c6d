"""Broken ports of the VAE pair, each the faithful port of vae_flax.py with the reference's weights
converted by vae_convert.py, and exactly one classic porting bug planted: a GroupNorm built with
another framework's default, an attention block that flattens or adds otherwise (a subclass that
overrides one method), or a converter that does one step wrong. examples/zoo/catalog.py lists
them with the module where each must be found."""

from __future__ import annotations

import dataclasses
import inspect

from flax import nnx
from torch import nn

from examples.zoo import vae_convert, vae_flax
from examples.zoo.convert import abstract, jax_dtype
from examples.zoo.vae_torch import TINY, VAEConfig, images_nhwc

TORCH_GROUP_NORM_EPS = inspect.signature(nn.GroupNorm.__init__).parameters["eps"].default  # 1e-5 in torch 2.x


class WidthMajorAttention(vae_flax.AttentionBlock):
    def flatten(self, x):
        """(B, H, W, C) -> (B, W*H, C), W before H: position p = w*H + h, where the reference (and the
        unflattening reshape after to_out) has h*W + w."""
        B, H, W, C = x.shape
        return x.transpose(0, 2, 1, 3).reshape(B, W * H, C)  # (B, W*H, C)


class EarlyResidualAttention(vae_flax.AttentionBlock):
    def __call__(self, x):
        """The residual added to the context before to_out, not to to_out's output: to_out(context + x)."""
        out = self.to_out(self.attend(self.flatten(self.group_norm(x))) + self.flatten(x))  # (B, H*W, C)
        return out.reshape(x.shape)  # (B, H, W, C)


def _port(dtype: str, config: VAEConfig = TINY, swap=None) -> vae_flax.Decoder:
    """The faithful port, built abstractly, with `swap(model)` applied to it first."""
    return abstract(lambda: vae_flax.Decoder(config, dtype=dtype, rngs=nnx.Rngs(0)), swap)


def _images():
    return (images_nhwc(TINY),)


def _swap_attention(cls, dtype: str):
    def swap(model):
        model.attn = cls(TINY, dtype=jax_dtype(dtype), rngs=nnx.Rngs(0))

    return swap


def group_norm_eps(dtype: str = "float32"):
    """The GroupNorm at torch's default eps 1e-5 (nn.GroupNorm(groups, C) read off for the port),
    where the reference's VAE block sets 1e-6."""
    return vae_convert.port(_port(dtype, dataclasses.replace(TINY, group_norm_eps=TORCH_GROUP_NORM_EPS))), _images()


def positions_width_major(dtype: str = "float32"):
    """The map flattened W before H for attention and unflattened row-major: every pixel gets
    another pixel's attention output (attention alone would not mind a consistent permutation)."""
    return vae_convert.port(_port(dtype, swap=_swap_attention(WidthMajorAttention, dtype))), _images()


def residual_before_out(dtype: str = "float32"):
    """The residual added before the output projection, to_out(context + x), not x + to_out(context)."""
    return vae_convert.port(_port(dtype, swap=_swap_attention(EarlyResidualAttention, dtype))), _images()


def reshapes_conv_out(state, config: VAEConfig = TINY):
    """vae_convert.to_flax, except that conv_out's weight (out, in, kH, kW) is reshaped, not
    transposed, to (kH, kW, in, out): as many numbers, so it fits, each in the wrong place."""
    arrays = vae_convert.to_flax(state, config)
    arrays["conv_out.kernel"] = state["conv_out.weight"].reshape(3, 3, config.channels, config.out_channels)  # (kH, kW, in, out) in shape only
    return arrays


def conv_kernel_reshaped(dtype: str = "float32"):
    """The faithful port, converted by a converter that reshapes a conv kernel instead of transposing it."""
    return vae_convert.port(_port(dtype), reshapes_conv_out), _images()
