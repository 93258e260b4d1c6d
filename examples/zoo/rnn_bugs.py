"""Broken ports of the recurrent pairs, each a faithful port of rnn_flax.py or rnn_equinox.py with the
reference's weights written in by rnn_convert.py, and exactly one classic porting bug planted: a
converter that reads torch's packed gates in another library's order, drops b_hh or folds b_hn
into the one bias a cell has, a layer built in the other layout, a stack subclass that overrides
one method.
examples/zoo/catalog.py lists them with the module where each must be found.

nn.LSTM and nn.GRU call no submodule of their own: a bug inside the recurrence is first seen at
the reference's `lstm` / `gru`, whose output is (output, (h_n, c_n)) / (output, h_n), as the NNX
ports' and the Equinox GRU port's."""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from examples.zoo import rnn_convert, rnn_equinox, rnn_flax, rnn_torch
from examples.zoo.convert import StateDict, jax_dtype
from examples.zoo.rnn_convert import port_equinox, port_flax, rows
from examples.zoo.rnn_torch import GRU, LSTM, RNNConfig, sequences


def swap_first_gates(packed: np.ndarray, gates: int, axis: int = 0) -> np.ndarray:
    """A packed array with its first two gate blocks (along `axis`) exchanged: (a, b, ...) -> (b, a, ...)."""
    blocks = np.split(packed, gates, axis=axis)
    return np.concatenate([blocks[1], blocks[0], *blocks[2:]], axis=axis)


def tensorflow_gate_order(state, config: RNNConfig = LSTM):
    """rnn_convert.lstm_to_flax, except that torch's rows are read in TensorFlow 1's LSTM order
    i, j (= g), f, o: the forget gate's Linears get the candidate's rows and the other way round."""
    arrays = rnn_convert.lstm_to_flax(state, config)
    for k in range(config.num_layers):
        cell = f"lstm.layers.{k}.cell."
        for forget, candidate in (("if_.kernel", "ig.kernel"), ("hf.kernel", "hg.kernel"), ("hf.bias", "hg.bias")):
            arrays[cell + forget], arrays[cell + candidate] = arrays[cell + candidate], arrays[cell + forget]
    return arrays


def lstm_gates_tf_order(dtype: str = "float32"):
    """The NNX LSTM port converted with TensorFlow 1's gate order (i, g, f, o) for torch's (i, f, g, o)."""
    model = port_flax(lambda: rnn_flax.LSTMTagger(LSTM, dtype=dtype, rngs=nnx.Rngs(0)), rnn_torch.build(LSTM), tensorflow_gate_order)
    return model, (sequences(LSTM),)


def input_bias_only(state, config: RNNConfig = LSTM):
    """rnn_convert.lstm_to_flax, except that each hidden Linear's bias is b_ih alone: b_hh dropped,
    as a porter does who maps one bias to one bias."""
    arrays = rnn_convert.lstm_to_flax(state, config)
    for k in range(config.num_layers):
        for (_, on_hidden), b_ih in zip(rnn_convert.NNX_LSTM_GATES, rows(state[f"lstm.bias_ih_l{k}"], 4)):
            arrays[f"lstm.layers.{k}.cell.{on_hidden}.bias"] = b_ih
    return arrays


def lstm_hidden_bias_dropped(dtype: str = "float32"):
    """The NNX LSTM port converted without b_hh."""
    model = port_flax(lambda: rnn_flax.LSTMTagger(LSTM, dtype=dtype, rngs=nnx.Rngs(0)), rnn_torch.build(LSTM), input_bias_only)
    return model, (sequences(LSTM),)


