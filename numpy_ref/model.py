"""TinyLM forward and loss as pure NumPy functions over the exchange dict."""

from __future__ import annotations

import numpy as np

from numpy_ref.attention import attention, linear
from shared import checks
from shared.config import ModelConfig
from shared.weights import validate as validate_weights
from shared.trace import record


def forward(tokens, params, config: ModelConfig, mask=None, return_weights=False, trace=None):
    """tokens int (B, T) -> logits (B, T, V), or (logits, weights (B, H, T, T))."""
    validate_weights(params, config)  # a missing bias or a float16 array is an error, not a guess
    tokens = np.asarray(tokens)
    checks.check_tokens(
        tokens.shape, tokens.dtype.name, config.vocab_size, config.max_len,
        *((tokens.min(), tokens.max()) if tokens.size else (None, None)),
    )
    T = tokens.shape[1]

    # 1. embed: token identity plus learned position
    x = params["tok_emb.weight"][tokens] + params["pos_emb.weight"][:T]  # (B, T, D)
    record(trace, "embed", x)

    # 2. attend
    x, weights = attention(x, params, config.n_heads, mask=mask, return_weights=True, trace=trace)  # (B, T, D)

    # 3. read out the next token
    logits = linear(x, params["lm_head.weight"], params.get("lm_head.bias"))  # (B, T, V)
    record(trace, "logits", logits)
    return (logits, weights) if return_weights else logits


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Mean cross-entropy of logits (B, T, V) against int targets (B, T); a 0-d array."""
    shifted = logits - logits.max(axis=-1, keepdims=True)  # (B, T, V)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # (B, T, V)
    picked = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # (B, T)
    return -picked.mean()


def loss(params, tokens, targets, config: ModelConfig, mask=None) -> np.ndarray:
    """Copy-task loss: cross_entropy(forward(tokens), targets)."""
    return cross_entropy(forward(tokens, params, config, mask=mask), np.asarray(targets))


def intermediates(tokens, params, config: ModelConfig, mask=None) -> dict[str, np.ndarray]:
    """Every named stage of one forward pass (shared.trace.STAGES), recorded by `forward` itself."""
    trace = {}
    forward(tokens, params, config, mask=mask, trace=trace)
    return trace
