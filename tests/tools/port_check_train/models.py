"""A small model of our own for the port check through training: an MLP with a LayerNorm at odd,
distinct sizes, in torch and in Flax NNX, with factories that pair an optimizer on each side.

    x (B, D) -> LayerNorm(D) -> Linear(D, W) -> GELU (exact) -> Linear(W, C) -> logits (B, C)

The inputs have standard deviation 3, so the LayerNorm's eps matters at the level of the training check's
example. The Flax LayerNorm is written out by hand (weight and bias named as torch names them);
the configuration lint reads its `eps` attribute as it reads nnx.LayerNorm's epsilon."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from flax import nnx
from torch import nn

B, D, W, C = 3, 7, 13, 5
BATCHES = 4


class TorchMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)  # eps 1e-5
        self.fc1 = nn.Linear(D, W)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(W, C)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(self.ln(x))))  # (B, C)


class HandLayerNorm(nnx.Module):
    """torch's LayerNorm written out by hand: (x - mean) / sqrt(var + eps) * weight + bias."""

    def __init__(self, d, eps=1e-5):
        self.weight = nnx.Param(jnp.ones((d,)))
        self.bias = nnx.Param(jnp.zeros((d,)))
        self.eps = eps

    def __call__(self, x):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + self.eps) * self.weight[...] + self.bias[...]  # (B, D)


class FlaxMLP(nnx.Module):
    def __init__(self, eps=1e-5, *, rngs: nnx.Rngs):
        self.ln = HandLayerNorm(D, eps)
        self.fc1 = nnx.Linear(D, W, rngs=rngs)
        self.fc2 = nnx.Linear(W, C, rngs=rngs)

    def __call__(self, x):
        return self.fc2(jax.nn.gelu(self.fc1(self.ln(x)), approximate=False))  # (B, C)


class RenamedFlaxMLP(FlaxMLP):
    """The same port with its norm called `norm`: the names reach it through a name map {"ln": "norm"}."""

    def __init__(self, *, rngs: nnx.Rngs):
        self.norm = HandLayerNorm(D)
        self.fc1 = nnx.Linear(D, W, rngs=rngs)
        self.fc2 = nnx.Linear(W, C, rngs=rngs)

    def __call__(self, x):
        return self.fc2(jax.nn.gelu(self.fc1(self.norm(x)), approximate=False))  # (B, C)


def batches(seed=0) -> list[tuple[np.ndarray, np.ndarray]]:
    """BATCHES batches of (x (B, D) float32 with standard deviation 3, labels (B,) in [0, C))."""
    rng = np.random.default_rng(seed)
    return [(3 * rng.standard_normal((B, D)).astype(np.float32), rng.integers(0, C, B)) for _ in range(BATCHES)]


def torch_loss(logits, x, labels):
    return nn.functional.cross_entropy(logits, labels)


def flax_loss(logits, x, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def torch_side(optimizer="adam", **settings):
    """{'model', 'optimizer', 'loss', 'inputs', 'model_inputs'} with torch.optim.<optimizer>(**settings);
    settings may also hold 'scheduler' (a function of the optimizer) and 'clip'."""
    torch.manual_seed(0)
    model = TorchMLP()
    scheduler, clip = settings.pop("scheduler", None), settings.pop("clip", None)
    classes = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
    opt = classes[optimizer](model.parameters(), **({"lr": 1e-2} | settings))
    side = {"model": model, "optimizer": opt, "loss": torch_loss, "inputs": batches(), "model_inputs": 1}
    if scheduler is not None:
        side["scheduler"] = scheduler(opt)
    if clip is not None:
        side["clip"] = clip
    return side


def flax_side(tx, eps=1e-5):
    return {"model": FlaxMLP(eps, rngs=nnx.Rngs(1)), "optimizer": tx, "loss": flax_loss, "inputs": batches(), "model_inputs": 1}


# factories for the command: a matched pair, and the port with its LayerNorm's eps at 1e-6
def torch_adamw():
    return torch_side("adamw")


def flax_adamw():
    return flax_side(optax.adamw(1e-2, weight_decay=1e-2))


def flax_adamw_default_decay():
    return flax_side(optax.adamw(1e-2))


def flax_adamw_renamed():
    return flax_side(optax.adamw(1e-2, weight_decay=1e-2)) | {"model": RenamedFlaxMLP(rngs=nnx.Rngs(1))}


def flax_adamw_no_bias():
    """The port with fc1 built without its bias: torch's fc1.bias has nowhere to go."""
    side = flax_adamw()
    side["model"].fc1 = nnx.Linear(D, W, use_bias=False, rngs=nnx.Rngs(1))
    return side


def raising():
    """A factory that fails the way a user's can: the command says so in one line."""
    raise RuntimeError("no such checkpoint: model.pt")
