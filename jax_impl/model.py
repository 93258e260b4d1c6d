"""TinyLM in JAX/Flax NNX (embeddings -> attention -> LM head), its loss, its one exchange-format
converter, and the NumPy-facing functions of shared.protocol (predict, attend, loss_and_grads).
An id out of range under your own jit: docs/DESIGN.md, "Checks under jit" (checkify_ids).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jax_impl import compiled
from jax_impl.attention import DTYPES, MultiHeadSelfAttention, _concrete
from shared import checks, weights
from shared.config import ModelConfig
from shared.trace import record, tracing

if TYPE_CHECKING:  # the cache's module imports this one
    from jax_impl.generate import KVCache


class TinyLM(nnx.Module):
    """int tokens (B, T) -> logits (B, T, V). Its parameters map one to one onto the exchange names."""

    def __init__(self, config: ModelConfig, *, dtype: str = "float32", rngs: nnx.Rngs) -> None:
        self.config = config
        dtypes = {"dtype": DTYPES[dtype], "param_dtype": DTYPES[dtype]}
        self.tok_emb = nnx.Embed(config.vocab_size, config.d_model, **dtypes, rngs=rngs)
        self.pos_emb = nnx.Embed(config.max_len, config.d_model, **dtypes, rngs=rngs)
        self.attn = MultiHeadSelfAttention(
            config.d_model, config.n_heads, config.max_len, config.bias, dtype=dtype, attn_impl=config.attn_impl, rngs=rngs
        )
        self.lm_head = nnx.Linear(config.d_model, config.vocab_size, use_bias=config.bias, **dtypes, rngs=rngs)
        self.checkify_ids = False  # True: check() of traced tokens checks their ids with checkify (docs/DESIGN.md, "Checks under jit")

    def check(self, tokens: Any, mask: Any = None, cache: KVCache | None = None) -> None:
        """Refuse a bad call of the model in one line (shared.checks), before any work: integer
        tokens (B, T) with T <= max_len and every id in [0, V) (while jit traces the call the ids
        are not known: see checkify_ids); the cache must fit the chunk; the mask must be boolean and
        broadcast to (B, H, T, S). __call__ does not call it: the public functions (predict,
        loss_and_grads, generate.step) check their NumPy input with it once, and a trainer checks
        an epoch's batches before its steps; a caller of the model itself calls it first."""
        config = self.config
        checks.check_tokens(tuple(tokens.shape), str(tokens.dtype), config.vocab_size, config.max_len, *_id_range(tokens))
        if self.checkify_ids and isinstance(tokens, jax.core.Tracer):
            _checkify_ids(tokens, config.vocab_size)
        B, T = tokens.shape
        filled = None if cache is None else _concrete(cache.length[...])
        checks.check_cache_and_mask(B, T, str(self.tok_emb.embedding.dtype), config.n_heads, config.max_len, mask, cache, filled)

    def __call__(self, tokens: jax.Array, mask: Any = None, return_weights: bool = False, cache: KVCache | None = None) -> Any:
        """tokens int (B, T) -> logits (B, T, V), or (logits, weights (B, H, T, S)).

        With a KV cache (jax_impl.generate.KVCache) the tokens sit at positions p..p+T-1,
        p = cache.length, and the cache is extended by them; S = max_len (T without a cache)."""
        B, T = tokens.shape
        start = 0 if cache is None else cache.length[...]  # p: positions continue after the cached ones

        # 1. embed: token identity plus learned position
        positions = start + jnp.arange(T)  # (T,)
        x = self.tok_emb(tokens) + self.pos_emb(positions)  # (B, T, D)
        record(embed=x)

        # 2. attend
        attended = self.attn(x, mask=mask, return_weights=return_weights, cache=cache)
        x, weights = attended if return_weights else (attended, None)  # (B, T, D)

        # 3. read out the next token
        logits = self.lm_head(x)  # (B, T, V)
        record(logits=logits)
        return (logits, weights) if return_weights else logits


def _id_range(tokens):
    # the smallest and largest id, so that a bad id is named instead of being clamped or turned
    # into NaN silently; None while jit traces the call (predict and step check before their jit)
    return (None, None) if isinstance(tokens, jax.core.Tracer) else checks.id_range(tokens)


def _checkify_ids(tokens: jax.Array, vocab_size: int) -> None:
    # every id in [0, V) as a checkify.check: under the caller's checkify.checkify the first
    # bad id becomes an error with the eager call's message; without it, jit refuses to trace
    from jax.experimental import checkify  # only where asked for

    bad = jnp.where(jnp.any(tokens < 0), jnp.min(tokens), jnp.max(tokens))
    checkify.check(jnp.all((tokens >= 0) & (tokens < vocab_size)), checks.token_id_error("{bad}", vocab_size), bad=bad)


# exchange name -> (path of the nnx variable, whether the array is transposed on the way)
# torch Linear weights are (out, in); nnx.Linear kernels are (in, out)
LAYOUT = {
    "tok_emb.weight": (("tok_emb", "embedding"), False),
    "pos_emb.weight": (("pos_emb", "embedding"), False),
    "attn.qkv_proj.weight": (("attn", "qkv_proj", "kernel"), True),
    "attn.qkv_proj.bias": (("attn", "qkv_proj", "bias"), False),
    "attn.out_proj.weight": (("attn", "out_proj", "kernel"), True),
    "attn.out_proj.bias": (("attn", "out_proj", "bias"), False),
    "lm_head.weight": (("lm_head", "kernel"), True),
    "lm_head.bias": (("lm_head", "bias"), False),
}


