"""`--train` factories for the zoo's VAE pair: `mhsa port-check examples.zoo.vae_train:reference
examples.zoo.vae_train:port --train 20`.

Each returns {"model", "optimizer", "loss", "inputs", "model_inputs"} (mhsa.port_check.training.check):
the reference (vae_torch) with torch's AdamW, and the fresh port (vae_flax) with the same optimizer
in optax, every setting written out (train_common.AdamW). The loss is the mean squared error
against a target image (a mean: the layout does not enter); the batches are (images, targets),
each side in its own layout (torch NCHW, Flax NHWC) of the same numbers, and the model takes the
first.
"""

from __future__ import annotations

import numpy as np
from flax import nnx

from examples.zoo import vae_flax, vae_torch
from examples.zoo.train_common import AdamW, normal, port_setup, reference_setup
from examples.zoo.vae_torch import TINY

BATCHES = 4
ADAMW = AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)


def batches_nchw() -> list[tuple[np.ndarray, np.ndarray]]:
    """BATCHES batches of (images (B, C_in, H, W), targets (B, C_out, H, W)), float32 N(0, 1): torch's layout."""
    shape = (TINY.batch, TINY.out_channels, TINY.height, TINY.width)
    return [(vae_torch.images_nchw(TINY, seed=200 + seed), normal(shape, 300 + seed)) for seed in range(BATCHES)]


def batches_nhwc() -> list[tuple[np.ndarray, ...]]:
    """The same batches in Flax's layout, (B, H, W, C) each."""
    return [tuple(np.ascontiguousarray(a.transpose(0, 2, 3, 1)) for a in batch) for batch in batches_nchw()]


def reference() -> dict:
    model = vae_torch.build()
    return reference_setup(model, ADAMW.torch(model.parameters()), batches_nchw())


def port() -> dict:
    return port_setup(vae_flax.Decoder(TINY, dtype="float32", rngs=nnx.Rngs(0)), ADAMW.optax(), batches_nhwc())
