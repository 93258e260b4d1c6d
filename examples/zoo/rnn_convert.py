"""The converters of the recurrent pairs, written as a porter writes them: the reference's
state_dict (NumPy) -> the port's variables ({path: array}, the port's layout), every array of the
state_dict used exactly once (convert.StateDict) and every variable of the port filled; and the
factories of the ports with converted weights (what `mhsa port-check` checks by default).

torch packs each layer's gates in rows: weight_ih_l{k} (G*H, in), weight_hh_l{k} (G*H, H),
bias_ih_l{k} and bias_hh_l{k} (G*H,), G = 4 rows of H in the order i, f, g, o for the LSTM, 3 in
the order r, z, n for the GRU. Per port:
- nnx.LSTMCell (rnn_flax): one Linear per gate, kernels (in, H) = torch's gate rows transposed:
  ii, if_, ig, io from weight_ih, hi, hf, hg, ho from weight_hh; the hidden Linears' biases are
  b_ih + b_hh of their gate (the input ones have none).
- nnx.GRUCell (rnn_flax): dense_i.kernel (in, 3H) = weight_ih^T, dense_h.kernel (H, 3H) =
  weight_hh^T, the same r, z, n order; dense_i.bias = (b_ir + b_hr, b_iz + b_hz, b_in). The cell
  has no b_hn: the converter refuses a GRU whose b_hn is not zero.
- eqx.nn.LSTMCell (rnn_equinox): weight_ih, weight_hh as they are; bias = b_ih + b_hh.
- eqx.nn.GRUCell (rnn_equinox): weight_ih, weight_hh as they are; bias = (b_ir + b_hr, b_iz + b_hz,
  b_in), bias_n = b_hn. Bias-free (use_bias=False) ports take the two weights only.
- The head: Linear weight (O, H) -> NNX kernel (H, O), transposed; Equinox's weight as it is.

A port's variables are named as nnx.state lists them ("lstm.layers.0.cell.ii.kernel") or as
jax.tree_util flattens an Equinox model, attribute names and list indices joined by "."
("lstm.layers.0.weight_ih"); load_equinox writes them, every name and shape checked first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import equinox as eqx
import jax
import numpy as np
from flax import nnx
from torch import nn

from examples.zoo import rnn_equinox, rnn_flax, rnn_torch
from examples.zoo.convert import StateDict, abstract, load_nnx
from examples.zoo.convert_equinox import load_equinox
from examples.zoo.rnn_torch import GRU, GRU_NO_BIAS, LSTM, LSTM_NO_BIAS, RNNConfig, sequences
from examples.zoo.torch_weights import numpy_state

# nnx.LSTMCell's Linears for torch's gates, in torch's row order i, f, g, o: (on the input, on the hidden state)
NNX_LSTM_GATES = (("ii", "hi"), ("if_", "hf"), ("ig", "hg"), ("io", "ho"))


def rows(packed: np.ndarray, gates: int) -> list[np.ndarray]:
    """(G*H, ...) -> G arrays (H, ...): torch's packed rows, gate by gate."""
    return np.split(packed, gates, axis=0)


def summed(b_ih: np.ndarray, b_hh: np.ndarray) -> np.ndarray:
    """b_ih + b_hh in float64: a float64 port then holds the exact sum of torch's float32 biases
    (a float32 sum rounds it, about 1e-9 at the output of a float64 check); a float32 port rounds
    it as a float32 sum would."""
    return b_ih.astype(np.float64) + b_hh.astype(np.float64)


