"""`--train` factories for the zoo's head-shaped pair: `mhsa port-check
examples.zoo.heads_train:reference examples.zoo.heads_train:port --train 20` (or
`examples.zoo.heads_train:port_equinox` for the Equinox port).

Each returns {"model", "optimizer", "loss", "inputs", ...} (mhsa.port_check.training.check): the
reference (heads_torch) with torch's AdamW and its gradients clipped to norm 1, and a fresh port
(heads_flax in NNX, heads_equinox in Equinox) with the same optimizer in optax, clip first, every
setting spelled out (train_common.AdamW: torch's AdamW and optax.adamw default to other weight
decays, 1e-2 and 1e-4).
The clip is a guard that these batches never reach (gradient norms 0.7 to 0.87 over 20 steps):
where it acts, torch's clip_grad_norm_ scales by max_norm / (norm + 1e-6) and optax's
clip_by_global_norm by max_norm / norm, and in float64 the two trainings part by about 7e-10
after 20 steps at a clip of 0.5, beyond the float64 tolerance.
The loss is the mean squared error of the stack's output (B, T, D) against a target of the same
shape; the batches are (x (B, T, D), target (B, T, D)), and the model takes the first array only
("model_inputs": 1). The Equinox port takes one example; the training check vmaps it, as its
forward check does, so its loss sees the whole batch's output too.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from examples.zoo import heads_equinox, heads_flax, heads_torch
from examples.zoo.heads_torch import TINY
from examples.zoo.train_common import AdamW, normal, port_setup, reference_setup

BATCHES = 4
ADAMW = AdamW(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, clip=1.0)


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    """BATCHES batches of (x (B, T, D) float32, target (B, T, D) float32), both N(0, 1)."""
    xs = [heads_torch.example_inputs(seed=10 + k)[0] for k in range(BATCHES)]
    return [(x, normal(x.shape, 20 + k)) for k, x in enumerate(xs)]


def reference() -> dict:
    model = heads_torch.build()
    return reference_setup(model, ADAMW.torch(model.parameters()), batches(), clip=ADAMW.clip)


def port() -> dict:
    return port_setup(heads_flax.HeadsStack(TINY, dtype="float32", rngs=nnx.Rngs(0)), ADAMW.optax(), batches())


def port_equinox() -> dict:
    """The Equinox port: its clip inside the optax transformation (the Equinox trainer takes no "clip" key)."""
    return port_setup(heads_equinox.HeadsStack(TINY, dtype="float32", key=jax.random.key(0)), ADAMW.optax(), batches())
