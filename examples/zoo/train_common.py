"""What the zoo's `--train` factories of the heads, fused, vae and rnn pairs share: the loss, the
mean squared error against a target, in torch and in JAX; AdamW's settings written out once for
both libraries; the dict a factory returns; and the N(0, 1) arrays their batches are made of.

A factory returns {"model", "optimizer", "loss", "inputs", "model_inputs", ...}
(mhsa.port_check.training.check): each batch is (x, target), the model takes x only
("model_inputs": 1), and the loss is called as loss(output, x, target)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import optax
import torch
from torch.nn import functional as F


def torch_mse(output, x, target):
    """output and target of one shape, any -> the mean squared error (a scalar); x, the model's input, unused."""
    return F.mse_loss(output, target)


def jax_mse(output, x, target):
    """torch_mse in JAX."""
    return jnp.mean((output - target) ** 2)


@dataclasses.dataclass(frozen=True)
class AdamW:
    """AdamW with every setting written out on both sides: the two libraries' defaults differ
    (weight decay 1e-2 in torch, 1e-4 in optax). With `clip`, the gradients' global norm is clipped
    first: torch's factory says so as its "clip" key (the training check calls clip_grad_norm_),
    the optax transformation holds it."""

    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    clip: float | None = None

    def torch(self, parameters) -> torch.optim.AdamW:
        """torch.optim.AdamW over `parameters` (a model's .parameters()); the clip is the caller's."""
        return torch.optim.AdamW(parameters, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay)

    def optax(self) -> optax.GradientTransformation:
        """optax.adamw, after optax.clip_by_global_norm where there is a clip."""
        adamw = optax.adamw(self.lr, b1=self.betas[0], b2=self.betas[1], eps=self.eps, weight_decay=self.weight_decay)
        return adamw if self.clip is None else optax.chain(optax.clip_by_global_norm(self.clip), adamw)


def reference_setup(model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: list, **more) -> dict:
    """A reference's --train factory dict: `model` trained by `optimizer` on the batches `inputs`
    [(x, target)] with torch_mse; `more` (a "clip", say) added as it is."""
    return {"model": model, "optimizer": optimizer, "loss": torch_mse, "inputs": inputs, "model_inputs": 1} | more


def port_setup(model, optimizer: optax.GradientTransformation, inputs: list) -> dict:
    """A port's --train factory dict: `model` (NNX or Equinox) trained by `optimizer` on the
    batches `inputs` [(x, target)] with jax_mse."""
    return {"model": model, "optimizer": optimizer, "loss": jax_mse, "inputs": inputs, "model_inputs": 1}


def normal(shape: tuple[int, ...], seed: int | np.random.Generator) -> np.ndarray:
    """N(0, 1) float32 of `shape`, from a new generator seeded by `seed`, or drawn next from the
    generator `seed` is (np.random.default_rng returns a generator as it is)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
