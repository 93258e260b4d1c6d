"""The converter of the VAE pair: the reference's state_dict -> the NNX port's variables ({Flax
path: array}, Flax layout), every array used exactly once and every variable filled; and the
factory of the port with converted weights (what `mhsa port-check` checks by default).

Layouts: conv weights (out, in, kH, kW) -> kernels (kH, kW, in, out), axes (2, 3, 1, 0); Linear
weights (out, in) -> kernels (in, out); GroupNorm weight -> scale, bias -> bias (per channel, so
the layouts of the maps they normalize do not enter)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flax import nnx

from examples.zoo import vae_flax, vae_torch
from examples.zoo.convert import StateDict, abstract, load_nnx
from examples.zoo.torch_weights import numpy_state
from examples.zoo.vae_torch import TINY, VAEConfig
from examples.zoo.vit_convert import conv_kernel

LINEARS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out")


def to_flax(state: Mapping[str, np.ndarray], config: VAEConfig = TINY) -> dict[str, np.ndarray]:
    """torch state_dict (NumPy) -> {NNX variable path: array in Flax layout}."""
    take = StateDict(state)
    arrays = {"attn.group_norm.scale": take("attn.group_norm.weight"), "attn.group_norm.bias": take("attn.group_norm.bias")}
    for conv in ("conv_in", "conv_out"):  # (out, in, kH, kW) -> (kH, kW, in, out)
        arrays |= {f"{conv}.kernel": conv_kernel(take(f"{conv}.weight")), f"{conv}.bias": take(f"{conv}.bias")}
    for linear in LINEARS:
        arrays |= {f"{linear}.kernel": take(f"{linear}.weight").T, f"{linear}.bias": take(f"{linear}.bias")}  # (out, in) -> (in, out)
    take.finish()
    return arrays


def port(model: vae_flax.Decoder, convert=to_flax, *, complete: bool = True) -> vae_flax.Decoder:
    """`model` with the reference's weights (vae_torch.build()) written in by `convert`."""
    return load_nnx(model, convert(numpy_state(vae_torch.build()), TINY), complete=complete)


def ported(dtype: str = "float32"):
    """The port with converted weights and the reference's images in NHWC: a factory for `mhsa port-check`."""
    return port(abstract(lambda: vae_flax.Decoder(TINY, dtype=dtype, rngs=nnx.Rngs(0)))), (vae_torch.images_nhwc(TINY),)
