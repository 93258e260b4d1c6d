"""`mhsa port-check --train N` factories for docs/port-check.md: the pre-LayerNorm block of
examples/torch_block.py and its NNX port (flax_block.py), trained to output at each position the
input of the one before, torch's AdamW against optax.adamw.

    mhsa port-check examples.train_pair:torch_adamw examples.train_pair:flax_adamw --train 20

Each factory returns the mapping the training check takes: the model, an optimizer over it (a
torch.optim.Optimizer, or an optax GradientTransformation), the loss (output, *batch) -> scalar
in its own framework, the batches, each (x (B, T, D), target (B, T, D)), cycled over the steps,
and model_inputs: the model takes the first array of a batch, the loss all of them. The port's
own weights do not matter: the check copies the reference's in.

`flax_adamw_default_decay` is the classic mistake: optax.adamw's weight_decay defaults to 1e-4,
torch's AdamW's to 1e-2, so the port decays its weights a hundred times less at every step.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn.functional as F
from flax import nnx

from examples import flax_block, torch_block

LR = 1e-2
BATCHES = 4


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    """BATCHES batches of (x, target), each (B, T, D) float32: the target at t is x at t - 1 (zeros
    at t = 0), a task for causal attention."""
    xs = [torch_block.example_inputs(seed) for seed in range(BATCHES)]
    return [(x, np.concatenate([np.zeros_like(x[:, :1]), x[:, :-1]], axis=1)) for x in xs]


def torch_loss(output, x, target):
    """The mean squared error of the block's output (B, T, D) against the target."""
    return F.mse_loss(output, target)


def flax_loss(output, x, target):
    """torch_loss in JAX."""
    return jnp.mean((output - target) ** 2)


def torch_adamw() -> dict:
    """The reference in eval mode (dropout off): torch.optim.AdamW at its defaults but the
    learning rate (weight_decay 1e-2)."""
    model, _ = torch_block.block()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    return {"model": model, "optimizer": optimizer, "loss": torch_loss, "inputs": batches(), "model_inputs": 1}


def _port(optimizer: optax.GradientTransformation) -> dict:
    model = flax_block.Block(rngs=nnx.Rngs(0))
    return {"model": model, "optimizer": optimizer, "loss": flax_loss, "inputs": batches(), "model_inputs": 1}


def flax_adamw() -> dict:
    """The faithful port: optax.adamw with torch's weight decay spelled out."""
    return _port(optax.adamw(LR, weight_decay=1e-2))


def flax_adamw_default_decay() -> dict:
    """The classic mistake: optax.adamw's default weight_decay, 1e-4."""
    return _port(optax.adamw(LR))
