"""Generation that no framework changes, shared by every backend's generate(): the loop over new
tokens, and the choice of the next token from its logits, in NumPy, so the same logits and seed
give the same tokens whatever framework computed the logits. A backend supplies its cache and
its forward steps (new_cache, step, predict of shared.protocol)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from shared import checks


def generate(
    model: Any,
    prompt: np.ndarray,
    max_new_tokens: int,
    new_cache: Callable[[Any, int], Any],
    step: Callable[[Any, np.ndarray, Any], np.ndarray],
    predict: Callable[[Any, np.ndarray], np.ndarray],
    *,
    greedy: bool = True,
    temperature: float = 1.0,
    seed: int = 0,
    use_cache: bool = True,
) -> np.ndarray:
    """prompt int (B, P) -> (B, P + max_new_tokens) with a backend's new_cache, step and predict;
    the arguments after `*` as in the backends' generate()."""
    prompt = np.asarray(prompt)
    config = model.config
    low, high = (prompt.min(), prompt.max()) if prompt.size else (None, None)  # an empty prompt is refused by the check
    request = (prompt.shape, prompt.dtype.name, config.vocab_size, config.max_len, max_new_tokens, low, high, greedy, temperature)
    # checked once, here: every later call reads ids it picked from [0, V) and fits max_len, so
    # step and predict skip their own checks (shared.checks.entry)
    with checks.entry(checks.check_generate, *request):
        rng = np.random.default_rng(seed)
        cache = new_cache(model, prompt.shape[0]) if use_cache else None
        tokens = prompt  # (B, P)
        chunk = prompt  # what the next call reads: the whole prompt first, then the newest token

        for _ in range(max_new_tokens):
            # 1. forward: with a cache only the new positions, without one the whole prefix again
            logits = step(model, chunk, cache) if cache is not None else predict(model, tokens)  # (B, t, V)

            # 2. pick the next token from the last position's logits
            chosen = next_tokens(logits[:, -1], greedy, temperature, rng).astype(prompt.dtype)  # (B,)
            tokens = np.concatenate([tokens, chosen[:, None]], axis=1)  # (B, t + 1)
            chunk = chosen[:, None]  # (B, 1)
    return tokens


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
