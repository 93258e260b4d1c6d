"""The pre-LayerNorm transformer block of examples/torch_block.py in Equinox, written as Equinox code
is: each module takes one example, (T, D), and the port check calls it per example under
jax.vmap; and factories for `mhsa port-check`.

Ported with care: LayerNorm eps 1e-5 (Equinox's default too), exact GELU (jax.nn.gelu's default
is tanh), dropout off, Linear weights (out, in) as torch's, the same qkv_proj / out_proj names as the project's
attention block. The weights come from the torch model: `mhsa port-check` transfers them, so
Equinox's initializers do not matter. Needs the equinox extra: pip install -e ".[equinox]"."""

from __future__ import annotations

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp

# the same sizes and inputs as the torch twin
from examples.torch_block import D, H, example_inputs


class Attention(eqx.Module):
    """(T, D) -> (T, D): the project's causal attention block, one fused QKV projection."""

    qkv_proj: eqx.nn.Linear
    out_proj: eqx.nn.Linear
    n_heads: int = eqx.field(static=True)

    def __init__(self, d_model: int, n_heads: int, *, key):
        k1, k2 = jax.random.split(key)
        self.qkv_proj = eqx.nn.Linear(d_model, 3 * d_model, key=k1)
        self.out_proj = eqx.nn.Linear(d_model, d_model, key=k2)
        self.n_heads = n_heads

    def __call__(self, x):
        T, D = x.shape
        d_head = D // self.n_heads
        q, k, v = jnp.split(jax.vmap(self.qkv_proj)(x), 3, axis=-1)  # 3 x (T, D)
        q, k, v = (t.reshape(T, self.n_heads, d_head).transpose(1, 0, 2) for t in (q, k, v))  # (H, T, d_head)
        scores = (q * (1.0 / math.sqrt(d_head))) @ k.swapaxes(-2, -1)  # (H, T, T)
        scores = jnp.where(jnp.tril(jnp.ones((T, T), dtype=bool)), scores, -jnp.inf)
        context = jax.nn.softmax(scores, axis=-1) @ v  # (H, T, d_head)
        return jax.vmap(self.out_proj)(context.transpose(1, 0, 2).reshape(T, D))  # (T, D)


class MLP(eqx.Module):
    """(D,) -> (D,): widen 4x, GELU (an eqx.nn.Lambda, so that the lint reads its approximation),
    narrow, dropout (off: inference=True)."""

    fc1: eqx.nn.Linear
    act: eqx.nn.Lambda
    fc2: eqx.nn.Linear
    drop: eqx.nn.Dropout

    def __init__(self, d_model: int, approximate: bool = False, *, key):
        k1, k2 = jax.random.split(key)
        self.fc1 = eqx.nn.Linear(d_model, 4 * d_model, key=k1)
        self.act = eqx.nn.Lambda(functools.partial(jax.nn.gelu, approximate=approximate))
        self.fc2 = eqx.nn.Linear(4 * d_model, d_model, key=k2)
        self.drop = eqx.nn.Dropout(0.1, inference=True)

    def __call__(self, x):
        return self.drop(self.fc2(self.act(self.fc1(x))))  # (D,)


class Block(eqx.Module):
    """(T, D) -> (T, D): pre-LayerNorm attention and MLP, each with a residual."""

    ln1: eqx.nn.LayerNorm
    attn: Attention
    ln2: eqx.nn.LayerNorm
    mlp: MLP

    def __init__(self, d_model=D, n_heads=H, eps=1e-5, approximate=False, *, key):
        k1, k2 = jax.random.split(key)
        self.ln1 = eqx.nn.LayerNorm(d_model, eps=eps)
        self.attn = Attention(d_model, n_heads, key=k1)
        self.ln2 = eqx.nn.LayerNorm(d_model, eps=eps)
        self.mlp = MLP(d_model, approximate, key=k2)

    def __call__(self, x):
        x = x + self.attn(jax.vmap(self.ln1)(x))  # (T, D)
        return x + jax.vmap(self.mlp)(jax.vmap(self.ln2)(x))  # (T, D)


def block():
    """The Equinox block and the torch twin's input batch: a factory for `mhsa port-check`."""
    return Block(key=jax.random.key(0)), example_inputs()


def naive_block():
    """A first port that kept a Flax habit and a JAX default: LayerNorm eps 1e-6 and the tanh GELU.
    `mhsa port-check examples.torch_block:block examples.equinox_block:naive_block` names both."""
    return Block(eps=1e-6, approximate=True, key=jax.random.key(0)), example_inputs()
