"""Generation that no framework changes, shared by every backend's generate(): the loop over new
tokens, and the choice of the next token from its logits, in NumPy, so the same logits and seed
give the same tokens whatever framework computed the logits. A backend supplies its cache and
its forward steps: new_cache, and a step and predict that do not check the ids generate chose."""

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
    # the backend hands in a step and a predict that do not check again
    checks.check_generate(*request)
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


class NonFiniteLogitsError(ValueError):
    """The model's logits hold NaN or infinite values (weights large enough to overflow): no
    token can be chosen from them."""


def next_tokens(logits: np.ndarray, greedy: bool, temperature: float, rng: np.random.Generator) -> np.ndarray:
    """logits (B, V) -> ids (B,): the argmax, or one draw from softmax(logits / temperature), for
    every positive finite temperature: a tiny one is the argmax (ties drawn among equally), a huge
    one is uniform. NonFiniteLogitsError where a logit is NaN or infinite."""
    logits = np.asarray(logits, dtype=np.float64)
    if not np.isfinite(logits).all():
        rows = sorted({int(row) for row in np.argwhere(~np.isfinite(logits))[:, 0]})
        raise NonFiniteLogitsError(f"the logits of row(s) {rows} hold NaN or infinite values (the weights overflow): no token can be chosen")
    if greedy:
        return logits.argmax(axis=-1)  # (B,)
    # softmax in log space: each logit's gap to its row's largest, over T, is 0 for the largest and
    # <= 0 elsewhere, so a tiny T sends the others to -inf (probability 0: the argmax), where
    # logits / T would overflow to inf and inf - inf give NaN probabilities
    with np.errstate(over="ignore"):
        scaled = (logits - logits.max(axis=-1, keepdims=True)) / temperature  # (B, V), <= 0
    weights = np.exp(scaled)  # (B, V), the largest 1: unnormalized probabilities
    cumulative = weights.cumsum(axis=-1)  # (B, V)
    # one uniform draw per row against the cumulative weights (inverse transform sampling): the first
    # id whose cumulative weight exceeds the draw, never one of weight 0 (rounding at the top end)
    draws = rng.random((logits.shape[0],)) * cumulative[:, -1]  # (B,)
    chosen = (cumulative <= draws[:, None]).sum(axis=-1)  # (B,)
    last_possible = logits.shape[-1] - 1 - np.argmax(weights[:, ::-1] > 0, axis=-1)  # (B,)
    return np.minimum(chosen, last_possible)
