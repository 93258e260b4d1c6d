"""Broken ports of the GPT-2 pair, each the faithful NNX (or Linen) port with the reference's
weights converted by gpt2_convert.py, and exactly one classic porting bug planted: a subclass that
overrides one method, a layer built with Flax's default, or a converter that does one step wrong.
examples/zoo/catalog.py lists them with the module where each must be found."""

from __future__ import annotations

import dataclasses
import inspect

import jax
from flax import linen as nn
from flax import nnx

from examples.zoo import gpt2_convert, gpt2_flax, gpt2_linen, inputs
from examples.zoo.configs import GPT2Config
from examples.zoo.convert import abstract, jax_dtype, linen_variables, load_nnx

TINY = GPT2Config()
FLAX_LN_EPS = inspect.signature(nnx.LayerNorm.__init__).parameters["epsilon"].default  # 1e-6 in flax 0.12
LINEN_LN_EPS = nn.LayerNorm.epsilon  # the same default in Linen


class ErfMLP(gpt2_flax.MLP):
    def __call__(self, x):
        """Exact (erf) GELU where the reference's "gelu_new" is the tanh approximation."""
        return self.dropout(self.c_proj(jax.nn.gelu(self.c_fc(x), approximate=False)))  # (B, T, D)


class OverDAttention(gpt2_flax.Attention):
    """Scores scaled by 1/d_head instead of 1/sqrt(d_head)."""

    def __init__(self, config: GPT2Config, *, dtype, rngs: nnx.Rngs):
        super().__init__(config, dtype=dtype, rngs=rngs)
        self.scale = 1.0 / config.d_head


class UntiedGPT2(gpt2_flax.GPT2LMHeadModel):
    """An output layer of its own, lm_head, filled from the reference's lm_head.weight: the same
    logits, but the embedding no longer learns from the output layer's gradient."""

    def __init__(self, config: GPT2Config = TINY, *, dtype: str = "float32", rngs: nnx.Rngs):
        super().__init__(config, dtype=dtype, rngs=rngs)
        self.lm_head = nnx.Linear(config.d_model, config.vocab_size, use_bias=False, dtype=jax_dtype(dtype), param_dtype=jax_dtype(dtype), rngs=rngs)

    def unembed(self, h):
        return self.lm_head(h)


def _port(dtype: str, config: GPT2Config = TINY, swap=None, cls=gpt2_flax.GPT2LMHeadModel) -> gpt2_flax.GPT2LMHeadModel:
    """The port of class `cls`, built abstractly, with `swap(model)` applied to it first."""
    return abstract(lambda: cls(config, dtype=dtype, rngs=nnx.Rngs(0)), swap)


def _ported(model, convert=gpt2_convert.to_flax):
    return load_nnx(model, gpt2_convert.reference_arrays(convert)), inputs.gpt2(TINY)


def layernorm_eps(dtype: str = "float32"):
    """Every LayerNorm built as nnx.LayerNorm(d) builds it: Flax's default epsilon, not 1e-5."""
    return _ported(_port(dtype, dataclasses.replace(TINY, layer_norm_epsilon=FLAX_LN_EPS)))


def layernorm_eps_linen(dtype: str = "float32"):
    """The same bug in the Linen port: nn.LayerNorm() with Linen's default epsilon."""
    module, x = gpt2_linen.GPT2LMHeadModel(dataclasses.replace(TINY, layer_norm_epsilon=LINEN_LN_EPS)), inputs.gpt2(TINY)
    return (module, linen_variables(module, x, gpt2_convert.reference_arrays(), dtype)), x


def gelu_erf(dtype: str = "float32"):
    """jax.nn.gelu(approximate=False) where the reference's GELU is the tanh one."""

    def swap(model):
        for block in model.transformer.h:
            block.mlp = ErfMLP(TINY, dtype=jax_dtype(dtype), rngs=nnx.Rngs(0))

    return _ported(_port(dtype, swap=swap))


def attention_scale(dtype: str = "float32"):
    """Attention scores scaled by 1/d_head instead of 1/sqrt(d_head)."""

    def swap(model):
        for block in model.transformer.h:
            block.attn = OverDAttention(TINY, dtype=jax_dtype(dtype), rngs=nnx.Rngs(0))

    return _ported(_port(dtype, swap=swap))


def transposes_conv1d(state, config: GPT2Config = TINY):
    """gpt2_convert.to_flax, except that attn.c_proj's Conv1D weight is transposed as if it were
    nn.Linear's: (D, D), so it fits."""
    arrays = gpt2_convert.to_flax(state, config)
    for i in range(config.n_layers):
        arrays[f"transformer.h.{i}.attn.c_proj.kernel"] = state[f"transformer.h.{i}.attn.c_proj.weight"].T
    return arrays


def conv1d_transposed(dtype: str = "float32"):
    """The faithful port, converted by a converter that transposes a square Conv1D weight."""
    return _ported(_port(dtype), transposes_conv1d)


def untied_converter(state, config: GPT2Config = TINY):
    """gpt2_convert.to_flax, and lm_head.weight converted once more, as a Linear of its own."""
    return gpt2_convert.to_flax(state, config) | {"lm_head.kernel": state["lm_head.weight"].T}  # (V, D) -> (D, V)


def untied_embeddings_grads(dtype: str = "float32"):
    """An untied output layer holding a copy of the embedding: the logits agree, the gradients do not."""
    return _ported(_port(dtype, cls=UntiedGPT2), untied_converter)
