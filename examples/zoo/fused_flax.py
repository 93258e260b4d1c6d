"""The fused-attention stack of fused_torch.py in Flax NNX, written as JAX code often is: the
projections keep the heads as axes of their own, so that no reshape is needed around them. A
faithful port, module for module and name for name (attn.qkv, attn.proj), but not shape for shape.

What differs between the two sides, and why it is still the same model:
- attn.qkv is nnx.LinearGeneral(D, (3, H, d_head)): kernel (D, 3, H, d_head), bias (3, H, d_head),
  output (B, T, 3, H, d_head) where torch's qkv returns (B, T, 3D). Torch's output viewed as
  (B, T, 3, H, d_head) is this one: fused_convert.py transposes the weight (3D, D) to (D, 3D) and
  reshapes its output axis row-major into (3, H, d_head).
- attn.proj is nnx.LinearGeneral((H, d_head), D, axis=(-2, -1)): kernel (H, d_head, D), input
  the context (B, T, H, d_head) contracted over both head axes; torch flattens the context to
  (B, T, D), heads major, and multiplies by its (D, D) weight.
- Scores and context are einsums over the head-shaped q, k, v (B, T, H, d_head); torch's matmuls
  run on (B, H, T, d_head). The same sums.
- LayerNorm's eps is passed explicitly (torch's 1e-5; Flax's default 1e-6); GELU is exact
  (jax.nn.gelu(approximate=False)); jax.nn.gelu's default is the tanh approximation.
- Every layer computes in `dtype`, parameters included (float64 needs jax_enable_x64).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from examples.zoo.convert import jax_dtype
from examples.zoo.fused_torch import TINY, FusedConfig, example_inputs


class CausalSelfAttention(nnx.Module):
    """(B, T, D) -> (B, T, D): causal multi-head attention, one fused head-shaped projection qkv."""

    def __init__(self, config: FusedConfig, *, dtype, rngs: nnx.Rngs):
        D, H, d_head = config.d_model, config.n_heads, config.d_head
        dtypes = dict(dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.qkv = nnx.LinearGeneral(D, (3, H, d_head), **dtypes)  # kernel (D, 3, H, d_head)
        self.proj = nnx.LinearGeneral((H, d_head), D, axis=(-2, -1), **dtypes)  # kernel (H, d_head, D)
        self.scale = 1.0 / math.sqrt(d_head)

    def keep(self, T: int):
        """(T, T) bool, True = query t may attend to key s (s <= t)."""
        return jnp.tril(jnp.ones((T, T), dtype=bool))

    def __call__(self, x):
        T = x.shape[1]
        qkv = self.qkv(x)  # (B, T, 3, H, d_head)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # 3 x (B, T, H, d_head)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * jnp.asarray(self.scale, x.dtype)  # (B, H, T, T)
        scores = jnp.where(self.keep(T), scores, jnp.finfo(scores.dtype).min)
        context = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)  # (B, T, H, d_head)
        return self.proj(context)  # (B, T, D): contracted over (H, d_head)


class MLP(nnx.Module):
    """(B, T, D) -> (B, T, D): widen, exact GELU, narrow."""

    def __init__(self, config: FusedConfig, *, dtype, rngs: nnx.Rngs):
        self.fc = nnx.Linear(config.d_model, config.d_mlp, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.proj = nnx.Linear(config.d_mlp, config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):
        return self.proj(jax.nn.gelu(self.fc(x), approximate=False))  # (B, T, D)


def layer_norm(config: FusedConfig, *, dtype, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(config.d_model, epsilon=config.layer_norm_eps, dtype=dtype, param_dtype=dtype, rngs=rngs)  # not Flax's 1e-6


class Block(nnx.Module):
    """(B, T, D) -> (B, T, D): pre-LayerNorm attention and MLP, each with a residual."""

    def __init__(self, config: FusedConfig, *, dtype, rngs: nnx.Rngs):
        self.ln_1 = layer_norm(config, dtype=dtype, rngs=rngs)
        self.attn = CausalSelfAttention(config, dtype=dtype, rngs=rngs)
        self.ln_2 = layer_norm(config, dtype=dtype, rngs=rngs)
        self.mlp = MLP(config, dtype=dtype, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln_1(x))  # (B, T, D)
        return x + self.mlp(self.ln_2(x))  # (B, T, D)


class Decoder(nnx.Module):
    """x (B, T, D) -> (B, T, D): the blocks, then a final LayerNorm."""

    def __init__(self, config: FusedConfig = TINY, *, dtype: str = "float32", rngs: nnx.Rngs):
        dtype = jax_dtype(dtype)
        self.blocks = nnx.List([Block(config, dtype=dtype, rngs=rngs) for _ in range(config.n_layers)])
        self.ln_f = layer_norm(config, dtype=dtype, rngs=rngs)

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)  # (B, T, D)


def fresh(dtype: str = "float32"):
    """A port as built, Flax's initializers, no converted weights, and the reference's batch: a
    factory for `mhsa port-check`."""
    return Decoder(TINY, dtype=dtype, rngs=nnx.Rngs(0)), example_inputs(TINY)
