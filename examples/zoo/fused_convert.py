"""The converter of the fused-attention pair, written as a porter writes one: the reference's
state_dict -> the NNX port's variables ({Flax path: array}, Flax layout), every array of the
state_dict used exactly once and every variable of the port filled; and the factory of the port
with converted weights (what `mhsa port-check` checks by default).

Layouts: the fused qkv weight (3D, D) (out, in) -> kernel (D, 3, H, d_head): transposed to (D, 3D),
then its output axis reshaped row-major into (3, H, d_head), the split torch's view makes; its
bias (3D,) -> (3, H, d_head). proj's weight (D, D) (out, in) -> kernel (H, d_head, D): transposed
to (in, out), then its input axis reshaped into (H, d_head), heads major, as torch flattens the
context. Every other Linear weight (out, in) -> kernel (in, out); LayerNorm weight -> scale."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flax import nnx

from examples.zoo import fused_flax, fused_torch
from examples.zoo.convert import StateDict, abstract, load_nnx
from examples.zoo.fused_torch import TINY, FusedConfig
from examples.zoo.torch_weights import numpy_state


def qkv_kernel(weight: np.ndarray, config: FusedConfig) -> np.ndarray:
    """(3D, D) -> (D, 3, H, d_head): transpose first, then split the output axis."""
    return weight.T.reshape(config.d_model, 3, config.n_heads, config.d_head)


def qkv_bias(bias: np.ndarray, config: FusedConfig) -> np.ndarray:
    """(3D,) -> (3, H, d_head)."""
    return bias.reshape(3, config.n_heads, config.d_head)


def proj_kernel(weight: np.ndarray, config: FusedConfig) -> np.ndarray:
    """(D, D) (out, in) -> (H, d_head, D): transpose first, then split the input axis, heads major."""
    return weight.T.reshape(config.n_heads, config.d_head, config.d_model)


def moves(config: FusedConfig = TINY) -> dict[str, tuple[str, bool]]:
    """{torch name: (NNX variable path, transposed)} for every array to_flax moves whole, renamed or
    transposed only: each LayerNorm's weight -> scale and its bias, each MLP Linear's weight
    (out, in) -> kernel (in, out) and its bias, proj's bias. The rest, attn.qkv's two arrays and
    attn.proj's weight, are reshaped besides (qkv_kernel, qkv_bias, proj_kernel)."""
    table = {"ln_f.weight": ("ln_f.scale", False), "ln_f.bias": ("ln_f.bias", False)}
    for i in range(config.n_layers):
        block = f"blocks.{i}."
        table[f"{block}attn.proj.bias"] = (f"{block}attn.proj.bias", False)
        for linear in ("mlp.fc", "mlp.proj"):
            table |= {f"{block}{linear}.weight": (f"{block}{linear}.kernel", True), f"{block}{linear}.bias": (f"{block}{linear}.bias", False)}
        for norm in ("ln_1", "ln_2"):
            table |= {f"{block}{norm}.weight": (f"{block}{norm}.scale", False), f"{block}{norm}.bias": (f"{block}{norm}.bias", False)}
    return table


def to_flax(state: Mapping[str, np.ndarray], config: FusedConfig = TINY) -> dict[str, np.ndarray]:
    """torch state_dict (NumPy) -> {NNX variable path: array in Flax layout}."""
    take = StateDict(state)
    arrays = {name: take(source).T if transposed else take(source) for source, (name, transposed) in moves(config).items()}
    for i in range(config.n_layers):
        block = f"blocks.{i}."
        arrays[f"{block}attn.qkv.kernel"] = qkv_kernel(take(f"{block}attn.qkv.weight"), config)
        arrays[f"{block}attn.qkv.bias"] = qkv_bias(take(f"{block}attn.qkv.bias"), config)
        arrays[f"{block}attn.proj.kernel"] = proj_kernel(take(f"{block}attn.proj.weight"), config)
    take.finish()
    return arrays


def port(model: fused_flax.Decoder, convert=to_flax, *, complete: bool = True) -> fused_flax.Decoder:
    """`model` with the reference's weights (fused_torch.build()) written in by `convert`."""
    return load_nnx(model, convert(numpy_state(fused_torch.build()), TINY), complete=complete)


def ported(dtype: str = "float32"):
    """The port with converted weights and the reference's batch: a factory for `mhsa port-check`."""
    return port(abstract(lambda: fused_flax.Decoder(TINY, dtype=dtype, rngs=nnx.Rngs(0)))), fused_torch.example_inputs(TINY)
