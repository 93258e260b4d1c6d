"""Broken ports of the convolutional ViT pair, each the faithful port of vit_flax.py with the
reference's weights converted by vit_convert.py, and exactly one classic porting bug planted: a
subclass that overrides one method, a layer built otherwise, or a converter that does one step
wrong. examples/zoo/catalog.py lists them with the module where each must be found."""

from __future__ import annotations

import jax
from flax import nnx

from examples.zoo import inputs, vit_convert, vit_flax
from examples.zoo.configs import ViTConfig
from examples.zoo.convert import abstract, jax_dtype

TINY = ViTConfig()


class QueryAxisAttention(vit_flax.Attention):
    def weights(self, scores):
        """A softmax over the queries (axis -2): every key's column sums to 1 instead of every query's row."""
        return jax.nn.softmax(scores, axis=-2)


def _port(dtype: str, swap=None) -> vit_flax.ConvViT:
    """The faithful port, built abstractly, with `swap(model)` applied to it first."""
    return abstract(lambda: vit_flax.ConvViT(TINY, dtype=dtype, rngs=nnx.Rngs(0)), swap)


def _images():
    return (inputs.images_nhwc(TINY),)


def softmax_wrong_axis(dtype: str = "float32"):
    """Attention weights normalized over the queries instead of the keys."""

    def swap(model):
        for block in model.blocks:
            block.attn = QueryAxisAttention(TINY, dtype=jax_dtype(dtype), rngs=nnx.Rngs(0))

    return vit_convert.port(_port(dtype, swap)), _images()


def reverses_conv_axes(state, config: ViTConfig = TINY):
    """vit_convert.to_flax, except that the stem conv's weight has its four axes reversed,
    (out, in, kH, kW) -> (kW, kH, in, out): kH and kW swap, which a 3x3 kernel's shape hides."""
    arrays = vit_convert.to_flax(state, config)
    arrays["stem.conv.kernel"] = state["stem.conv.weight"].transpose(3, 2, 1, 0)
    return arrays


def conv_kernel_transposed(dtype: str = "float32"):
    """The faithful port, converted by a converter that transposes a conv kernel in space."""
    return vit_convert.port(_port(dtype), reverses_conv_axes), _images()


def parameters_only(state, config: ViTConfig = TINY):
    """vit_convert.to_flax of what model.named_parameters() holds: BatchNorm's running statistics,
    buffers and not parameters, are never converted, and the port keeps mean 0 and variance 1."""
    arrays = vit_convert.to_flax(state, config)
    return {name: value for name, value in arrays.items() if name not in ("stem.bn.mean", "stem.bn.var")}


def batchnorm_stats_not_loaded(dtype: str = "float32"):
    """The faithful port, its BatchNorm left at the initial statistics (mean 0, variance 1): built
    for real, since those keep their initial values."""
    return vit_convert.port(vit_flax.ConvViT(TINY, dtype=dtype, rngs=nnx.Rngs(0)), parameters_only, complete=False), _images()


def drops_patch_bias(state, config: ViTConfig = TINY):
    """vit_convert.to_flax for a port without the patch embedding's bias: the bias is dropped."""
    arrays = vit_convert.to_flax(state, config)
    del arrays["patch_embed.bias"]
    return arrays


def missing_bias(dtype: str = "float32"):
    """The patch embedding built with use_bias=False, where the reference's conv has a bias."""
    patch, dtypes = (TINY.patch, TINY.patch), dict(dtype=jax_dtype(dtype), param_dtype=jax_dtype(dtype))

    def swap(model):
        model.patch_embed = nnx.Conv(
            TINY.stem_channels, TINY.d_model, patch, strides=patch, padding="VALID", use_bias=False, **dtypes, rngs=nnx.Rngs(0)
        )

    return vit_convert.port(_port(dtype, swap), drops_patch_bias), _images()


def batchnorm_momentum(dtype: str = "float32"):
    """BatchNorm with torch's momentum 0.1 written into Flax's momentum: 0.1 of the old average where
    torch keeps 0.9. Eval mode never reads it, so the outputs agree: only training (the running
    statistics after a step) and the settings (a lint) show it."""

    def swap(model):
        model.stem.bn.momentum = 0.1  # as nnx.BatchNorm(..., momentum=0.1) builds it

    return vit_convert.port(_port(dtype, swap)), _images()


def same_padding_stride2(dtype: str = "float32"):
    """The stem's stride-2 conv with padding='SAME', read as torch's padding=1: the output shapes
    agree, but on the even-sized feature map 'SAME' pads (0, 1), torch (1, 1), so every output pixel
    looks one pixel further down and right."""

    def swap(model):
        model.stem.down = vit_flax.down_conv(TINY, padding="SAME", dtype=jax_dtype(dtype), rngs=nnx.Rngs(0))

    return vit_convert.port(_port(dtype, swap)), _images()
