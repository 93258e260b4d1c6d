"""The converter of the convolutional ViT pair: the reference's state_dict -> the NNX port's
variables ({Flax path: array}, Flax layout), every array used exactly once (BatchNorm's
num_batches_tracked counter, which eval mode never reads, excepted) and every variable filled; and
the factory of the port with converted weights (what `mhsa port-check` checks by default).

Layouts: conv weights (out, in, kH, kW) -> kernels (kH, kW, in, out), axes (2, 3, 1, 0); Linear
weights (out, in) -> kernels (in, out); LayerNorm and BatchNorm weight -> scale; BatchNorm
running_mean / running_var -> mean / var (batch statistics, not parameters, in Flax); pos_embed as
it is."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flax import nnx

from examples.zoo import inputs, vit_flax, vit_torch
from examples.zoo.configs import ViTConfig
from examples.zoo.convert import StateDict, abstract, load_nnx
from examples.zoo.torch_weights import numpy_state

TINY = ViTConfig()
COUNTERS = ("stem.bn.num_batches_tracked",)


def conv_kernel(weight: np.ndarray) -> np.ndarray:
    """(out, in, kH, kW) -> (kH, kW, in, out)."""
    return weight.transpose(2, 3, 1, 0)


def to_flax(state: Mapping[str, np.ndarray], config: ViTConfig = TINY) -> dict[str, np.ndarray]:
    """torch state_dict (NumPy) -> {NNX variable path: array in Flax layout}."""
    take = StateDict(state)
    arrays = {"pos_embed": take("pos_embed")}
    for conv in ("stem.conv", "stem.down", "patch_embed"):
        arrays |= {f"{conv}.kernel": conv_kernel(take(f"{conv}.weight")), f"{conv}.bias": take(f"{conv}.bias")}
    for flax, torch in (("scale", "weight"), ("bias", "bias"), ("mean", "running_mean"), ("var", "running_var")):
        arrays[f"stem.bn.{flax}"] = take(f"stem.bn.{torch}")
    linears = [f"blocks.{i}.{name}" for i in range(config.n_layers) for name in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")]
    for linear in [*linears, "head"]:
        arrays |= {f"{linear}.kernel": take(f"{linear}.weight").T, f"{linear}.bias": take(f"{linear}.bias")}  # (out, in) -> (in, out)
    norms = [f"blocks.{i}.{name}" for i in range(config.n_layers) for name in ("norm1", "norm2")]
    for norm in [*norms, "norm"]:
        arrays |= {f"{norm}.scale": take(f"{norm}.weight"), f"{norm}.bias": take(f"{norm}.bias")}
    take.finish(unused=COUNTERS)
    return arrays


def port(model: vit_flax.ConvViT, convert=to_flax, *, complete: bool = True) -> vit_flax.ConvViT:
    """`model` with the reference's weights (vit_torch.build()) written in by `convert`."""
    return load_nnx(model, convert(numpy_state(vit_torch.build()), TINY), complete=complete)


def ported(dtype: str = "float32"):
    """The port with converted weights and the reference's images in NHWC: a factory for `mhsa port-check`."""
    return port(abstract(lambda: vit_flax.ConvViT(TINY, dtype=dtype, rngs=nnx.Rngs(0)))), (inputs.images_nhwc(TINY),)
