"""Broken ports of the conv pair, each the faithful port of convnet_flax.py with the reference's
weights converted by convnet_convert.py, and exactly one porting bug planted: images handed over in
the wrong layout, a weight norm over the wrong axes, a position table built in another order.
examples/zoo/catalog.py lists them with the module where each must be found."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from examples.zoo import convnet_convert, convnet_flax, inputs
from examples.zoo.configs import ConvNetConfig
from examples.zoo.convert import abstract, jax_dtype
from examples.zoo.tables import sinusoids

TINY = ConvNetConfig()


class WholeKernelNormConv(convnet_flax.WeightNormConv):
    __call__ = convnet_flax.WeightNormConv.__call__  # defined here too: nnx.capture records a class's own methods only

    def norm_axes(self) -> tuple[int, ...]:
        """||v|| over the whole kernel (torch's weight_norm with dim=None), not per output channel."""
        return (0, 1, 2, 3)


def _port(dtype: str, swap=None) -> convnet_flax.ConvNet:
    """The faithful port, built abstractly, with `swap(model)` applied to it first."""
    return abstract(lambda: convnet_flax.ConvNet(TINY, dtype=dtype, rngs=nnx.Rngs(0)), swap)


def images_channels_first(dtype: str = "float32"):
    """The faithful port handed torch's NCHW images: at C = H = W they fit an NHWC conv, so nothing
    raises, and every pixel reads the wrong numbers."""
    return convnet_convert.port(_port(dtype)), (inputs.square_images_nchw(TINY),)


def weight_norm_whole_kernel(dtype: str = "float32"):
    """The weight-normed conv normalizing v over the whole kernel instead of per output channel."""

    def swap(model):
        model.conv_wn = WholeKernelNormConv(TINY.channels, TINY.channels, dtype=jax_dtype(dtype), rngs=nnx.Rngs(0))

    return convnet_convert.port(_port(dtype, swap)), (inputs.square_images_nhwc(TINY),)


def interleaved_sinusoid_init(key, shape, dtype):
    """tables.sinusoids with the sines and cosines interleaved (sin, cos, sin, cos, ...), another
    library's layout, where the reference concatenates them."""
    del key
    table = sinusoids(*shape)
    half = shape[1] // 2
    return jnp.asarray(np.stack([table[:, :half], table[:, half:]], axis=-1).reshape(shape), dtype)


def without_table(state, config: ConvNetConfig = TINY):
    """convnet_convert.to_flax without the position table: it is built, not learned, so the port keeps its own."""
    arrays = convnet_convert.to_flax(state, config)
    del arrays["embed_positions.embedding"]
    return arrays


def positions_interleaved(dtype: str = "float32"):
    """The port's position table built interleaved and kept (the converter leaves built tables
    alone): built for real, since the table keeps its initial value."""
    model = convnet_flax.ConvNet(TINY, dtype=dtype, rngs=nnx.Rngs(0))
    dtypes = dict(dtype=jax_dtype(dtype), param_dtype=jax_dtype(dtype))
    model.embed_positions = nnx.Embed(TINY.n_positions, TINY.channels, embedding_init=interleaved_sinusoid_init, **dtypes, rngs=nnx.Rngs(0))
    return convnet_convert.port(model, without_table, complete=False), (inputs.square_images_nhwc(TINY),)
