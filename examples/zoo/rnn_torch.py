"""Recurrent taggers in PyTorch: the references of the zoo's "rnn" family, torch's packed gates
against the JAX libraries' cells (rnn_flax.py ports them to nnx.RNN over nnx.LSTMCell and
nnx.GRUCell, rnn_equinox.py to eqx.nn.LSTMCell and eqx.nn.GRUCell scanned by jax.lax.scan,
rnn_convert.py converts the weights, rnn_bugs.py plants the classic porting bugs).

    lstm: x (B, T, I) -> lstm: nn.LSTM(I, H, num_layers=2, batch_first=True) -> head: Linear(H, O) per step -> (B, T, O)
    gru:  x (T, B, I) -> gru:  nn.GRU(I, H, num_layers=1), time-major        -> head: Linear(H, O) per step -> (T, B, O)

What a port has to reproduce (examples/zoo/catalog.py):
- The packed gates. nn.LSTM keeps weight_ih_l{k} (4H, in), weight_hh_l{k} (4H, H), bias_ih_l{k}
  and bias_hh_l{k} (4H,), their rows in the order i, f, g, o; nn.GRU the same with 3H rows in the
  order r, z, n. TensorFlow 1's LSTM packs i, g (its j), f, o and Keras's GRU z, r, h: a checkpoint
  read in another library's order fills every gate, with no shape error.
- Two biases per gate, b_ih and b_hh. Most cells add both outside every nonlinearity, so a cell
  with one bias holds their sum; the GRU's candidate n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
  keeps b_hn inside the reset gate's product, and only a cell with a bias of its own there
  (Equinox's bias_n) can hold it. nnx.GRUCell has none: `gru_zero_hn` is the GRU it can hold
  (every b_hn zero), `gru` keeps a non-zero b_hn for the Equinox pair.
- The layouts: batch_first=True for the LSTM, torch's default time-major (T, B, I) for the GRU;
  B, T, I, H and O are distinct, so a swapped axis cannot pass. The initial state is zeros.
- The module's own output: nn.LSTM returns (output (B, T, H), (h_n (L, B, H), c_n (L, B, H))),
  nn.GRU (output (T, B, H), h_n (L, B, H)); it calls no submodule of its own, so a bug inside the
  recurrence is first seen at `lstm` / `gru`. The models return the head's output alone.
- `lstm_no_bias`, `gru_no_bias`: bias=False (the head keeps its bias), the references whose
  training an Equinox port with use_bias=False can follow exactly (rnn_train.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from examples.zoo.configs import _positive

GATES = {"lstm": 4, "gru": 3}  # rows per hidden unit of the packed weights: i, f, g, o / r, z, n


@dataclass(frozen=True)
class RNNConfig:
    """A recurrent stack and a per-step linear head, in one of torch's two layouts."""

    cell: str = "lstm"  # "lstm" or "gru"
    input_size: int = 7
    hidden_size: int = 6
    num_layers: int = 2
    n_outputs: int = 4
    bias: bool = True  # the recurrent layers' b_ih and b_hh; the head always has its bias
    batch_first: bool = True
    batch: int = 3
    time: int = 5

    def __post_init__(self):
        _positive(self)
        if self.cell not in GATES:
            raise ValueError(f"cell must be one of {', '.join(GATES)}; got {self.cell!r}")
        sizes = {"batch": self.batch, "time": self.time, "input_size": self.input_size, "hidden_size": self.hidden_size}
        sizes |= {"n_outputs": self.n_outputs, "num_layers": self.num_layers}
        if len(set(sizes.values())) < len(sizes):
            raise ValueError(f"the sizes must be distinct, so that no swapped axis passes; got {sizes}")

    @property
    def gates(self) -> int:
        return GATES[self.cell]

    def layer_inputs(self, layer: int) -> int:
        """The input width of layer `layer`: the input's for the first, the hidden state's after."""
        return self.input_size if layer == 0 else self.hidden_size


