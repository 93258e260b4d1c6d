"""The converters of the head-shaped pair, written as a porter writes them: the reference's
state_dict (heads_torch.py) -> the NNX port's variables (heads_flax.py) or the Equinox port's
arrays (heads_equinox.py), each {variable path: array}, every array of the state_dict used exactly
once and every variable of the port filled; their inverses (a port's arrays, or its gradients, back
under the reference's names and layouts); and the factories of the ports with converted weights
(the user who ran their converter, which is what `mhsa port-check` checks by default).

Layouts, per block (D = H * d_head; torch's rows of q, k and v are head-major):
- attn.in_proj_weight (3D, D) -> three (D, D) row blocks q, k, v, in that order;
  NNX: each transposed to (in, out) and its output axis split, kernel (D, H, d_head); Equinox:
  each as it is, query_proj / key_proj / value_proj.weight (out, in).
- attn.in_proj_bias (3D,) -> three (D,); NNX: each (H, d_head); Equinox: as it is.
- attn.out_proj.weight (D, D) -> NNX: transposed, input axis split, out.kernel (H, d_head, D);
  Equinox: output_proj.weight as it is. Its bias unchanged.
- LayerNorm weight -> scale (NNX) / weight (Equinox); Linear weight (out, in) -> kernel (in, out)
  (NNX) / weight as it is (Equinox).

The Equinox port is built abstractly (eqx.filter_eval_shape: shapes only, no initializer runs) and
filled by load_equinox, every name and shape checked first, as convert.load_nnx fills an NNX port."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import numpy as np
from flax import nnx

from examples.zoo import heads_equinox, heads_flax, heads_torch
from examples.zoo.convert import StateDict, abstract, load_nnx
from examples.zoo.convert_equinox import E, abstract_equinox, load_equinox
from examples.zoo.heads_torch import TINY, HeadsConfig, example_inputs
from examples.zoo.torch_weights import numpy_state

PROJECTIONS = ("query", "key", "value")  # in_proj's row blocks, in torch's order
NORMS = ("ln_1", "ln_2")
LINEARS = ("mlp.fc", "mlp.proj")
EQUINOX_LINEARS = {"attn.out_proj": "attn.output_proj", "mlp.fc": "mlp.fc", "mlp.proj": "mlp.proj"}  # torch's name: Equinox's, layouts alike


def _norms(config: HeadsConfig) -> list[str]:
    return [f"blocks.{i}.{norm}" for i in range(config.n_layers) for norm in NORMS] + ["ln_f"]


def _nnx_moves(config: HeadsConfig) -> dict[str, tuple[str, bool]]:
    """{torch name: (NNX variable path, transposed)} for every array to_flax moves whole: each
    LayerNorm's weight -> scale and its bias, each MLP Linear's weight (out, in) -> kernel (in, out)
    and its bias, out_proj's bias."""
    moves = {}
    for norm in _norms(config):
        moves |= {f"{norm}.weight": (f"{norm}.scale", False), f"{norm}.bias": (f"{norm}.bias", False)}
    for i in range(config.n_layers):
        block = f"blocks.{i}."
        moves[f"{block}attn.out_proj.bias"] = (f"{block}attn.out.bias", False)
        for linear in LINEARS:
            moves |= {f"{block}{linear}.weight": (f"{block}{linear}.kernel", True), f"{block}{linear}.bias": (f"{block}{linear}.bias", False)}
    return moves


def _equinox_moves(config: HeadsConfig) -> dict[str, tuple[str, bool]]:
    """{torch name: (Equinox array path, transposed)} for every array to_equinox moves whole: all but
    in_proj's, renamed only (Equinox keeps torch's layouts)."""
    moves = {f"{norm}.{leaf}": (f"{norm}.{leaf}", False) for norm in _norms(config) for leaf in ("weight", "bias")}
    for i in range(config.n_layers):
        block = f"blocks.{i}."
        for name, eqx_name in EQUINOX_LINEARS.items():
            moves |= {f"{block}{name}.{leaf}": (f"{block}{eqx_name}.{leaf}", False) for leaf in ("weight", "bias")}
    return moves


def _convert(
    arrays: Mapping[str, np.ndarray],
    config: HeadsConfig,
    moves: Mapping[str, tuple[str, bool]],
    attention: Callable[[StateDict, str], dict[str, np.ndarray]],
    *,
    inverse: bool = False,
) -> dict[str, np.ndarray]:
    """The frame of all four converters: every array of `moves` {source name: (target name,
    transposed)} under its new name, transposed where it says (with `inverse`, target -> source: a
    transpose undoes itself), then `attention(take, "blocks.{i}.")`'s arrays for every block, the
    ones `moves` leaves; every array of `arrays` taken exactly once. Returns {name: array}."""
    take = StateDict(arrays)
    if inverse:
        moves = {target: (source, transposed) for source, (target, transposed) in moves.items()}
    converted = {target: take(source).T if transposed else take(source) for source, (target, transposed) in moves.items()}
    for i in range(config.n_layers):
        converted |= attention(take, f"blocks.{i}.")
    take.finish()
    return converted


