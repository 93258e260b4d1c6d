"""TinyLM forward and loss as pure NumPy functions over the exchange dict, and the model
object of shared.protocol: numpy_ref's TinyLM is its exchange dict and its config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from numpy_ref.attention import attention, linear
from shared import checks
from shared.config import ModelConfig
from shared.trace import record, tracing
from shared.weights import validate as validate_weights

if TYPE_CHECKING:  # the cache's module imports this one
    from numpy_ref.generate import KVCache


def check_forward(tokens: Any, params: dict[str, np.ndarray], config: ModelConfig, mask: Any = None, cache: KVCache | None = None) -> None:
    """Refuse a bad call of `forward` in one line, before any work: the weights (shared.weights,
    a missing bias or a float16 array is an error, not a guess), then the tokens, cache and mask
    as TinyLM.check checks them. `forward` does not call it: its caller checks once."""
    validate_weights(params, config)
    _check_call(tokens, params, config, mask, cache)


def _check_call(tokens: Any, params: dict[str, np.ndarray], config: ModelConfig, mask: Any = None, cache: KVCache | None = None) -> None:
    """A call on weights already checked (a TinyLM's): integer tokens (B, T) with T <= max_len
    and every id in [0, V); the cache must fit the chunk; the mask must be boolean and broadcast
    to (B, H, T, S)."""
    tokens = np.asarray(tokens)
    checks.check_tokens(tokens.shape, tokens.dtype.name, config.vocab_size, config.max_len, *checks.id_range(tokens))
    B, T = tokens.shape
    filled = None if cache is None else cache.length
    checks.check_cache_and_mask(B, T, params["tok_emb.weight"].dtype.name, config.n_heads, config.max_len, mask, cache, filled)


def forward(
    tokens: Any, params: dict[str, np.ndarray], config: ModelConfig, mask: Any = None, return_weights: bool = False, cache: KVCache | None = None
) -> Any:
    """tokens int (B, T) -> logits (B, T, V), or (logits, weights (B, H, T, S)).

    With a KV cache (numpy_ref.generate.KVCache) the tokens sit at positions p..p+T-1,
    p = cache.length, and the cache is extended by them; S = max_len (T without a cache)."""
    tokens = np.asarray(tokens)
    B, T = tokens.shape
    start = 0 if cache is None else cache.length  # p: positions continue after the cached ones

    # 1. embed: token identity plus learned position
    x = params["tok_emb.weight"][tokens] + params["pos_emb.weight"][start : start + T]  # (B, T, D)
    record(embed=x)

    # 2. attend
    x, weights = attention(x, params, config.n_heads, mask=mask, return_weights=True, cache=cache)  # (B, T, D)

    # 3. read out the next token
    logits = linear(x, params["lm_head.weight"], params.get("lm_head.bias"))  # (B, T, V)
    record(logits=logits)
    return (logits, weights) if return_weights else logits


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Mean cross-entropy of logits (B, T, V) against int targets (B, T); a 0-d array."""
    shifted = logits - logits.max(axis=-1, keepdims=True)  # (B, T, V)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # (B, T, V)
    picked = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # (B, T)
    return -picked.mean()


def loss(params: dict[str, np.ndarray], tokens: Any, targets: Any, config: ModelConfig, mask: Any = None) -> np.ndarray:
    """Copy-task loss: cross_entropy(forward(tokens), targets)."""
    return cross_entropy(forward(tokens, params, config, mask=mask), np.asarray(targets))


def intermediates(tokens: Any, params: dict[str, np.ndarray], config: ModelConfig, mask: Any = None) -> dict[str, np.ndarray]:
    """Every named stage of one forward pass (shared.trace.STAGES), recorded by `forward` itself."""
    trace: dict[str, np.ndarray] = {}
    with tracing(trace):
        forward(tokens, params, config, mask=mask)
    return trace


@dataclass(frozen=True, eq=False)
class TinyLM:
    """The exchange dict (PyTorch layout) with its config; calling it runs `forward`.

    int tokens (B, T) -> logits (B, T, V), or (logits, weights (B, H, T, T)). The weights are
    checked once, here, as a framework checks its layers when the model is built; training
    then updates them in place (same shapes, same dtype) without checking them at every step."""

    config: ModelConfig
    params: dict[str, np.ndarray]

    def __post_init__(self) -> None:
        validate_weights(self.params, self.config)

    def check(self, tokens: Any, mask: Any = None, cache: KVCache | None = None) -> None:
        """Refuse a bad call of the model in one line (shared.checks), before any work (_check_call:
        the weights were checked when the model was built). __call__ does not call it: the public
        functions (predict, loss_and_grads, generate.step) check their input with it once, and a
        trainer checks an epoch's batches before its steps; a caller of the model itself calls it first."""
        _check_call(tokens, self.params, self.config, mask, cache)

    def __call__(self, tokens: Any, mask: Any = None, return_weights: bool = False, cache: KVCache | None = None) -> Any:
        # weights that overflow give inf and NaN unwarned, as in torch and JAX: the caller names them
        with np.errstate(over="ignore", invalid="ignore"):
            return forward(tokens, self.params, self.config, mask, return_weights, cache)


def from_exchange(arrays: dict[str, np.ndarray], config: ModelConfig) -> TinyLM:
    """A TinyLM holding copies of the exchange arrays, checked first."""
    validate_weights(arrays, config)
    return TinyLM(config, {name: np.array(value) for name, value in arrays.items()})


def to_exchange(model: TinyLM) -> dict[str, np.ndarray]:
    """The model's parameters as exchange arrays (copies)."""
    return {name: value.copy() for name, value in model.params.items()}


def loss_fn(model: TinyLM, x: Any, y: Any, mask: Any = None) -> np.ndarray:
    """Mean cross-entropy of the next-token logits: x, y int (B, T) -> 0-d array."""
    return loss(model.params, x, y, model.config, mask=mask)


def predict(model: TinyLM, tokens: Any, *, mask: Any = None, return_weights: bool = False, trace: dict[str, np.ndarray] | None = None) -> Any:
    """tokens (B, T) -> logits (B, T, V), or (logits, weights (B, H, T, T)); NumPy already.
    trace, a dict, receives every stage of shared.trace.STAGES."""
    tokens = np.asarray(tokens)
    model.check(tokens, mask)  # the call's one check
    with tracing(trace):
        return model(tokens, mask=mask, return_weights=return_weights)


def attend(model: TinyLM, x: Any, *, mask: Any = None, return_weights: bool = False) -> Any:
    """The attention block alone: x (B, T, D) -> (B, T, D), or (out, weights); T <= max_len
    as in the frameworks' blocks (the pure `attention` function has no context limit)."""
    x = np.asarray(x)
    _check_attend(model, x, mask)  # the call's one check
    with np.errstate(over="ignore", invalid="ignore"):  # as TinyLM's call
        return attention(x, model.params, model.config.n_heads, mask=mask, return_weights=return_weights)


def _check_attend(model: TinyLM, x: np.ndarray, mask: Any) -> None:
    # the block's checks with the model's context limit
    config = model.config
    checks.check_input(x.shape, x.dtype.name, config.d_model, config.max_len, model.params["attn.qkv_proj.weight"].dtype.name)
    if mask is not None:
        checks.check_mask(*checks.layout(mask), (x.shape[0], config.n_heads, x.shape[1], x.shape[1]))


def grads_to_exchange(grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Gradients from loss_and_grads (already exchange-named NumPy arrays) as copies."""
    return {name: value.copy() for name, value in grads.items()}


def loss_and_grads(model: TinyLM, tokens: Any, targets: Any, *, mask: Any = None) -> tuple[float, dict[str, np.ndarray]]:
    """NumPy in, NumPy out: (loss, d loss / d every exchange array) by the analytic backward
    of numpy_ref.backward, from the stages one forward pass records."""
    from numpy_ref.backward import backward

    tokens = np.asarray(tokens)
    model.check(tokens, mask)  # the call's one check
    trace: dict[str, np.ndarray] = {}
    with tracing(trace):
        model(tokens, mask=mask)
    loss, grads = backward(tokens, targets, model.params, model.config, trace, mask=mask)
    return float(loss), grads
