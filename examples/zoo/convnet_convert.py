"""The converter of the conv pair: the reference's state_dict -> the NNX port's variables ({Flax
path: array}, Flax layout), every array used exactly once and every variable filled; and the
factory of the port with converted weights (what `mhsa port-check` checks by default).

Layouts: conv weights (out, in, kH, kW) -> kernels (kH, kW, in, out), axes (2, 3, 1, 0); the
weight-normed conv's original0 (g, (out, 1, 1, 1)) -> weight_g (out,) and original1 (v) ->
weight_v, laid out as a kernel; the position table's weight -> embedding, as it is; LayerNorm
weight -> scale; Linear weight (out, in) -> kernel (in, out)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flax import nnx

from examples.zoo import convnet_flax, convnet_torch, inputs
from examples.zoo.configs import ConvNetConfig
from examples.zoo.convert import StateDict, abstract, load_nnx
from examples.zoo.torch_weights import numpy_state
from examples.zoo.vit_convert import conv_kernel

TINY = ConvNetConfig()
WEIGHT_NORM = "conv_wn.parametrizations.weight."


def to_flax(state: Mapping[str, np.ndarray], config: ConvNetConfig = TINY) -> dict[str, np.ndarray]:
    """torch state_dict (NumPy) -> {NNX variable path: array in Flax layout}."""
    take = StateDict(state)
    arrays = {"conv_in.kernel": conv_kernel(take("conv_in.weight")), "conv_in.bias": take("conv_in.bias")}
    arrays |= {"conv_wn.weight_g": take(WEIGHT_NORM + "original0"), "conv_wn.weight_v": take(WEIGHT_NORM + "original1")}  # torch's layouts
    arrays |= {"conv_wn.bias": take("conv_wn.bias"), "embed_positions.embedding": take("embed_positions.weight")}
    arrays |= {"norm.scale": take("norm.weight"), "norm.bias": take("norm.bias")}
    arrays |= {"head.kernel": take("head.weight").T, "head.bias": take("head.bias")}  # (out, in) -> (in, out)
    take.finish()
    return arrays


def port(model: convnet_flax.ConvNet, convert=to_flax, *, complete: bool = True) -> convnet_flax.ConvNet:
    """`model` with the reference's weights (convnet_torch.build()) written in by `convert`."""
    return load_nnx(model, convert(numpy_state(convnet_torch.build()), TINY), complete=complete)


def ported(dtype: str = "float32"):
    """The port with converted weights and the reference's images in NHWC: a factory for `mhsa port-check`."""
    return port(abstract(lambda: convnet_flax.ConvNet(TINY, dtype=dtype, rngs=nnx.Rngs(0)))), (inputs.square_images_nhwc(TINY),)
