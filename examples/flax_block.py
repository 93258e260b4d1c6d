"""The pre-LayerNorm transformer block of examples/torch_block.py in Flax: once in NNX (with
this project's attention block) and once in Linen (whose attention, the same maths, is written
out here: the project's block is NNX); and factories for `mhsa port-check`.

Ported with care: LayerNorm eps 1e-5 (Flax's default is 1e-6), exact GELU (jax.nn.gelu's
default is tanh), dropout deterministic. The weights come from the torch model: `mhsa
port-check` transfers them, so the Flax initializers do not matter."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

# the same sizes and inputs as the torch twin
from examples.torch_block import TINY, D, H, T, example_inputs
from jax_impl.attention import MultiHeadSelfAttention
from jax_impl.model import from_exchange
from shared.weights import init_weights


class MLP(nnx.Module):
    """(B, T, D) -> (B, T, D): widen 4x, exact GELU, narrow, dropout."""

    def __init__(self, d_model, dropout=0.1, approximate=False, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(d_model, 4 * d_model, rngs=rngs)
        self.fc2 = nnx.Linear(4 * d_model, d_model, rngs=rngs)
        self.drop = nnx.Dropout(dropout, deterministic=True, rngs=rngs)
        self.approximate = approximate

    def __call__(self, x):
        return self.drop(self.fc2(jax.nn.gelu(self.fc1(x), approximate=self.approximate)))  # (B, T, D)


class Block(nnx.Module):
    """(B, T, D) -> (B, T, D): pre-LayerNorm attention and MLP, each with a residual."""

    def __init__(self, d_model=D, n_heads=H, max_len=T, dropout=0.1, eps=1e-5, approximate=False, *, rngs: nnx.Rngs):
        self.ln1 = nnx.LayerNorm(d_model, epsilon=eps, rngs=rngs)  # torch's default eps: 1e-5
        self.attn = MultiHeadSelfAttention(d_model, n_heads, max_len, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d_model, epsilon=eps, rngs=rngs)
        self.mlp = MLP(d_model, dropout, approximate, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))  # (B, T, D)
        return x + self.mlp(self.ln2(x))  # (B, T, D)


def block():
    """The NNX block and the torch twin's input batch: a factory for `mhsa port-check`."""
    return Block(rngs=nnx.Rngs(0)), example_inputs()


def naive_block():
    """What a first port often looks like: Flax's defaults kept, LayerNorm eps 1e-6 and the tanh
    GELU. `mhsa port-check examples.torch_block:block examples.flax_block:naive_block` names both."""
    return Block(eps=1e-6, approximate=True, rngs=nnx.Rngs(0)), example_inputs()


class LinenAttention(nn.Module):
    """(B, T, D) -> (B, T, D): the project's causal attention block, in Linen."""

    d_model: int
    n_heads: int

    def setup(self):
        self.qkv_proj = nn.Dense(3 * self.d_model)
        self.out_proj = nn.Dense(self.d_model)

    def __call__(self, x):
        B, T, D = x.shape
        d_head = D // self.n_heads
        q, k, v = jnp.split(self.qkv_proj(x), 3, axis=-1)  # 3 x (B, T, D)
        q, k, v = (t.reshape(B, T, self.n_heads, d_head).transpose(0, 2, 1, 3) for t in (q, k, v))  # (B, H, T, d_head)
        scores = (q * (1.0 / math.sqrt(d_head))) @ k.swapaxes(-2, -1)  # (B, H, T, T)
        scores = jnp.where(jnp.tril(jnp.ones((T, T), dtype=bool)), scores, -jnp.inf)
        context = jax.nn.softmax(scores, axis=-1) @ v  # (B, H, T, d_head)
        return self.out_proj(context.transpose(0, 2, 1, 3).reshape(B, T, D))  # (B, T, D)


class LinenMLP(nn.Module):
    d_model: int
    dropout: float = 0.1

    def setup(self):
        self.fc1 = nn.Dense(4 * self.d_model)
        self.fc2 = nn.Dense(self.d_model)
        self.drop = nn.Dropout(self.dropout, deterministic=True)

    def __call__(self, x):
        return self.drop(self.fc2(jax.nn.gelu(self.fc1(x), approximate=False)))  # (B, T, D)


class LinenBlock(nn.Module):
    """The same block in Linen; submodules named in setup so that paths match torch's."""

    d_model: int = D
    n_heads: int = H

    def setup(self):
        self.ln1 = nn.LayerNorm(epsilon=1e-5)
        self.attn = LinenAttention(self.d_model, self.n_heads)
        self.ln2 = nn.LayerNorm(epsilon=1e-5)
        self.mlp = LinenMLP(self.d_model)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))  # (B, T, D)
        return x + self.mlp(self.ln2(x))  # (B, T, D)


def linen_block():
    """The Linen block as (module, variables) and the input batch: a factory for `mhsa port-check`."""
    module, x = LinenBlock(), example_inputs()
    return (module, module.init(jax.random.key(0), x)), x


def tinylm():
    """This project's TinyLM from shared.weights.init_weights and the torch twin's token ids."""
    tokens = np.random.default_rng(0).integers(0, TINY.vocab_size, (3, TINY.max_len))
    return from_exchange(init_weights(TINY, seed=0), TINY), tokens
