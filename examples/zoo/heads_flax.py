"""The causal stack of heads_torch.py in Flax NNX, written as Flax users write it: the attention is
Flax's own `nnx.MultiHeadAttention`, module for module and name for name with the reference
otherwise, so that every submodule's output the reference records has a counterpart.

What differs between the two sides, and why it is still the same model:
- nnx.MultiHeadAttention projects with three LinearGenerals, query / key / value, kernels
  (D, H, d_head) and biases (H, d_head), and `out`, kernel (H, d_head, D): torch's packed
  in_proj_weight (3D, D) split in three, each transposed to (in, out) and its output axis split
  head-major (heads_convert.py). It scales the queries by 1/sqrt(d_head), as torch does.
- The causal mask is Flax's: `nnx.make_causal_mask`, (B, 1, T, T), True = may attend (torch's
  boolean attn_mask: True = may not); nnx.MultiHeadAttention masks nothing unless given one.
- LayerNorm's epsilon is passed explicitly: Flax's default 1e-6 is not torch's 1e-5.
- The GELU is exact, `nnx.gelu(x, approximate=False)`: Flax's and JAX's default is tanh.
- The attention is computed in `dtype` throughout (attention_in_dtype): with no dropout the
  default attention_fn hands over to jax.nn.dot_product_attention, whose softmax is float32 always.
- decode=False: no autoregressive cache; dropout_rate 0 (the default), so no dropout rng.
- Every layer computes in `dtype`, parameters included (float64 needs jax_enable_x64).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn.attention import dot_product_attention_weights  # not exported as nnx.dot_product_attention_weights

from examples.zoo.convert import jax_dtype
from examples.zoo.heads_torch import TINY, HeadsConfig, example_inputs


def attention_in_dtype(query, key, value, bias=None, mask=None, **settings):
    """nnx.MultiHeadAttention's attention_fn: nnx.dot_product_attention's own general path, the
    weights of dot_product_attention_weights summed over the values, every step in the inputs'
    dtype. The default takes a shortcut when there is no dropout, jax.nn.dot_product_attention,
    which takes its softmax in float32 whatever the dtype: a float64 port would part from its
    reference by 6e-8 on the example there. `settings` are what nnx.MultiHeadAttention passes
    (dropout, precision, dtype, ...); this port has no dropout and takes its mask as `mask`.
    query (B, T, H, d_head), key and value (B, S, H, d_head)."""
    if settings.get("dropout_rate") or settings.get("is_causal"):
        raise ValueError("attention_in_dtype has no dropout and no is_causal: pass a mask")
    weights = dot_product_attention_weights(query, key, bias, mask, dtype=query.dtype)  # (B, H, T, S), queries scaled by 1/sqrt(d_head)
    return jnp.einsum("...hqk,...khd->...qhd", weights, value)  # (B, T, H, d_head)


def layer_norm(config: HeadsConfig, *, dtype, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(config.d_model, epsilon=config.layer_norm_eps, dtype=dtype, param_dtype=dtype, rngs=rngs)  # not Flax's 1e-6


class MLP(nnx.Module):
    """(B, T, D) -> (B, T, D): fc, exact GELU, proj."""

    def __init__(self, config: HeadsConfig, *, dtype, rngs: nnx.Rngs):
        self.fc = nnx.Linear(config.d_model, config.d_mlp, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.proj = nnx.Linear(config.d_mlp, config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):
        return self.proj(nnx.gelu(self.fc(x), approximate=False))  # (B, T, D)


class Block(nnx.Module):
    """(B, T, D), mask (B, 1, T, T) bool (True = may attend) -> (B, T, D): pre-LayerNorm attention
    and MLP, each with a residual."""

    def __init__(self, config: HeadsConfig, *, dtype, rngs: nnx.Rngs):
        self.ln_1 = layer_norm(config, dtype=dtype, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            num_heads=config.n_heads,
            in_features=config.d_model,
            qkv_features=config.d_model,
            out_features=config.d_model,
            decode=False,
            attention_fn=attention_in_dtype,
            dtype=dtype,
            param_dtype=dtype,
            rngs=rngs,
        )
        self.ln_2 = layer_norm(config, dtype=dtype, rngs=rngs)
        self.mlp = MLP(config, dtype=dtype, rngs=rngs)

    def __call__(self, x, mask):
        x = x + self.attn(self.ln_1(x), mask=mask)  # (B, T, D): self-attention, inputs_k = inputs_v = inputs_q
        return x + self.mlp(self.ln_2(x))  # (B, T, D)


class HeadsStack(nnx.Module):
    """x (B, T, D) float -> (B, T, D): causal blocks and a final LayerNorm."""

    def __init__(self, config: HeadsConfig = TINY, *, dtype: str = "float32", rngs: nnx.Rngs):
        dtype = jax_dtype(dtype)
        self.blocks = nnx.List([Block(config, dtype=dtype, rngs=rngs) for _ in range(config.n_layers)])
        self.ln_f = layer_norm(config, dtype=dtype, rngs=rngs)

    def attention_mask(self, x):
        """(B, T, D) -> (B, 1, T, T) bool, True = may attend: query t sees keys 0 .. t."""
        return nnx.make_causal_mask(jnp.ones(x.shape[:2], dtype=bool), dtype=bool)

    def __call__(self, x):
        mask = self.attention_mask(x)
        for block in self.blocks:
            x = block(x, mask)
        return self.ln_f(x)  # (B, T, D)


def fresh(dtype: str = "float32"):
    """A port as built, Flax's initializers, no converted weights, and the reference's inputs: a
    factory for `mhsa port-check`."""
    return HeadsStack(TINY, dtype=dtype, rngs=nnx.Rngs(0)), example_inputs()