def _variable(tree, path):
    # a TinyLM, or an nnx.State of the same structure such as the gradients from nnx.grad
    for name in path:
        tree = getattr(tree, name, None)
    return tree


def from_exchange(arrays: dict[str, np.ndarray], config: ModelConfig) -> TinyLM:
    """A TinyLM holding the exchange arrays, in their dtype. Everything is checked before
    anything is assigned (nnx.update checks no shapes); linear weights are transposed here."""
    dtype = weights.validate(arrays, config)
    if dtype == "float64":
        jax.config.update("jax_enable_x64", True)  # off by default: float64 would silently become float32
    model = compiled.zeros_model(TinyLM, MultiHeadSelfAttention, config, dtype)
    assign_exchange(model, arrays)
    return model


def assign_exchange(tree: nnx.Module | nnx.State, arrays: dict[str, np.ndarray]) -> None:
    """Write exchange arrays into a TinyLM, or into a State shaped like its parameters (such
    as Adam's moments), transposing linear weights; every shape is checked before any write."""
    values = {}
    for name, value in arrays.items():
        path, transposed = LAYOUT[name]
        value = value.T if transposed else value
        expected = _variable(tree, path)[...].shape
        if expected != value.shape:  # `[...] =` would broadcast a compatible shape
            raise ValueError(f"weights['{name}'] becomes {value.shape} in Flax, expected {expected}")
        values[name] = value
    for name, value in values.items():
        # contiguous first: jnp.asarray of a transposed NumPy view compiles a transpose per shape
        _variable(tree, LAYOUT[name][0])[...] = jax.device_put(np.ascontiguousarray(value))


def to_exchange(model: TinyLM) -> dict[str, np.ndarray]:
    """The model's parameters as exchange arrays (copies, in the model's dtype, PyTorch layout)."""
    return _exchange_arrays(model)


def grads_to_exchange(grads: nnx.State) -> dict[str, np.ndarray]:
    """Gradients from nnx.grad(loss_fn)(model, ...), or any State shaped like the parameters
    (Adam's moments), as exchange arrays in PyTorch layout."""
    return _exchange_arrays(grads)


def _exchange_arrays(tree) -> dict[str, np.ndarray]:
    arrays = {}
    for name, (path, transposed) in LAYOUT.items():
        variable = _variable(tree, path)
        if variable is None:  # no bias when config.bias is False
            continue
        value = np.array(variable[...])
        arrays[name] = value.T.copy() if transposed else value
    return arrays


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean cross-entropy of logits (B, T, V) against int targets (B, T) -> scalar."""
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    ).mean()  # (B * T, V) against (B * T,)


def loss_fn(model: TinyLM, x: jax.Array, y: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean cross-entropy of the next-token logits: x, y int (B, T) -> scalar."""
    logits = model(x, mask=mask)  # (B, T, V)
    return cross_entropy(logits, y)


def predict(
    model: TinyLM, tokens: np.ndarray, *, mask: np.ndarray | None = None, return_weights: bool = False, trace: dict[str, np.ndarray] | None = None
) -> Any:
    """NumPy in, NumPy out: tokens (B, T) -> logits (B, T, V), or (logits, weights (B, H, T, T)).
    trace, a dict, receives every stage of shared.trace.STAGES."""
    tokens, mask = np.asarray(tokens), _array(mask)
    model.check(tokens, mask)  # the call's one check, here: under jit the ids are not known
    if trace is not None:  # eagerly: the trace holds concrete arrays
        stages: dict[str, jax.Array] = {}
        with tracing(stages):
            result = model(jnp.asarray(tokens), mask=mask, return_weights=return_weights)
        trace.update({name: np.asarray(value) for name, value in stages.items()})
    else:  # compiled as one program (eagerly, each of its ~40 operations compiles on first use)
        result = _forward(*nnx.split(model), tokens, mask, return_weights)
    return tuple(np.asarray(value) for value in result) if return_weights else np.asarray(result)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _forward(graphdef, state, tokens, mask, return_weights):
    return nnx.merge(graphdef, state)(tokens, mask=mask, return_weights=return_weights)


def attend(model: TinyLM, x: np.ndarray, *, mask: np.ndarray | None = None, return_weights: bool = False) -> Any:
    """NumPy in, NumPy out: the attention block alone, x (B, T, D) -> (B, T, D), or (out, weights)."""
    x, mask = np.asarray(x), _array(mask)
    model.attn.check(x, mask)  # the call's one check, on the NumPy input, before any conversion
    result = model.attn(jnp.asarray(x), mask=mask, return_weights=return_weights)
    return tuple(np.asarray(value) for value in result) if return_weights else np.asarray(result)


def loss_and_grads(model: TinyLM, tokens: np.ndarray, targets: np.ndarray, *, mask: np.ndarray | None = None) -> tuple[float, dict[str, np.ndarray]]:
    """NumPy in, NumPy out: (loss, d loss / d every exchange array) by jax.grad."""
    tokens, mask = np.asarray(tokens), _array(mask)
    model.check(tokens, mask)  # the call's one check, here: under jit the ids are not known
    loss, grads = _value_and_grad(model, jnp.asarray(tokens), jnp.asarray(targets), mask)
    return float(loss), grads_to_exchange(grads)


# compiled as one function: op by op, each of the ~100 operations of forward and backward
# would compile on its own for every new shape; the maths is the same
_value_and_grad = nnx.jit(nnx.value_and_grad(loss_fn))


def _array(mask):
    # a mask as NumPy (any array-like of bool): checked, then converted once, as the tokens are
    return None if mask is None else np.asarray(mask)
