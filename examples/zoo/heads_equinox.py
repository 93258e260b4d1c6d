"""The causal stack of heads_torch.py in Equinox, written as Equinox code is: each module takes
one example, (T, D), the user's code (or the port check) calls it per example under jax.vmap, and
the attention is Equinox's own `eqx.nn.MultiheadAttention`; names follow the reference's, so that
every submodule's output the reference records has a counterpart.

What differs between the two sides, and why it is still the same model:
- eqx.nn.MultiheadAttention holds four Linears, query_proj / key_proj / value_proj / output_proj,
  weights (out, in) as torch's: torch's packed in_proj_weight (3D, D) split in three row blocks,
  nothing transposed, nothing reshaped (heads_convert.py). It splits heads head-major, as torch
  does, and scales the queries by 1/sqrt(d_head) inside dot_product_attention_weights.
- Its four biases default to OFF (use_query_bias=False, ...), unlike eqx.nn.Linear's and torch's:
  all four are switched on here.
- The causal mask is (T, T) bool, True = may attend (torch's boolean attn_mask: True = may not);
  eqx.nn.MultiheadAttention masks nothing unless given one.
- LayerNorm eps 1e-5 (Equinox's default, as torch's); the GELU exact: jax.nn.gelu's default is tanh.
- dropout_p 0 (the default): eqx.nn.MultiheadAttention's Dropout is the identity.
- Every layer is built in `dtype` (float64 needs jax_enable_x64).
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp

from examples.zoo.convert import jax_dtype
from examples.zoo.heads_torch import TINY, HeadsConfig, example_inputs


def causal_mask(T: int):
    """(T, T) bool, True = may attend: query t sees keys 0 .. t."""
    return jnp.tril(jnp.ones((T, T), dtype=bool))


class MLP(eqx.Module):
    """(D,) -> (D,): fc, exact GELU (an eqx.nn.Lambda, so that a reader sees its approximation), proj."""

    fc: eqx.nn.Linear
    act: eqx.nn.Lambda
    proj: eqx.nn.Linear

    def __init__(self, config: HeadsConfig, *, dtype, key):
        k1, k2 = jax.random.split(key)
        self.fc = eqx.nn.Linear(config.d_model, config.d_mlp, dtype=dtype, key=k1)
        self.act = eqx.nn.Lambda(functools.partial(jax.nn.gelu, approximate=False))
        self.proj = eqx.nn.Linear(config.d_mlp, config.d_model, dtype=dtype, key=k2)

    def __call__(self, x):
        return self.proj(self.act(self.fc(x)))  # (D,)


def attention(config: HeadsConfig, *, dtype, key) -> eqx.nn.MultiheadAttention:
    """torch's nn.MultiheadAttention(D, H) in Equinox: every bias switched on (Equinox's default is none)."""
    return eqx.nn.MultiheadAttention(
        config.n_heads,
        config.d_model,
        use_query_bias=True,
        use_key_bias=True,
        use_value_bias=True,
        use_output_bias=True,
        dtype=dtype,
        key=key,
    )


class Block(eqx.Module):
    """(T, D) -> (T, D): pre-LayerNorm causal attention and MLP, each with a residual."""

    ln_1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    ln_2: eqx.nn.LayerNorm
    mlp: MLP

    def __init__(self, config: HeadsConfig, *, dtype, key):
        k1, k2 = jax.random.split(key)
        self.ln_1 = eqx.nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, dtype=dtype)
        self.attn = attention(config, dtype=dtype, key=k1)
        self.ln_2 = eqx.nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, dtype=dtype)
        self.mlp = MLP(config, dtype=dtype, key=k2)

    def __call__(self, x):
        h = jax.vmap(self.ln_1)(x)  # (T, D)
        x = x + self.attn(h, h, h, mask=causal_mask(x.shape[0]))  # (T, D)
        return x + jax.vmap(self.mlp)(jax.vmap(self.ln_2)(x))  # (T, D)


class HeadsStack(eqx.Module):
    """x (T, D) float -> (T, D), one example: causal blocks and a final LayerNorm."""

    blocks: list[Block]
    ln_f: eqx.nn.LayerNorm

    def __init__(self, config: HeadsConfig = TINY, *, dtype: str = "float32", key):
        dtype = jax_dtype(dtype)
        keys = jax.random.split(key, config.n_layers)
        self.blocks = [Block(config, dtype=dtype, key=k) for k in keys]
        self.ln_f = eqx.nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, dtype=dtype)

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return jax.vmap(self.ln_f)(x)  # (T, D)


def fresh_equinox(dtype: str = "float32"):
    """A port as built, Equinox's initializers, no converted weights, and the reference's batch
    (B, T, D): the port takes one example, the caller vmaps it. A factory for `mhsa port-check`."""
    return HeadsStack(TINY, dtype=dtype, key=jax.random.key(0)), example_inputs()
