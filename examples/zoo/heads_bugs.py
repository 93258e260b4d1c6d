"""Broken ports of the head-shaped pair, each a faithful port (heads_flax.py in NNX, or
heads_equinox.py in Equinox) with the reference's weights written in by heads_convert.py, and
exactly one classic porting bug planted where the frameworks' built-in attention modules invite
it: a converter that splits or reshapes torch's packed projections one step wrong, a block that
forgets the mask, a layer built with its framework's default. Each factory returns (model, inputs)
as the faithful ones do; examples/zoo/catalog.py lists them with the module where each must be found.

NNX: key_value_swapped, out_head_order, causal_mask_missing, layernorm_eps.
Equinox: output_bias_dropped, query_scaled_twice.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

import equinox as eqx
import jax
from flax import nnx

from examples.zoo import convert_equinox, heads_convert, heads_equinox, heads_flax
from examples.zoo.convert import abstract, jax_dtype
from examples.zoo.heads_torch import TINY, HeadsConfig, example_inputs

FLAX_LN_EPS = inspect.signature(nnx.LayerNorm.__init__).parameters["epsilon"].default  # 1e-6 in flax 0.12


class UnmaskedBlock(heads_flax.Block):
    def __call__(self, x, mask):
        """The attention called without `mask=`, as for an encoder: nnx.MultiHeadAttention masks nothing, every query sees every key."""
        x = x + self.attn(self.ln_1(x))  # (B, T, D)
        return x + self.mlp(self.ln_2(x))  # (B, T, D)


def _port(dtype: str, config: HeadsConfig = TINY, swap=None) -> heads_flax.HeadsStack:
    """The faithful NNX port, built abstractly, with `swap(model)` applied to it first."""
    return abstract(lambda: heads_flax.HeadsStack(config, dtype=dtype, rngs=nnx.Rngs(0)), swap)


def _port_equinox(dtype: str) -> heads_equinox.HeadsStack:
    """The faithful Equinox port, built abstractly."""
    return convert_equinox.abstract_equinox(lambda: heads_equinox.HeadsStack(TINY, dtype=dtype, key=jax.random.key(0)))


# --- NNX ---


def swaps_key_value(state, config: HeadsConfig = TINY):
    """heads_convert.to_flax, except that in_proj's row blocks are read as (q, v, k): the key
    projection gets the value's weights and bias, and the value the key's: one shape, so they fit."""
    arrays = heads_convert.to_flax(state, config)
    for i in range(config.n_layers):
        for leaf in ("kernel", "bias"):
            key, value = f"blocks.{i}.attn.key.{leaf}", f"blocks.{i}.attn.value.{leaf}"
            arrays[key], arrays[value] = arrays[value], arrays[key]
    return arrays


def key_value_swapped(dtype: str = "float32"):
    """The faithful NNX port, converted by a converter that takes in_proj's K and V chunks swapped."""
    return heads_convert.port(_port(dtype), swaps_key_value), example_inputs()


def splits_out_dim_major(state, config: HeadsConfig = TINY):
    """heads_convert.to_flax, except that out_proj's input axis is split as (d_head, H), then
    moved to the (H, d_head, D) the kernel holds: torch's input channel h * d_head + j is read as
    j * H + h. The shape fits; every head reads its neighbours' channels."""
    arrays = heads_convert.to_flax(state, config)
    D, H, d_head = config.d_model, config.n_heads, config.d_head
    for i in range(config.n_layers):
        kernel = state[f"blocks.{i}.attn.out_proj.weight"].T.reshape(d_head, H, D)  # (in, out) -> (d_head, H, D): the wrong order
        arrays[f"blocks.{i}.attn.out.kernel"] = kernel.transpose(1, 0, 2)  # (H, d_head, D)
    return arrays


def out_head_order(dtype: str = "float32"):
    """The faithful NNX port, converted by a converter that splits the out kernel's heads in the wrong order."""
    return heads_convert.port(_port(dtype), splits_out_dim_major), example_inputs()


def causal_mask_missing(dtype: str = "float32"):
    """Every block calls its attention without the causal mask: nnx.MultiHeadAttention masks nothing by default."""

    def swap(model):
        for i in range(TINY.n_layers):
            model.blocks[i] = UnmaskedBlock(TINY, dtype=jax_dtype(dtype), rngs=nnx.Rngs(0))

    return heads_convert.port(_port(dtype, swap=swap)), example_inputs()


def layernorm_eps(dtype: str = "float32"):
    """Every LayerNorm built as nnx.LayerNorm(d) builds it: Flax's default epsilon 1e-6, not torch's 1e-5."""
    return heads_convert.port(_port(dtype, dataclasses.replace(TINY, layer_norm_eps=FLAX_LN_EPS))), example_inputs()


# --- Equinox ---


def drops_output_bias(state, config: HeadsConfig = TINY):
    """heads_convert.to_equinox without output_proj.bias, which a port built with Equinox's
    defaults has no field for: the porter deletes what the port refuses."""
    arrays = heads_convert.to_equinox(state, config)
    for i in range(config.n_layers):
        del arrays[f"blocks.{i}.attn.output_proj.bias"]
    return arrays


def output_bias_dropped(dtype: str = "float32"):
    """The Equinox port with each attention built with q, k and v biases switched on but
    use_output_bias left at Equinox's default, False: out_proj.bias has nowhere to go."""

    def forgetful(key):
        return eqx.nn.MultiheadAttention(
            TINY.n_heads, TINY.d_model, use_query_bias=True, use_key_bias=True, use_value_bias=True, dtype=jax_dtype(dtype), key=key
        )

    model = _port_equinox(dtype)
    for i in range(TINY.n_layers):
        model = eqx.tree_at(lambda m, i=i: m.blocks[i].attn, model, eqx.filter_eval_shape(forgetful, jax.random.key(i)))
    return heads_convert.port_equinox(model, drops_output_bias), example_inputs()


def folds_query_scale(state, config: HeadsConfig = TINY):
    """heads_convert.to_equinox, with 1/sqrt(d_head) folded into the query projection (weight and
    bias), as a converter does for attention code that leaves the scores unscaled:
    eqx.nn.MultiheadAttention scales the queries itself, so the scores are scaled by 1/d_head."""
    arrays = heads_convert.to_equinox(state, config)
    scale = 1.0 / math.sqrt(config.d_head)
    for i in range(config.n_layers):
        for leaf in ("weight", "bias"):
            name = f"blocks.{i}.attn.query_proj.{leaf}"
            arrays[name] = arrays[name] * scale  # float32 stays float32
    return arrays


def query_scaled_twice(dtype: str = "float32"):
    """The Equinox port, converted by a converter that folds the attention's query scaling into
    the query weights, where Equinox's attention scales the queries again."""
    return heads_convert.port_equinox(_port_equinox(dtype), folds_query_scale), example_inputs()
