"""`--train` factories for the zoo's fused-attention pair: `mhsa port-check
examples.zoo.fused_train:reference examples.zoo.fused_train:port --train 20`.

Each returns {"model", "optimizer", "loss", "inputs", "model_inputs"} (mhsa.port_check.training.check):
the reference (fused_torch) with torch's AdamW, and the fresh port (fused_flax), whose fused
kernels are head-shaped, (D, 3, H, d_head) and (H, d_head, D), where the reference's weights are
(3D, D) and (D, D), with the same optimizer in optax, every setting written out on both sides
(train_common.AdamW). The loss is the mean squared error against a target; the batches are
(x (B, T, D), target (B, T, D)), the model takes the first.
"""

from __future__ import annotations

import numpy as np
from flax import nnx

from examples.zoo import fused_flax, fused_torch
from examples.zoo.fused_torch import TINY
from examples.zoo.train_common import AdamW, normal, port_setup, reference_setup

BATCHES = 4
ADAMW = AdamW(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    """BATCHES batches of (x (B, T, D) float32, target (B, T, D) float32), N(0, 1) each, both drawn from one generator."""
    shape = (TINY.batch, TINY.length, TINY.d_model)
    rngs = [np.random.default_rng(100 + seed) for seed in range(BATCHES)]
    return [(normal(shape, rng), normal(shape, rng)) for rng in rngs]


def reference() -> dict:
    model = fused_torch.build()
    return reference_setup(model, ADAMW.torch(model.parameters()), batches())


def port() -> dict:
    return port_setup(fused_flax.Decoder(TINY, dtype="float32", rngs=nnx.Rngs(0)), ADAMW.optax(), batches())
