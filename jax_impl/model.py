"""TinyLM in JAX/Flax NNX (embeddings -> attention -> LM head), its loss, its one exchange-format
converter, and the NumPy-facing functions of shared.protocol (predict, attend, loss_and_grads)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jax_impl.attention import DTYPES, MultiHeadSelfAttention, _concrete
from shared import checks, weights
from shared.config import ModelConfig
from shared.trace import record

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

    def __call__(
        self,
        tokens: jax.Array,
        mask: jax.Array | None = None,
        return_weights: bool = False,
        trace: dict[str, Any] | None = None,
        cache: KVCache | None = None,
    ) -> Any:
        """tokens int (B, T) -> logits (B, T, V), or (logits, weights (B, H, T, S)).

        With a KV cache (jax_impl.generate.KVCache) the tokens sit at positions p..p+T-1,
        p = cache.length, and the cache is extended by them; S = max_len (T without a cache)."""
        checks.check_tokens(
            tuple(tokens.shape),
            str(tokens.dtype),
            self.config.vocab_size,
            self.config.max_len,
            *_id_range(tokens),
        )
        B, T = tokens.shape
        start = 0 if cache is None else cache.length[...]  # p: positions continue after the cached ones
        if cache is not None:
            checks.check_cache(B, str(self.tok_emb.embedding.dtype), cache.k.shape[0], str(cache.k.dtype), _concrete(start), T, self.config.max_len)

        # 1. embed: token identity plus learned position
        positions = start + jnp.arange(T)  # (T,)
        x = self.tok_emb(tokens) + self.pos_emb(positions)  # (B, T, D)
        record(trace, "embed", x)

        # 2. attend
        attended = self.attn(x, mask=mask, return_weights=return_weights, trace=trace, cache=cache)
        x, weights = attended if return_weights else (attended, None)  # (B, T, D)

        # 3. read out the next token
        logits = self.lm_head(x)  # (B, T, V)
        record(trace, "logits", logits)
        return (logits, weights) if return_weights else logits


def _id_range(tokens):
    # the smallest and largest id, so that a bad id is named instead of being clamped or
    # turned into NaN silently; inside jit the ids are not known (predict checks them before
    # its jit; the trainer's copy-task data is generated in range and not checked per step)
    if tokens.size == 0 or isinstance(tokens, jax.core.Tracer) or checks.dtype_kind(str(tokens.dtype)) != "int":
        return None, None
    return int(tokens.min()), int(tokens.max())


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
    model = _empty(config, dtype)
    assign_exchange(model, arrays)
    return model


def _empty(config: ModelConfig, dtype: str) -> TinyLM:
    """A TinyLM with zero parameters for from_exchange to fill, built without running the random
    initializers whose draws would only be overwritten (compiling them was a large share of the JAX
    demo's start-up, see benchmarks/RESULTS.md): nnx.eval_shape gives the structure, and what is not a parameter (the causal mask) comes
    from the real constructor, compiled with the initializers cut away, once per config."""
    # two filters give three parts; the stub types split's result as a variadic tuple
    graphdef, params, rest = nnx.split(nnx.eval_shape(lambda: TinyLM(config, dtype=dtype, rngs=nnx.Rngs(0))), nnx.Param, ...)  # type: ignore[misc]
    # jax.device_put, not jnp.asarray: on an nnx.State leaf the latter compiles a program per shape
    params = jax.tree.map(lambda leaf: jax.device_put(np.zeros(leaf.shape, leaf.dtype)), params)
    # fresh arrays for every model: a trainer donates its state, which deletes the buffers
    nnx.replace_by_pure_dict(rest, jax.tree.map(lambda buffer: jax.device_put(buffer.copy()), _buffers(config, dtype, MultiHeadSelfAttention)))
    return nnx.merge(graphdef, params, rest)


@functools.lru_cache(maxsize=64)
def _buffers(config: ModelConfig, dtype: str, block) -> dict:
    """The state of a fresh TinyLM that is not a parameter, as a pure dict of NumPy arrays. `block`,
    the attention class TinyLM builds, is part of the key: a block swapped in is built anew."""
    compiled = jax.jit(lambda: nnx.state(TinyLM(config, dtype=dtype, rngs=nnx.Rngs(0)), nnx.Not(nnx.Param)))
    return jax.tree.map(np.asarray, nnx.to_pure_dict(compiled()))


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


def loss_fn(model: TinyLM, x: jax.Array, y: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean cross-entropy of the next-token logits: x, y int (B, T) -> scalar."""
    logits = model(x, mask=mask)  # (B, T, V)
    return optax.softmax_cross_entropy_with_integer_labels(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).mean()  # (B * T, V) against (B * T,)


def predict(
    model: TinyLM, tokens: np.ndarray, *, mask: np.ndarray | None = None, return_weights: bool = False, trace: dict[str, np.ndarray] | None = None
) -> Any:
    """NumPy in, NumPy out: tokens (B, T) -> logits (B, T, V), or (logits, weights (B, H, T, T))."""
    tokens = np.asarray(tokens)
    if trace is not None:  # eagerly: the trace holds concrete arrays
        inner: dict[str, jax.Array] = {}
        result = model(jnp.asarray(tokens), mask=_array(mask), return_weights=return_weights, trace=inner)
        trace.update({name: np.asarray(value) for name, value in inner.items()})
    else:
        # compiled as one program (eagerly, each of its ~40 operations compiles on first use)
        _check_before_jit(model, tokens, mask)
        result = _forward(*nnx.split(model), tokens, _array(mask), return_weights)
    return tuple(np.asarray(value) for value in result) if return_weights else np.asarray(result)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _forward(graphdef, state, tokens, mask, return_weights):
    return nnx.merge(graphdef, state)(tokens, mask=mask, return_weights=return_weights)


def attend(model: TinyLM, x: np.ndarray, *, mask: np.ndarray | None = None, return_weights: bool = False) -> Any:
    """NumPy in, NumPy out: the attention block alone, x (B, T, D) -> (B, T, D), or (out, weights)."""
    x = np.asarray(x)  # checked before conversion, as in torch_impl
    checks.check_input(x.shape, x.dtype.name, model.attn.d_model, model.attn.max_len, str(model.attn.qkv_proj.kernel.dtype))
    result = model.attn(jnp.asarray(x), mask=_array(mask), return_weights=return_weights)
    return tuple(np.asarray(value) for value in result) if return_weights else np.asarray(result)


def loss_and_grads(model: TinyLM, tokens: np.ndarray, targets: np.ndarray, *, mask: np.ndarray | None = None) -> tuple[float, dict[str, np.ndarray]]:
    """NumPy in, NumPy out: (loss, d loss / d every exchange array) by jax.grad."""
    # compiled as one function: op by op, each of the ~100 operations of forward and backward
    # would compile on its own for every new shape; the maths is the same
    tokens = np.asarray(tokens)
    _check_before_jit(model, tokens, mask)
    loss, grads = _value_and_grad(model, jnp.asarray(tokens), jnp.asarray(targets), _array(mask))
    return float(loss), grads_to_exchange(grads)


_value_and_grad = nnx.jit(nnx.value_and_grad(loss_fn))


def _check_before_jit(model, tokens: np.ndarray, mask) -> None:
    # under jit the model sees only tracers: ids out of range would be clamped or turn into
    # NaN silently, and an error raised while tracing would carry JAX's traceback note
    checks.check_tokens(tokens.shape, str(tokens.dtype), model.config.vocab_size, model.config.max_len, *_id_range(tokens))
    if mask is not None:
        B, T = tokens.shape
        checks.check_mask(np.shape(mask), str(np.asarray(mask).dtype), (B, model.config.n_heads, T, T))


def _array(mask):
    return None if mask is None else jnp.asarray(mask)
