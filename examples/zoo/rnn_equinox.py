"""The recurrent taggers of rnn_torch.py in Equinox, written as Equinox code is: eqx.nn.LSTMCell and
eqx.nn.GRUCell take one example's step, and the model's own code scans them over time with
jax.lax.scan; and factories for `mhsa port-check`.

Equinox keeps torch's layouts and, nearly, its packing: LSTMCell holds weight_ih (4H, in),
weight_hh (4H, H) in torch's gate order i, f, g, o and one bias (4H,), which holds torch's
b_ih + b_hh; GRUCell holds weight_ih (3H, in), weight_hh (3H, H) in the order r, z, n, a bias
(3H,) added to the input's projection (b_ir + b_hr, b_iz + b_hz, b_in) and bias_n (H,) inside the
reset gate's product: exactly torch's b_hn. use_bias=False drops both, as torch's bias=False. The
cell's carry is (h, c), torch's order.

The two conventions of the port check (docs/port-check.md), one per model:
- LSTMTagger is called per example (the check vmaps it over the batch-first inputs (B, T, I)):
  x (T, I) -> (T, O). Its `lstm` returns the output sequence (T, H) alone: a per-example carry
  (L, H) would be seen batched as (B, L, H), against torch's h_n and c_n (L, B, H).
- GRUTagger says port_check_batched: it takes the whole time-major batch (T, B, I), as torch's
  time-major GRU does, and vmaps the cell over the batch inside the scan, so that `gru` returns
  torch's structure and layouts, (output (T, B, H), h_n (L, B, H)).

The initial state is zeros, as torch's; every array is created in `dtype` (Equinox's default is
float64 whenever jax_enable_x64 is on).
"""

from __future__ import annotations

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from examples.zoo.convert import jax_dtype
from examples.zoo.rnn_torch import GRU, GRU_NO_BIAS, LSTM, LSTM_NO_BIAS, RNNConfig, sequences


def lstm_layer(cell: eqx.nn.LSTMCell, x):
    """One LSTM layer over one sequence, x (T, in) -> (outputs (T, H), final (h, c), each (H,))."""

    def step(carry, x_t):
        h, c = cell(x_t, carry)  # (H,), (H,)
        return (h, c), h

    zeros = jnp.zeros(cell.hidden_size, x.dtype)
    carry, outputs = jax.lax.scan(step, (zeros, zeros), x)
    return outputs, carry


def gru_layer(cell: eqx.nn.GRUCell, x):
    """One GRU layer over a time-major batch, x (T, B, in) -> (outputs (T, B, H), final h (B, H)):
    the cell, which takes one example, vmapped over the batch at every step."""

    def step(h, x_t):
        h = jax.vmap(cell)(x_t, h)  # (B, H)
        return h, h

    h, outputs = jax.lax.scan(step, jnp.zeros((x.shape[1], cell.hidden_size), x.dtype), x)
    return outputs, h


def cells(cell_type, config: RNNConfig, dtype, key) -> list:
    """The config's layers, each a cell of `cell_type` in `dtype`, with or without its biases."""
    keys = jax.random.split(key, config.num_layers)
    return [cell_type(config.layer_inputs(k), config.hidden_size, use_bias=config.bias, dtype=dtype, key=keys[k]) for k in range(config.num_layers)]


class LSTMStack(eqx.Module):
    """x (T, I) -> the last layer's outputs (T, H), per example."""

    layers: list[eqx.nn.LSTMCell]

    def __init__(self, config: RNNConfig = LSTM, *, dtype, key):
        self.layers = cells(eqx.nn.LSTMCell, config, dtype, key)

    def __call__(self, x):
        for cell in self.layers:
            x, _ = lstm_layer(cell, x)  # (T, H)
        return x


class GRUStack(eqx.Module):
    """x (T, B, I) -> (output (T, B, H), h_n (L, B, H)), the whole time-major batch."""

    layers: list[eqx.nn.GRUCell]

    def __init__(self, config: RNNConfig = GRU, *, dtype, key):
        self.layers = cells(eqx.nn.GRUCell, config, dtype, key)

    def layer(self, cell: eqx.nn.GRUCell, x):
        """x (T, B, in) -> (outputs (T, B, H), final h (B, H)): gru_layer."""
        return gru_layer(cell, x)

    def __call__(self, x):
        finals = []
        for cell in self.layers:
            x, h = self.layer(cell, x)  # (T, B, H), (B, H)
            finals.append(h)
        return x, jnp.stack(finals)  # h_n (L, B, H)


class LSTMTagger(eqx.Module):
    """x (T, I) -> (T, O) per example: the LSTM stack, then the head on every step's output."""

    lstm: LSTMStack
    head: eqx.nn.Linear

    def __init__(self, config: RNNConfig = LSTM, dtype: str = "float32", *, key):
        k1, k2 = jax.random.split(key)
        self.lstm = LSTMStack(config, dtype=jax_dtype(dtype), key=k1)
        self.head = eqx.nn.Linear(config.hidden_size, config.n_outputs, dtype=jax_dtype(dtype), key=k2)

    def __call__(self, x):
        return jax.vmap(self.head)(self.lstm(x))  # (T, O)


class GRUTagger(eqx.Module):
    """x (T, B, I) -> (T, B, O), the whole batch: the GRU stack, then the head on every step's output."""

    port_check_batched: ClassVar[bool] = True  # called on the time-major batch, not per example

    gru: GRUStack
    head: eqx.nn.Linear

    def __init__(self, config: RNNConfig = GRU, dtype: str = "float32", *, key):
        k1, k2 = jax.random.split(key)
        self.gru = GRUStack(config, dtype=jax_dtype(dtype), key=k1)
        self.head = eqx.nn.Linear(config.hidden_size, config.n_outputs, dtype=jax_dtype(dtype), key=k2)

    def __call__(self, x):
        output, _ = self.gru(x)  # (T, B, H)
        return jax.vmap(jax.vmap(self.head))(output)  # (T, B, O)


def fresh_lstm(dtype: str = "float32"):
    """The LSTM port as built (Equinox's initializers) and the reference's inputs (x (3, 5, 7),),
    batch-first: the check calls it per example."""
    return LSTMTagger(LSTM, dtype, key=jax.random.key(0)), (sequences(LSTM),)


def fresh_lstm_no_bias(dtype: str = "float32"):
    """The bias-free LSTM port (use_bias=False) as built and (x (3, 5, 7),)."""
    return LSTMTagger(LSTM_NO_BIAS, dtype, key=jax.random.key(0)), (sequences(LSTM_NO_BIAS),)


def fresh_gru(dtype: str = "float32"):
    """The GRU port as built and the reference's time-major inputs (x (5, 3, 7),), taken whole."""
    return GRUTagger(GRU, dtype, key=jax.random.key(0)), (sequences(GRU),)


def fresh_gru_no_bias(dtype: str = "float32"):
    """The bias-free GRU port (use_bias=False) as built and (x (5, 3, 7),)."""
    return GRUTagger(GRU_NO_BIAS, dtype, key=jax.random.key(0)), (sequences(GRU_NO_BIAS),)