def gru_input_bias(b_ih: np.ndarray, b_hh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """torch's GRU biases (3H,) each -> (the bias a JAX GRU cell adds to the input's projection,
    (b_ir + b_hr, b_iz + b_hz, b_in) (3H,), and b_hn (H,), which stays inside the reset gate's product)."""
    r, z, n = rows(b_hh, 3)  # (H,) each
    return summed(b_ih, np.concatenate([r, z, np.zeros_like(n)])), n


def head_to_flax(take: StateDict) -> dict[str, np.ndarray]:
    return {"head.kernel": take("head.weight").T, "head.bias": take("head.bias")}  # (O, H) -> (H, O)


def head_to_equinox(take: StateDict) -> dict[str, np.ndarray]:
    return {"head.weight": take("head.weight"), "head.bias": take("head.bias")}


def _convert(state: Mapping[str, np.ndarray], config: RNNConfig, head: Callable, layer: Callable) -> dict[str, np.ndarray]:
    """The frame of every converter here: torch state_dict (NumPy) -> head(take)'s arrays, then
    layer(take, k)'s for every layer k ({port path: array} each), every array of the state_dict
    taken exactly once."""
    take = StateDict(state)
    arrays = head(take)
    for k in range(config.num_layers):
        arrays |= layer(take, k)
    take.finish()
    return arrays


def lstm_to_flax(state: Mapping[str, np.ndarray], config: RNNConfig = LSTM) -> dict[str, np.ndarray]:
    """torch LSTMTagger state_dict (NumPy) -> {rnn_flax.LSTMTagger variable path: array}."""
    if not config.bias:
        raise ValueError("nnx.LSTMCell always has biases: a bias-free LSTM has no port here whose biases stay zero")

    def layer(take: StateDict, k: int) -> dict[str, np.ndarray]:
        cell, arrays = f"lstm.layers.{k}.cell.", {}
        w_ih, w_hh = rows(take(f"lstm.weight_ih_l{k}"), 4), rows(take(f"lstm.weight_hh_l{k}"), 4)  # 4 x (H, in), 4 x (H, H)
        biases = rows(summed(take(f"lstm.bias_ih_l{k}"), take(f"lstm.bias_hh_l{k}")), 4)  # 4 x (H,): both added outside the gate
        for (on_input, on_hidden), wi, wh, b in zip(NNX_LSTM_GATES, w_ih, w_hh, biases):
            arrays[f"{cell}{on_input}.kernel"] = wi.T  # (H, in) -> (in, H)
            arrays[f"{cell}{on_hidden}.kernel"] = wh.T  # (H, H) -> (H, H): transposed too
            arrays[f"{cell}{on_hidden}.bias"] = b
        return arrays

    return _convert(state, config, head_to_flax, layer)


def gru_to_flax(state: Mapping[str, np.ndarray], config: RNNConfig = GRU) -> dict[str, np.ndarray]:
    """torch GRUTagger state_dict (NumPy), every b_hn zero -> {rnn_flax.GRUTagger variable path: array}."""
    if not config.bias:
        raise ValueError("nnx.GRUCell always has dense_i's bias: a bias-free GRU has no port here whose bias stays zero")

    def layer(take: StateDict, k: int) -> dict[str, np.ndarray]:
        cell = f"gru.layers.{k}.cell."
        bias, b_hn = gru_input_bias(take(f"gru.bias_ih_l{k}"), take(f"gru.bias_hh_l{k}"))  # (3H,), (H,)
        if np.any(b_hn != 0):
            raise ValueError(f"gru.bias_hh_l{k}: nnx.GRUCell has no b_hn (inside the reset gate's product); this GRU's is not zero")
        return {
            f"{cell}dense_i.kernel": take(f"gru.weight_ih_l{k}").T,  # (3H, in) -> (in, 3H), r, z, n as torch's
            f"{cell}dense_h.kernel": take(f"gru.weight_hh_l{k}").T,  # (3H, H) -> (H, 3H)
            f"{cell}dense_i.bias": bias,
        }

    return _convert(state, config, head_to_flax, layer)


def _equinox_layer(config: RNNConfig, biases: Callable[..., dict[str, np.ndarray]]) -> Callable[[StateDict, int], dict[str, np.ndarray]]:
    """_convert's `layer` for either Equinox cell: layer k's two weights as they are (Equinox packs
    the gates as torch does) and, where the config has biases, biases(b_ih (G*H,), b_hh (G*H,)) ->
    {the cell's bias name: array}."""
    rnn = config.cell  # torch's module: "lstm" or "gru"

    def layer(take: StateDict, k: int) -> dict[str, np.ndarray]:
        cell = f"{rnn}.layers.{k}."
        arrays = {f"{cell}weight_ih": take(f"{rnn}.weight_ih_l{k}"), f"{cell}weight_hh": take(f"{rnn}.weight_hh_l{k}")}  # torch's packing
        if config.bias:
            pair = take(f"{rnn}.bias_ih_l{k}"), take(f"{rnn}.bias_hh_l{k}")  # (G*H,) each
            arrays |= {f"{cell}{name}": bias for name, bias in biases(*pair).items()}
        return arrays

    return layer


def lstm_to_equinox(state: Mapping[str, np.ndarray], config: RNNConfig = LSTM) -> dict[str, np.ndarray]:
    """torch LSTMTagger state_dict (NumPy) -> {rnn_equinox.LSTMTagger array path: array}."""
    return _convert(state, config, head_to_equinox, _equinox_layer(config, lambda b_ih, b_hh: {"bias": summed(b_ih, b_hh)}))  # (4H,)


def lstm_no_bias_to_equinox(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """lstm_to_equinox for the bias-free LSTM (use_bias=False port)."""
    return lstm_to_equinox(state, LSTM_NO_BIAS)


def gru_to_equinox(state: Mapping[str, np.ndarray], config: RNNConfig = GRU) -> dict[str, np.ndarray]:
    """torch GRUTagger state_dict (NumPy) -> {rnn_equinox.GRUTagger array path: array}."""
    layer = _equinox_layer(config, lambda b_ih, b_hh: dict(zip(("bias", "bias_n"), gru_input_bias(b_ih, b_hh))))  # (3H,), b_hn (H,)
    return _convert(state, config, head_to_equinox, layer)


def gru_no_bias_to_equinox(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """gru_to_equinox for the bias-free GRU (use_bias=False port)."""
    return gru_to_equinox(state, GRU_NO_BIAS)


def port_flax(build: Callable[[], nnx.Module], reference: nn.Module, convert, swap=None):
    """The NNX port `build()` makes, abstractly, `swap(model)` applied first, with `reference`'s weights written in by `convert`."""
    return load_nnx(abstract(build, swap), convert(numpy_state(reference)))


def port_equinox(build: Callable[[], eqx.Module], reference: nn.Module, convert):
    """The Equinox port `build()` makes, abstractly, with `reference`'s weights written in by `convert`."""
    return load_equinox(eqx.filter_eval_shape(build), convert(numpy_state(reference)))


def ported_lstm_flax(dtype: str = "float32"):
    """nnx.RNN(nnx.LSTMCell) with rnn_torch.lstm's weights and (x (3, 5, 7),): a factory for `mhsa port-check`."""
    model = port_flax(lambda: rnn_flax.LSTMTagger(LSTM, dtype=dtype, rngs=nnx.Rngs(0)), rnn_torch.build(LSTM), lstm_to_flax)
    return model, (sequences(LSTM),)


def ported_gru_flax(dtype: str = "float32"):
    """nnx.RNN(nnx.GRUCell) with rnn_torch.gru_zero_hn's weights and (x (5, 3, 7),), time-major."""
    model = port_flax(lambda: rnn_flax.GRUTagger(GRU, dtype=dtype, rngs=nnx.Rngs(0)), rnn_torch.build(GRU, hn=False), gru_to_flax)
    return model, (sequences(GRU),)


def ported_lstm_equinox(dtype: str = "float32"):
    """eqx.nn.LSTMCell scanned, with rnn_torch.lstm's weights and (x (3, 5, 7),), called per example."""
    model = port_equinox(lambda: rnn_equinox.LSTMTagger(LSTM, dtype, key=jax.random.key(0)), rnn_torch.build(LSTM), lstm_to_equinox)
    return model, (sequences(LSTM),)


def ported_lstm_no_bias_equinox(dtype: str = "float32"):
    """The use_bias=False LSTM port with rnn_torch.lstm_no_bias's weights and (x (3, 5, 7),)."""
    build = functools.partial(rnn_equinox.LSTMTagger, LSTM_NO_BIAS, dtype, key=jax.random.key(0))
    model = port_equinox(build, rnn_torch.build(LSTM_NO_BIAS), lstm_no_bias_to_equinox)
    return model, (sequences(LSTM_NO_BIAS),)


def ported_gru_equinox(dtype: str = "float32"):
    """eqx.nn.GRUCell scanned, with rnn_torch.gru's weights (b_hn in bias_n) and (x (5, 3, 7),), taken whole."""
    return port_equinox(lambda: rnn_equinox.GRUTagger(GRU, dtype, key=jax.random.key(0)), rnn_torch.build(GRU), gru_to_equinox), (sequences(GRU),)


def ported_gru_no_bias_equinox(dtype: str = "float32"):
    """The use_bias=False GRU port with rnn_torch.gru_no_bias's weights and (x (5, 3, 7),)."""
    build = functools.partial(rnn_equinox.GRUTagger, GRU_NO_BIAS, dtype, key=jax.random.key(0))
    model = port_equinox(build, rnn_torch.build(GRU_NO_BIAS), gru_no_bias_to_equinox)
    return model, (sequences(GRU_NO_BIAS),)
