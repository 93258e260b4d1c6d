"""`--train` factories for the zoo's Llama-style pair: `mhsa port-check
examples.zoo.llama_train:reference examples.zoo.llama_train:port --train 20`.

Each returns {"model", "optimizer", "loss", "inputs", ...} (mhsa.port_check.training.check): the
reference (llama_torch) with torch's AdamW and its gradients clipped to norm 1, and the fresh
port (llama_flax) with the same optimizer in optax, clip first. The loss is next-token
cross-entropy over the targets that are real tokens of the padded rows; the batches are
(input_ids (B, T), attention_mask (B, T)), the model takes both.
"""

from __future__ import annotations

import numpy as np
import optax
import torch
from flax import nnx
from torch.nn import functional as F

from examples.zoo import inputs, llama_flax, llama_torch
from examples.zoo.configs import LlamaConfig

TINY = LlamaConfig()
BATCHES = 4
LR, BETAS, WEIGHT_DECAY, CLIP = 1e-3, (0.9, 0.95), 0.1, 1.0


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    """BATCHES batches of (input_ids (B, T) int64, attention_mask (B, T) int64: rows of 7, 5 and 2 real tokens)."""
    return [(inputs.token_ids(TINY.vocab_size, seed=seed), inputs.padding_mask()) for seed in range(BATCHES)]


def torch_loss(logits, input_ids, attention_mask):
    """(B, T, V) logits -> the mean cross-entropy of predicting each real token from the ones before."""
    keep = attention_mask[:, 1:].reshape(-1).to(logits.dtype)  # (B * (T - 1),)
    losses = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), input_ids[:, 1:].reshape(-1), reduction="none")
    return (losses * keep).sum() / keep.sum()


def flax_loss(logits, input_ids, attention_mask):
    """torch_loss in optax."""
    keep = attention_mask[:, 1:].astype(logits.dtype)  # (B, T - 1)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], input_ids[:, 1:])  # (B, T - 1)
    return (losses * keep).sum() / keep.sum()


def reference() -> dict:
    model = llama_torch.build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY)
    return {"model": model, "optimizer": optimizer, "loss": torch_loss, "inputs": batches(), "clip": CLIP}


def port() -> dict:
    tx = optax.chain(optax.clip_by_global_norm(CLIP), optax.adamw(LR, b1=BETAS[0], b2=BETAS[1], weight_decay=WEIGHT_DECAY))
    return {"model": llama_flax.Llama(TINY, dtype="float32", rngs=nnx.Rngs(0)), "optimizer": tx, "loss": flax_loss, "inputs": batches()}