LSTM = RNNConfig()
GRU = RNNConfig(cell="gru", num_layers=1, batch_first=False)
LSTM_NO_BIAS = dataclasses.replace(LSTM, bias=False)
GRU_NO_BIAS = dataclasses.replace(GRU, bias=False)


class LSTMTagger(nn.Module):
    """x (B, T, I) -> (B, T, O): a batch-first LSTM stack, then the head on every step's output."""

    def __init__(self, config: RNNConfig = LSTM):
        super().__init__()
        self.lstm = nn.LSTM(config.input_size, config.hidden_size, config.num_layers, bias=config.bias, batch_first=config.batch_first)
        self.head = nn.Linear(config.hidden_size, config.n_outputs)

    def forward(self, x):
        output, _ = self.lstm(x)  # (B, T, H); the final (h_n, c_n) unused
        return self.head(output)  # (B, T, O)


class GRUTagger(nn.Module):
    """x (T, B, I) -> (T, B, O): a time-major GRU stack, then the head on every step's output."""

    def __init__(self, config: RNNConfig = GRU):
        super().__init__()
        self.gru = nn.GRU(config.input_size, config.hidden_size, config.num_layers, bias=config.bias, batch_first=config.batch_first)
        self.head = nn.Linear(config.hidden_size, config.n_outputs)

    def forward(self, x):
        output, _ = self.gru(x)  # (T, B, H); the final h_n unused
        return self.head(output)  # (T, B, O)


def zero_hn(gru: nn.GRU) -> nn.GRU:
    """Every layer's b_hn (the last H rows of bias_hh_l{k}) set to 0: the GRU nnx.GRUCell can hold."""
    with torch.no_grad():
        for layer in range(gru.num_layers):
            getattr(gru, f"bias_hh_l{layer}")[2 * gru.hidden_size :] = 0.0
    return gru


def build(config: RNNConfig = LSTM, seed: int = 0, hn: bool = True) -> LSTMTagger | GRUTagger:
    """The reference in eval mode, torch's initializers from `seed` (every weight and bias
    U(-1/sqrt(H), 1/sqrt(H)): b_ih and b_hh distinct, nothing at a value a port could start
    from). hn=False: a GRU's b_hn set to 0 (zero_hn)."""
    torch.manual_seed(seed)
    model = LSTMTagger(config) if config.cell == "lstm" else GRUTagger(config)
    if not hn:
        if not isinstance(model, GRUTagger) or not config.bias:
            raise ValueError("hn=False is for a GRU with biases: only its b_hn sits inside the reset gate")
        zero_hn(model.gru)
    return model.eval()


def sequences(config: RNNConfig, seed: int = 11) -> np.ndarray:
    """N(0, 1) float32 inputs in the config's layout: (B, T, I) batch-first, (T, B, I) time-major."""
    x = np.random.default_rng(seed).standard_normal((config.batch, config.time, config.input_size)).astype(np.float32)  # (B, T, I)
    return x if config.batch_first else np.ascontiguousarray(x.transpose(1, 0, 2))  # (T, B, I)


def lstm():
    """The LSTM reference and (x (3, 5, 7),), batch-first: a factory for `mhsa port-check`."""
    return build(LSTM), (sequences(LSTM),)


def lstm_no_bias():
    """The LSTM reference with bias=False and (x (3, 5, 7),)."""
    return build(LSTM_NO_BIAS), (sequences(LSTM_NO_BIAS),)


def gru():
    """The GRU reference, b_hn non-zero, and (x (5, 3, 7),), time-major: the Equinox pair's."""
    return build(GRU), (sequences(GRU),)


def gru_zero_hn():
    """The GRU reference with every b_hn 0 and (x (5, 3, 7),): the only torch GRU nnx.GRUCell holds."""
    return build(GRU, hn=False), (sequences(GRU),)


def gru_no_bias():
    """The GRU reference with bias=False and (x (5, 3, 7),)."""
    return build(GRU_NO_BIAS), (sequences(GRU_NO_BIAS),)
