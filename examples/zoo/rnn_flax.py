"""The recurrent taggers of rnn_torch.py in Flax NNX: nnx.RNN scanning nnx.LSTMCell and nnx.GRUCell
over time, one nnx.RNN per layer, then the head. Faithful ports: the same module names (`lstm`,
`gru`, `head`) and, at `lstm` / `gru`, the same output structure as torch's module.

What differs between the two sides, and why it is still the same model:
- nnx.LSTMCell has a Linear per gate: ii, if_, ig, io on the input, (in, H), without bias; hi,
  hf, hg, ho on the hidden state, (H, H), with bias. The bias of each gate is torch's
  b_ih + b_hh (both are added outside the gate's nonlinearity): rnn_convert.py splits torch's
  packed rows (i, f, g, o) and sums. The cell has no bias=False: it cannot hold a bias-free LSTM
  (its biases would be zeros that train).
- nnx.GRUCell packs r, z, n as torch does, in (in, 3H) kernels: dense_i with bias, dense_h
  without. It computes n = tanh(W_in x + b_in + r * (W_hn h)): no b_hn, so it ports exactly the GRU
  whose b_hn is zero (rnn_torch.gru_zero_hn); r's and z's biases are sums, as the LSTM's.
- nnx.LSTMCell's carry is (c, h), torch's state (h, c): `lstm` returns torch's (output, (h_n,
  c_n)), each of h_n and c_n stacked over the layers, (L, B, H).
- nnx.RNN scans over axis 1 (batch-first) unless time_major=True (axis 0): the LSTM port follows
  torch's batch_first=True, the GRU port torch's time-major default.
- nnx.RNN(cell) keeps an RNG stream of its own (rngs.key, rngs.count, advanced at every call)
  only to draw the initial carry, zeros whatever the key; a port built abstractly
  (convert.abstract) would be left with a key of shape only. The ports build nnx.RNN with
  rngs=False and pass the zero initial carry torch starts from (without one, that RNN raises
  "RNGs must be provided to initialize the cell carry").
- Every layer computes in `dtype`, parameters and carry included (float64 needs jax_enable_x64).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from examples.zoo.convert import jax_dtype
from examples.zoo.rnn_torch import GRU, LSTM, RNNConfig, sequences


class Recurrent(nnx.Module):
    """A stack of nnx.RNN layers over one kind of cell, time-major or batch-first as the config's
    batch_first says: x -> (output of the last layer, the final carries)."""

    def __init__(self, config: RNNConfig, cell_type, *, dtype, rngs: nnx.Rngs):
        self.hidden_size, self.time_major = config.hidden_size, not config.batch_first
        cells = [cell_type(config.layer_inputs(k), config.hidden_size, dtype=dtype, param_dtype=dtype, rngs=rngs) for k in range(config.num_layers)]
        self.layers = nnx.List([nnx.RNN(cell, time_major=self.time_major, return_carry=True, rngs=False) for cell in cells])

    def zeros(self, x):
        """(B, H) zeros in x's dtype: torch's initial state, B read on the batch axis of x."""
        return jnp.zeros((x.shape[1 if self.time_major else 0], self.hidden_size), x.dtype)


class LSTMStack(Recurrent):
    """x (B, T, I) batch-first (or (T, B, I) time-major) -> (output (B, T, H), (h_n (L, B, H), c_n (L, B, H)))."""

    def __init__(self, config: RNNConfig = LSTM, *, dtype, rngs: nnx.Rngs):
        super().__init__(config, nnx.LSTMCell, dtype=dtype, rngs=rngs)

    def __call__(self, x):
        hs, cs = [], []
        for rnn in self.layers:
            (c, h), x = rnn(x, initial_carry=(self.zeros(x), self.zeros(x)))  # carry (c, h), each (B, H); x (B, T, H)
            hs.append(h)
            cs.append(c)
        return x, (jnp.stack(hs), jnp.stack(cs))  # torch's order (h_n, c_n), each (L, B, H)


class GRUStack(Recurrent):
    """x (T, B, I) time-major (or (B, T, I) batch-first) -> (output (T, B, H), h_n (L, B, H))."""

    def __init__(self, config: RNNConfig = GRU, *, dtype, rngs: nnx.Rngs):
        super().__init__(config, nnx.GRUCell, dtype=dtype, rngs=rngs)

    def __call__(self, x):
        hs = []
        for rnn in self.layers:
            h, x = rnn(x, initial_carry=self.zeros(x))  # h (B, H); x (T, B, H)
            hs.append(h)
        return x, jnp.stack(hs)  # h_n (L, B, H)


class LSTMTagger(nnx.Module):
    """x (B, T, I) -> (B, T, O): the LSTM stack, then the head on every step's output."""

    def __init__(self, config: RNNConfig = LSTM, *, dtype: str = "float32", rngs: nnx.Rngs):
        dtype = jax_dtype(dtype)
        self.lstm = LSTMStack(config, dtype=dtype, rngs=rngs)
        self.head = nnx.Linear(config.hidden_size, config.n_outputs, dtype=dtype, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):
        output, _ = self.lstm(x)  # (B, T, H)
        return self.head(output)  # (B, T, O)


class GRUTagger(nnx.Module):
    """x (T, B, I) -> (T, B, O): the GRU stack, then the head on every step's output."""

    def __init__(self, config: RNNConfig = GRU, *, dtype: str = "float32", rngs: nnx.Rngs):
        dtype = jax_dtype(dtype)
        self.gru = GRUStack(config, dtype=dtype, rngs=rngs)
        self.head = nnx.Linear(config.hidden_size, config.n_outputs, dtype=dtype, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):
        output, _ = self.gru(x)  # (T, B, H)
        return self.head(output)  # (T, B, O)


def fresh_lstm(dtype: str = "float32"):
    """The LSTM port as built (Flax's initializers) and the reference's inputs (x (3, 5, 7),): a
    factory for `mhsa port-check`."""
    return LSTMTagger(LSTM, dtype=dtype, rngs=nnx.Rngs(0)), (sequences(LSTM),)


def fresh_gru(dtype: str = "float32"):
    """The GRU port as built and the reference's time-major inputs (x (5, 3, 7),)."""
    return GRUTagger(GRU, dtype=dtype, rngs=nnx.Rngs(0)), (sequences(GRU),)
