"""The conv encoder of convnet_torch.py in Flax NNX: a faithful port, module for module and name
for name.

What differs between the two sides, and why it is still the same model:
- Images and feature maps are NHWC, torch's NCHW: at C = H = W one shape, other axes.
- conv_in is nnx.Conv, kernel (kH, kW, in, out), padding 'SAME' (torch's padding=1 at stride 1).
- conv_wn is a hand-written weight-normed conv, WeightNormConv, as the popular library writes
  Wav2Vec2's in Flax: weight_v and weight_g in torch's layouts ((out, in, kH, kW) and
  (out, 1, 1, 1)), kernel = g v / ||v||, the norm over every axis but the output channels',
  transposed into Flax's (kH, kW, in, out) where it is used.
- embed_positions is an nnx.Embed whose initializer is the sinusoidal table (tables.py): a fresh
  port holds the reference's table exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from examples.zoo import inputs
from examples.zoo.configs import ConvNetConfig
from examples.zoo.convert import jax_dtype
from examples.zoo.tables import sinusoids

TINY = ConvNetConfig()


def sinusoid_init(key, shape, dtype):
    """An nnx.Embed initializer that ignores `key`: the table of tables.sinusoids, (positions, channels)."""
    del key
    return jnp.asarray(sinusoids(*shape), dtype)


class WeightNormConv(nnx.Module):
    """(B, H, W, in) -> (B, H, W, out): a 3x3 conv, stride 1, padding 1, whose kernel is g v / ||v||,
    kept as the popular library's Flax Wav2Vec2 keeps its own: weight_v in torch's layout
    (out, in, kH, kW) and weight_g (out, 1, 1, 1), the kernel laid out for Flax at each call."""

    def __init__(self, in_features: int, out_features: int, *, dtype, rngs: nnx.Rngs):
        v = nnx.initializers.lecun_normal(in_axis=(1, 2, 3), out_axis=0)(rngs.params(), (out_features, in_features, 3, 3), dtype)
        self.weight_v = nnx.Param(v)
        self.weight_g = nnx.Param(jnp.sqrt(jnp.sum(v * v, axis=(1, 2, 3), keepdims=True)))  # (out, 1, 1, 1): the kernel starts as v
        self.bias = nnx.Param(jnp.zeros((out_features,), dtype))

    def norm_axes(self) -> tuple[int, ...]:
        """The axes of v that ||v|| sums over: every one but the output channels'."""
        return (1, 2, 3)

    def kernel(self):
        """(kH, kW, in, out): g v / ||v||, from (out, in, kH, kW)."""
        v = self.weight_v[...]
        weight = v * (self.weight_g[...] / jnp.sqrt(jnp.sum(v * v, axis=self.norm_axes(), keepdims=True)))  # (out, in, kH, kW)
        return weight.transpose(2, 3, 1, 0)

    def __call__(self, x):
        y = jax.lax.conv_general_dilated(x, self.kernel(), (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y + self.bias[...]  # (B, H, W, out)


class ConvNet(nnx.Module):
    """images (B, S, S, C) -> logits (B, classes)."""

    def __init__(self, config: ConvNetConfig = TINY, *, dtype: str = "float32", rngs: nnx.Rngs):
        dtype = jax_dtype(dtype)
        C, dtypes = config.channels, dict(dtype=dtype, param_dtype=dtype)
        self.conv_in = nnx.Conv(C, C, (3, 3), padding="SAME", **dtypes, rngs=rngs)
        self.conv_wn = WeightNormConv(C, C, dtype=dtype, rngs=rngs)
        self.embed_positions = nnx.Embed(config.n_positions, C, embedding_init=sinusoid_init, **dtypes, rngs=rngs)
        self.norm = nnx.LayerNorm(C, epsilon=config.layer_norm_eps, **dtypes, rngs=rngs)
        self.head = nnx.Linear(C, config.n_classes, **dtypes, rngs=rngs)

    def __call__(self, images):
        x = jax.nn.relu(self.conv_wn(jax.nn.relu(self.conv_in(images))))  # (B, S, S, C)
        tokens = x.reshape(x.shape[0], -1, x.shape[-1])  # (B, S*S, C): positions in row-major order
        positions = self.embed_positions(jnp.arange(tokens.shape[1]))  # (S*S, C)
        return self.head(self.norm(tokens + positions).mean(axis=1))  # (B, classes)


def fresh(dtype: str = "float32"):
    """A port as built, Flax's initializers (and the sinusoidal table), and the reference's images
    in NHWC: a factory for `mhsa port-check`."""
    return ConvNet(TINY, dtype=dtype, rngs=nnx.Rngs(0)), (inputs.square_images_nhwc(TINY),)