def _in_proj(take: StateDict, block: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """[(name, weight (D, D) (out, in), bias (D,))] for q, k and v: `block`'s packed in_proj split in
    its three row blocks."""
    weights = np.split(take(f"{block}attn.in_proj_weight"), 3)  # 3 x (D, D)
    biases = np.split(take(f"{block}attn.in_proj_bias"), 3)  # 3 x (D,)
    return list(zip(PROJECTIONS, weights, biases))


def _packed_in_proj(block: str, weights: list[np.ndarray], biases: list[np.ndarray]) -> dict[str, np.ndarray]:
    """q's, k's and v's weights (D, D) (out, in) and biases (D,) -> `block`'s in_proj_weight (3D, D) and in_proj_bias (3D,)."""
    return {f"{block}attn.in_proj_weight": np.concatenate(weights), f"{block}attn.in_proj_bias": np.concatenate(biases)}


def to_flax(state: Mapping[str, np.ndarray], config: HeadsConfig = TINY) -> dict[str, np.ndarray]:
    """torch state_dict (NumPy) -> {NNX variable path: array in Flax layout}."""
    D, H, d_head = config.d_model, config.n_heads, config.d_head

    def attention(take: StateDict, block: str) -> dict[str, np.ndarray]:
        arrays = {f"{block}attn.out.kernel": take(f"{block}attn.out_proj.weight").T.reshape(H, d_head, D)}  # (in, out) -> (H, d_head, D)
        for name, weight, bias in _in_proj(take, block):
            arrays[f"{block}attn.{name}.kernel"] = weight.T.reshape(D, H, d_head)  # (in, out) -> (D, H, d_head)
            arrays[f"{block}attn.{name}.bias"] = bias.reshape(H, d_head)  # (H, d_head)
        return arrays

    return _convert(state, config, _nnx_moves(config), attention)


def from_flax(arrays: Mapping[str, np.ndarray], config: HeadsConfig = TINY) -> dict[str, np.ndarray]:
    """to_flax's inverse: {NNX variable path: array} (weights or their gradients) -> the
    reference's state_dict names and layouts, every array used once."""
    D = config.d_model

    def attention(take: StateDict, block: str) -> dict[str, np.ndarray]:
        kernels = [take(f"{block}attn.{name}.kernel").reshape(D, D).T for name in PROJECTIONS]  # 3 x (out, in)
        state = _packed_in_proj(block, kernels, [take(f"{block}attn.{name}.bias").reshape(D) for name in PROJECTIONS])
        return state | {f"{block}attn.out_proj.weight": take(f"{block}attn.out.kernel").reshape(D, D).T}  # (H, d_head, D) -> (out, in)

    return _convert(arrays, config, _nnx_moves(config), attention, inverse=True)


def to_equinox(state: Mapping[str, np.ndarray], config: HeadsConfig = TINY) -> dict[str, np.ndarray]:
    """torch state_dict (NumPy) -> {Equinox array path "blocks.0.attn.query_proj.weight": array}:
    Equinox keeps torch's (out, in), so the only work is the split of in_proj."""

    def attention(take: StateDict, block: str) -> dict[str, np.ndarray]:
        arrays = {}
        for name, weight, bias in _in_proj(take, block):
            arrays |= {f"{block}attn.{name}_proj.weight": weight, f"{block}attn.{name}_proj.bias": bias}
        return arrays

    return _convert(state, config, _equinox_moves(config), attention)


def from_equinox(arrays: Mapping[str, np.ndarray], config: HeadsConfig = TINY) -> dict[str, np.ndarray]:
    """to_equinox's inverse: {Equinox array path: array} (weights or their gradients) -> the
    reference's state_dict names and layouts, every array used once."""

    def attention(take: StateDict, block: str) -> dict[str, np.ndarray]:
        weights = [take(f"{block}attn.{name}_proj.weight") for name in PROJECTIONS]
        return _packed_in_proj(block, weights, [take(f"{block}attn.{name}_proj.bias") for name in PROJECTIONS])

    return _convert(arrays, config, _equinox_moves(config), attention, inverse=True)


def reference_state() -> dict[str, np.ndarray]:
    """The reference's weights (heads_torch.build()) as NumPy arrays."""
    return numpy_state(heads_torch.build())


def port(model: heads_flax.HeadsStack, convert=to_flax, *, complete: bool = True) -> heads_flax.HeadsStack:
    """`model` with the reference's weights written in by `convert`."""
    return load_nnx(model, convert(reference_state(), TINY), complete=complete)


def port_equinox(model: E, convert=to_equinox) -> E:
    """A copy of the Equinox `model` holding the reference's weights, written in by `convert`."""
    return load_equinox(model, convert(reference_state(), TINY))


def ported(dtype: str = "float32"):
    """The NNX port with converted weights and the reference's inputs: a factory for `mhsa port-check`."""
    return port(abstract(lambda: heads_flax.HeadsStack(TINY, dtype=dtype, rngs=nnx.Rngs(0)))), example_inputs()


def ported_equinox(dtype: str = "float32"):
    """The Equinox port with converted weights and the reference's batch (the port takes one
    example; the caller vmaps it): a factory for `mhsa port-check`."""
    model = abstract_equinox(lambda: heads_equinox.HeadsStack(TINY, dtype=dtype, key=jax.random.key(0)))
    return port_equinox(model), example_inputs()
