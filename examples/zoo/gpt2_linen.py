"""The GPT-2-style model of gpt2_torch.py in Flax Linen, written the way the popular library writes
its own Flax GPT-2: submodules made in `setup`, the blocks named "0", "1", ... inside a module `h`
(so every path and parameter name is torch's), the tied output layer `wte.attend`. `mhsa
port-check` takes a Linen port as the pair (module, variables).

Conventions as in gpt2_flax.py (the NNX port). Linen-specific: the modules have no `dtype` of their
own, so they compute in the dtype of their parameters and inputs; variables come from
`module.init` (a fresh port) or from gpt2_convert.py (a converted one)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import linen as nn

from examples.zoo import inputs
from examples.zoo.configs import GPT2Config
from examples.zoo.convert import jax_dtype
from examples.zoo.gpt2_flax import CausalLMOutput

TINY = GPT2Config()


class Attention(nn.Module):
    """(B, T, D) -> (B, T, D): causal multi-head attention, one fused projection c_attn."""

    config: GPT2Config

    def setup(self):
        self.c_attn = nn.Dense(3 * self.config.d_model)
        self.c_proj = nn.Dense(self.config.d_model)

    def __call__(self, x):
        B, T, D = x.shape
        n_heads, d_head = self.config.n_heads, self.config.d_head
        q, k, v = jnp.split(self.c_attn(x), 3, axis=-1)  # 3 x (B, T, D)
        q, k, v = (t.reshape(B, T, n_heads, d_head).transpose(0, 2, 1, 3) for t in (q, k, v))  # (B, H, T, d_head)
        scores = (q @ k.swapaxes(-2, -1)) * jnp.asarray(1.0 / math.sqrt(d_head), x.dtype)  # (B, H, T, T)
        causal = jnp.tril(jnp.ones((T, T), dtype=bool))
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        context = jax.nn.softmax(scores, axis=-1) @ v  # (B, H, T, d_head)
        return self.c_proj(context.transpose(0, 2, 1, 3).reshape(B, T, D))  # (B, T, D)


class MLP(nn.Module):
    """(B, T, D) -> (B, T, D): widen 4x, tanh GELU, narrow, dropout."""

    config: GPT2Config

    def setup(self):
        self.c_fc = nn.Dense(4 * self.config.d_model)
        self.c_proj = nn.Dense(self.config.d_model)
        self.dropout = nn.Dropout(0.1, deterministic=True)

    def __call__(self, x):
        return self.dropout(self.c_proj(jax.nn.gelu(self.c_fc(x), approximate=True)))  # (B, T, D)


class Block(nn.Module):
    """(B, T, D) -> (B, T, D): pre-LayerNorm attention and MLP, each with a residual."""

    config: GPT2Config

    def setup(self):
        self.ln_1 = nn.LayerNorm(epsilon=self.config.layer_norm_epsilon)  # not Flax's 1e-6
        self.attn = Attention(self.config)
        self.ln_2 = nn.LayerNorm(epsilon=self.config.layer_norm_epsilon)
        self.mlp = MLP(self.config)

    def __call__(self, x):
        x = x + self.attn(self.ln_1(x))  # (B, T, D)
        return x + self.mlp(self.ln_2(x))  # (B, T, D)


class Blocks(nn.Module):
    """(B, T, D) -> every block's output, (B, T, D) each: the blocks named "0", "1", ... as torch's ModuleList."""

    config: GPT2Config

    def setup(self):
        self.blocks = [Block(self.config, name=str(i)) for i in range(self.config.n_layers)]

    def __call__(self, h):
        outputs = []
        for block in self.blocks:
            h = block(h)
            outputs.append(h)
        return tuple(outputs)


class GPT2Model(nn.Module):
    """input_ids (B, T) -> the hidden states, (B, T, D) each, the last after ln_f."""

    config: GPT2Config

    def setup(self):
        self.wte = nn.Embed(self.config.vocab_size, self.config.d_model)
        self.wpe = nn.Embed(self.config.n_positions, self.config.d_model)
        self.drop = nn.Dropout(0.1, deterministic=True)
        self.h = Blocks(self.config)
        self.ln_f = nn.LayerNorm(epsilon=self.config.layer_norm_epsilon)

    def __call__(self, input_ids):
        B, T = input_ids.shape
        positions = self.wpe(jnp.broadcast_to(jnp.arange(T), (B, T)))  # (B, T, D): per row
        h = self.drop(self.wte(input_ids) + positions)  # (B, T, D)
        hidden_states = [h] + list(self.h(h))
        return (*hidden_states[:-1], self.ln_f(hidden_states[-1]))


class GPT2LMHeadModel(nn.Module):
    """input_ids (B, T) -> CausalLMOutput(logits (B, T, V), hidden_states)."""

    config: GPT2Config = TINY

    def setup(self):
        self.transformer = GPT2Model(self.config)

    def __call__(self, input_ids):
        hidden_states = self.transformer(input_ids)
        return CausalLMOutput(logits=self.transformer.wte.attend(hidden_states[-1]), hidden_states=hidden_states)


def fresh(dtype: str = "float32"):
    """A port as built, `module.init`'s variables in `dtype`, and the reference's inputs, as
    (module, variables), inputs: a factory for `mhsa port-check`."""
    module, x = GPT2LMHeadModel(TINY), inputs.gpt2(TINY)
    variables = module.init(jax.random.key(0), *x)
    return (module, jax.tree.map(lambda leaf: jnp.asarray(leaf, jax_dtype(dtype)), variables)), x
