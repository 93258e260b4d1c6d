"""The choice of the next token from its logits, in NumPy, shared by every backend's generate:
the same logits and seed give the same tokens whatever framework computed the logits."""

from __future__ import annotations

import numpy as np


def next_tokens(logits: np.ndarray, greedy: bool, temperature: float, rng: np.random.Generator) -> np.ndarray:
    """logits (B, V) -> ids (B,): the argmax, or one draw from softmax(logits / temperature)."""
    logits = np.asarray(logits, dtype=np.float64)
    if greedy:
        return logits.argmax(axis=-1)  # (B,)
    scaled = logits / temperature  # (B, V)
    probs = np.exp(scaled - scaled.max(axis=-1, keepdims=True))  # (B, V)
    probs /= probs.sum(axis=-1, keepdims=True)
    # one uniform draw per row against the cumulative probabilities (inverse transform sampling)
    draws = rng.random((logits.shape[0],))  # (B,)
    return np.minimum((probs.cumsum(axis=-1) < draws[:, None]).sum(axis=-1), logits.shape[-1] - 1)  # (B,)
