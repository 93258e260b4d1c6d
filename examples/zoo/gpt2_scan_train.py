"""`--train` factories for the zoo's scanned GPT-2 pair: `mhsa port-check
examples.zoo.gpt2_scan_train:reference examples.zoo.gpt2_scan_train:port --train 20` (or
`:port_split`, the jax.lax.scan style).

Each returns {"model", "optimizer", "loss", "inputs", ...} (mhsa.port_check.training.check): the
reference (gpt2_torch's model at gpt2_scan.CONFIG, three layers) with torch's AdamW, and the
fresh scanned port (gpt2_scan.py), its blocks' parameters stacked (n_layers, ...), with the same
optimizer in optax, every setting written out on both sides (train_common.AdamW). The loss is GPT-2's own: next-token cross-entropy of the
output's logits over every position; the batches are (input_ids (B, T),), which the model takes.
The Linen port has no factory here: the training check takes NNX and Equinox ports.
"""

from __future__ import annotations

import numpy as np
import optax
from flax import nnx
from torch.nn import functional as F

from examples.zoo import gpt2_scan, gpt2_torch, inputs
from examples.zoo.gpt2_scan import CONFIG
from examples.zoo.train_common import AdamW

BATCHES = 4
ADAMW = AdamW(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def batches() -> list[tuple[np.ndarray]]:
    """BATCHES batches of (input_ids (B, T) int64,), each from its own seed."""
    return [(inputs.token_ids(CONFIG.vocab_size, seed=200 + seed),) for seed in range(BATCHES)]


def torch_loss(output, input_ids):
    """CausalLMOutput with logits (B, T, V) -> the mean cross-entropy of predicting each token from the ones before."""
    logits = output.logits[:, :-1]  # (B, T - 1, V): position t predicts token t + 1
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1))  # over B * (T - 1)


def flax_loss(output, input_ids):
    """torch_loss in optax."""
    losses = optax.softmax_cross_entropy_with_integer_labels(output.logits[:, :-1], input_ids[:, 1:])  # (B, T - 1)
    return losses.mean()


def reference() -> dict:
    model = gpt2_torch.build(CONFIG)
    return {"model": model, "optimizer": ADAMW.torch(model.parameters()), "loss": torch_loss, "inputs": batches()}


def _port(cls: type[gpt2_scan.ScanGPT2LMHeadModel]) -> dict:
    return {"model": cls(CONFIG, dtype="float32", rngs=nnx.Rngs(0)), "optimizer": ADAMW.optax(), "loss": flax_loss, "inputs": batches()}


def port() -> dict:
    """The nnx.scan port (gpt2_scan.ScanGPT2LMHeadModel), fresh."""
    return _port(gpt2_scan.ScanGPT2LMHeadModel)


def port_split() -> dict:
    """The jax.lax.scan port (gpt2_scan.SplitScanGPT2LMHeadModel), fresh."""
    return _port(gpt2_scan.SplitScanGPT2LMHeadModel)