def lstm_batch_first_ignored(dtype: str = "float32"):
    """The NNX LSTM port built time-major (torch's default, batch_first=True overlooked) and handed
    the batch-first inputs (3, 5, 7): it scans over the 3 rows of the batch as if they were steps,
    with the 5 steps as its batch, and returns an output of the expected shape."""
    time_major = dataclasses.replace(LSTM, batch_first=False)
    model = port_flax(lambda: rnn_flax.LSTMTagger(time_major, dtype=dtype, rngs=nnx.Rngs(0)), rnn_torch.build(LSTM), rnn_convert.lstm_to_flax)
    return model, (sequences(LSTM),)


def hn_folded(state, config: RNNConfig = GRU):
    """rnn_convert.gru_to_flax as a porter writes it who sums b_ih + b_hh for every gate and so
    never refuses a non-zero b_hn: it joins b_in outside the reset gate's product, where torch
    multiplies it by r."""
    take = StateDict(state)
    arrays = rnn_convert.head_to_flax(take)
    for k in range(config.num_layers):
        cell = f"gru.layers.{k}.cell."
        arrays[f"{cell}dense_i.kernel"] = take(f"gru.weight_ih_l{k}").T  # (3H, in) -> (in, 3H)
        arrays[f"{cell}dense_h.kernel"] = take(f"gru.weight_hh_l{k}").T  # (3H, H) -> (H, 3H)
        arrays[f"{cell}dense_i.bias"] = rnn_convert.summed(take(f"gru.bias_ih_l{k}"), take(f"gru.bias_hh_l{k}"))  # (3H,), b_hn included
    take.finish()
    return arrays


def gru_hn_folded(dtype: str = "float32"):
    """The NNX GRU port (nnx.GRUCell: no b_hn) of the GRU with a non-zero b_hn (rnn_torch.gru), its
    b_hn folded into dense_i's bias."""
    model = port_flax(lambda: rnn_flax.GRUTagger(GRU, dtype=dtype, rngs=nnx.Rngs(0)), rnn_torch.build(GRU), hn_folded)
    return model, (sequences(GRU),)


def keras_gate_order(state, config: RNNConfig = GRU):
    """rnn_convert.gru_to_equinox, except that torch's rows are read in Keras's GRU order z, r, h
    for torch's r, z, n: the reset and update gates exchange their rows and biases (bias_n, the
    candidate's, stays right)."""
    arrays = rnn_convert.gru_to_equinox(state, config)
    for k in range(config.num_layers):
        for name in ("weight_ih", "weight_hh", "bias"):
            arrays[f"gru.layers.{k}.{name}"] = swap_first_gates(arrays[f"gru.layers.{k}.{name}"], 3)
    return arrays


def gru_keras_gate_order(dtype: str = "float32"):
    """The Equinox GRU port converted with Keras's gate order (z, r, h) for torch's (r, z, n)."""
    model = port_equinox(lambda: rnn_equinox.GRUTagger(GRU, dtype, key=jax.random.key(0)), rnn_torch.build(GRU), keras_gate_order)
    return model, (sequences(GRU),)


class DetachedGRUStack(rnn_equinox.GRUStack):
    def layer(self, cell, x):
        """The carry passed through jax.lax.stop_gradient at every step, as torch code that trains
        by truncated backpropagation detaches it (h.detach()): the same outputs, and gradients that
        stop at each step."""

        def step(h, x_t):
            h = jax.vmap(cell)(x_t, jax.lax.stop_gradient(h))  # (B, H)
            return h, h

        h, outputs = jax.lax.scan(step, jnp.zeros((x.shape[1], cell.hidden_size), x.dtype), x)
        return outputs, h


def gru_carry_detached(dtype: str = "float32"):
    """The Equinox GRU port with its carry detached between steps: outputs agree, gradients part."""

    def build():
        model = rnn_equinox.GRUTagger(GRU, dtype, key=jax.random.key(0))
        return eqx.tree_at(lambda m: m.gru, model, DetachedGRUStack(GRU, dtype=jax_dtype(dtype), key=jax.random.key(0)))

    return port_equinox(build, rnn_torch.build(GRU), rnn_convert.gru_to_equinox), (sequences(GRU),)
