"""`--train` factories for the zoo's recurrent pairs, torch's Adam against optax.adam at the same
learning rate, each pair trained to regress fixed random targets from every step's output:

    mhsa port-check examples.zoo.rnn_train:lstm_no_bias_reference examples.zoo.rnn_train:lstm_no_bias_port --train 20 --map lstm_map.json
    mhsa port-check examples.zoo.rnn_train:gru_no_bias_reference examples.zoo.rnn_train:gru_no_bias_port --train 20 --map gru_map.json
    mhsa port-check examples.zoo.rnn_train:lstm_reference examples.zoo.rnn_train:lstm_port --train 20

Each returns {"model", "optimizer", "loss", "inputs", "model_inputs"} (mhsa.port_check.training.check):
the batches are (x, target), the model takes x, the loss (output, x, target) is the mean squared
error (train_common.py). The ports hold the reference's weights, converted by rnn_convert.py: the
check copies only the arrays it pairs by name, and the recurrent ones pair by no rule of its own.

- lstm_no_bias, gru_no_bias: bias=False references against Equinox ports with use_bias=False
  (rnn_equinox). Every array of the port is one of torch's, in torch's layout (the cells' weight_ih
  and weight_hh pack the gates as torch does): the trainings can agree step for step. The names
  differ (torch's lstm.weight_ih_l0 is the port's lstm.layers.0.weight_ih): name_map(config) is
  the --map for them. The LSTM port is called per example, the GRU port on the time-major batch.
- lstm: the LSTM with biases against nnx.RNN over nnx.LSTMCell (rnn_flax), whose trainings cannot
  agree: each gate's bias in the cell is torch's b_ih + b_hh, one parameter where torch trains two,
  and both of torch's get the gradient of their sum, so at every step of SGD the sum moves twice
  as far in torch as the port's bias moves (Adam's first step: twice as far as well, each of
  torch's two taking a step of about lr); the packed gates have no counterpart by name either.
"""

from __future__ import annotations

import numpy as np
import optax
import torch

from examples.zoo import rnn_convert, rnn_torch
from examples.zoo.rnn_torch import GRU_NO_BIAS, LSTM, LSTM_NO_BIAS, RNNConfig, sequences
from examples.zoo.train_common import normal, port_setup, reference_setup

BATCHES = 4
LR = 1e-2


def targets(config: RNNConfig, seed: int) -> np.ndarray:
    """N(0, 1) float32 targets in the output's layout: (B, T, O) batch-first, (T, B, O) time-major."""
    y = normal((config.batch, config.time, config.n_outputs), 100 + seed)  # (B, T, O)
    return y if config.batch_first else np.ascontiguousarray(y.transpose(1, 0, 2))  # (T, B, O)


def batches(config: RNNConfig) -> list[tuple[np.ndarray, np.ndarray]]:
    """BATCHES batches of (x, target) in the config's layout, x from rnn_torch.sequences."""
    return [(sequences(config, seed=seed), targets(config, seed)) for seed in range(BATCHES)]


def name_map(config: RNNConfig) -> dict[str, str]:
    """{torch parameter name: the Equinox port's array path} for a bias-free stack, the --map of its
    pair (the head's names are the same on both sides)."""
    return {f"{config.cell}.{kind}_l{k}": f"{config.cell}.layers.{k}.{kind}" for k in range(config.num_layers) for kind in ("weight_ih", "weight_hh")}


def _reference(config: RNNConfig) -> dict:
    model = rnn_torch.build(config)
    return reference_setup(model, torch.optim.Adam(model.parameters(), lr=LR), batches(config))


def _port(model, config: RNNConfig) -> dict:
    return port_setup(model, optax.adam(LR), batches(config))


def lstm_no_bias_reference() -> dict:
    """rnn_torch.lstm_no_bias with torch's Adam."""
    return _reference(LSTM_NO_BIAS)


def lstm_no_bias_port() -> dict:
    """The use_bias=False Equinox LSTM port with the reference's weights, with optax.adam."""
    return _port(rnn_convert.ported_lstm_no_bias_equinox()[0], LSTM_NO_BIAS)


def gru_no_bias_reference() -> dict:
    """rnn_torch.gru_no_bias with torch's Adam, on time-major batches."""
    return _reference(GRU_NO_BIAS)


def gru_no_bias_port() -> dict:
    """The use_bias=False Equinox GRU port with the reference's weights, with optax.adam."""
    return _port(rnn_convert.ported_gru_no_bias_equinox()[0], GRU_NO_BIAS)


def lstm_reference() -> dict:
    """rnn_torch.lstm (with biases) with torch's Adam."""
    return _reference(LSTM)


def lstm_port() -> dict:
    """nnx.RNN over nnx.LSTMCell with the reference's weights (each bias b_ih + b_hh), with optax.adam."""
    return _port(rnn_convert.ported_lstm_flax()[0], LSTM)
