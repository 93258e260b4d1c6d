"""The GPT-2-style model of gpt2_torch.py in Flax NNX: a faithful port, module for module and name
for name (gpt2_linen.py is the same port in Linen).

What differs between the two sides, and why it is still the same model:
- Conv1D becomes nnx.Linear: both hold the weight (in, out), so gpt2_convert.py copies it as it is.
- The position embeddings are looked up per row, (B, T, D), where torch broadcasts (1, T, D):
  the same numbers (as the popular library's own Flax GPT-2 does).
- GELU is jax.nn.gelu(approximate=True), inline: Flax has no GELU module, and torch's "tanh" GELU
  is this one. LayerNorm's eps is passed explicitly (Flax's default is 1e-6).
- The tied output layer is transformer.wte.attend(h): there is no lm_head, so torch's
  lm_head.weight (the same tensor as wte's) has no variable of its own here.
- The output is a flax.struct.dataclass (a pytree, as JAX transformations need), torch's a plain
  dataclass, with the same fields.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx, struct

from examples.zoo import inputs
from examples.zoo.configs import GPT2Config, gpt2_small
from examples.zoo.convert import jax_dtype

TINY = GPT2Config()


@struct.dataclass
class CausalLMOutput:
    """logits (B, T, V) and the hidden states, (B, T, D) each, as in gpt2_torch.CausalLMOutput."""

    logits: jax.Array
    hidden_states: tuple[jax.Array, ...]


class Attention(nnx.Module):
    """(B, T, D) -> (B, T, D): causal multi-head attention, one fused projection c_attn."""

    def __init__(self, config: GPT2Config, *, dtype, rngs: nnx.Rngs):
        self.n_heads, self.d_head = config.n_heads, config.d_head
        self.c_attn = nnx.Linear(config.d_model, 3 * config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.c_proj = nnx.Linear(config.d_model, config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.scale = 1.0 / math.sqrt(config.d_head)

    def __call__(self, x):
        B, T, D = x.shape
        q, k, v = jnp.split(self.c_attn(x), 3, axis=-1)  # 3 x (B, T, D)
        q, k, v = (t.reshape(B, T, self.n_heads, self.d_head).transpose(0, 2, 1, 3) for t in (q, k, v))  # (B, H, T, d_head)
        scores = (q @ k.swapaxes(-2, -1)) * jnp.asarray(self.scale, x.dtype)  # (B, H, T, T)
        causal = jnp.tril(jnp.ones((T, T), dtype=bool))
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        context = jax.nn.softmax(scores, axis=-1) @ v  # (B, H, T, d_head)
        return self.c_proj(context.transpose(0, 2, 1, 3).reshape(B, T, D))  # (B, T, D)


class MLP(nnx.Module):
    """(B, T, D) -> (B, T, D): widen 4x, tanh GELU, narrow, dropout."""

    def __init__(self, config: GPT2Config, *, dtype, rngs: nnx.Rngs):
        self.c_fc = nnx.Linear(config.d_model, 4 * config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.c_proj = nnx.Linear(4 * config.d_model, config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.dropout = nnx.Dropout(0.1, deterministic=True)  # off, as the reference in eval mode: no rngs needed

    def __call__(self, x):
        return self.dropout(self.c_proj(jax.nn.gelu(self.c_fc(x), approximate=True)))  # (B, T, D)


def layer_norm(config: GPT2Config, *, dtype, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(config.d_model, epsilon=config.layer_norm_epsilon, dtype=dtype, param_dtype=dtype, rngs=rngs)  # not Flax's 1e-6


class Block(nnx.Module):
    """(B, T, D) -> (B, T, D): pre-LayerNorm attention and MLP, each with a residual."""

    def __init__(self, config: GPT2Config, *, dtype, rngs: nnx.Rngs):
        self.ln_1 = layer_norm(config, dtype=dtype, rngs=rngs)
        self.attn = Attention(config, dtype=dtype, rngs=rngs)
        self.ln_2 = layer_norm(config, dtype=dtype, rngs=rngs)
        self.mlp = MLP(config, dtype=dtype, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln_1(x))  # (B, T, D)
        return x + self.mlp(self.ln_2(x))  # (B, T, D)


class GPT2Model(nnx.Module):
    """input_ids (B, T) -> the hidden states, (B, T, D) each, the last after ln_f."""

    def __init__(self, config: GPT2Config, *, dtype, rngs: nnx.Rngs):
        self.wte = nnx.Embed(config.vocab_size, config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.wpe = nnx.Embed(config.n_positions, config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.drop = nnx.Dropout(0.1, deterministic=True)
        self.h = nnx.List([Block(config, dtype=dtype, rngs=rngs) for _ in range(config.n_layers)])
        self.ln_f = layer_norm(config, dtype=dtype, rngs=rngs)

    def __call__(self, input_ids):
        B, T = input_ids.shape
        positions = self.wpe(jnp.broadcast_to(jnp.arange(T), (B, T)))  # (B, T, D): per row
        h = self.drop(self.wte(input_ids) + positions)  # (B, T, D)
        hidden_states = [h]
        for block in self.h:
            h = block(h)
            hidden_states.append(h)
        hidden_states[-1] = self.ln_f(h)
        return tuple(hidden_states)


class GPT2LMHeadModel(nnx.Module):
    """input_ids (B, T) -> CausalLMOutput(logits (B, T, V), hidden_states)."""

    def __init__(self, config: GPT2Config = TINY, *, dtype: str = "float32", rngs: nnx.Rngs):
        self.transformer = GPT2Model(config, dtype=jax_dtype(dtype), rngs=rngs)

    def unembed(self, h):
        """(B, T, D) -> (B, T, V): the tied output layer."""
        return self.transformer.wte.attend(h)

    def __call__(self, input_ids):
        hidden_states = self.transformer(input_ids)
        return CausalLMOutput(logits=self.unembed(hidden_states[-1]), hidden_states=hidden_states)


def fresh(dtype: str = "float32"):
    """A port as built, Flax's initializers, and the reference's inputs: a factory for `mhsa port-check`."""
    return GPT2LMHeadModel(TINY, dtype=dtype, rngs=nnx.Rngs(0)), inputs.gpt2(TINY)


def small(batch: int = 1, length: int = 1024):
    """GPT-2 small's shape as a fresh port, and gpt2_torch.small's inputs: for benchmarks."""
    config = gpt2_small()
    return GPT2LMHeadModel(config, rngs=nnx.Rngs(0)), inputs.gpt2(config, (batch, length))
