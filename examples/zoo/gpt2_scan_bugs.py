"""Broken ports of the scanned GPT-2 pair (gpt2_scan.py, gpt2_scan_linen.py), each the faithful
port with the reference's weights converted by gpt2_scan_convert.py and exactly one bug planted
in ONE layer, layer 1 of 3: the kind a stack of layers hides, since every layer runs the same
scanned body and only one slice of the stacked arrays is wrong.

- out_kernel_transposed_layer1 (and _linen): the converter transposes layer 1's square (D, D)
  attn.c_proj Conv1D weight, as if it were nn.Linear's: the stacked kernel's row 1 only.
- mask_off_layer1: layer 1's attention without its causal mask. A scanned body cannot branch on
  the layer's Python index, so the stacked block carries a per-layer switch: a Causal variable
  (an nnx.Variable, not an nnx.Param: no gradient, no optimizer state, nothing a converter
  fills) of shape (n_layers,) under nnx.vmap, one bool per step under nnx.scan; it is True for
  every layer but 1, where the mask is dropped.

The reference modules where each first parts the models are in the family's test
(tests/tools/port_check_zoo/test_zoo_gpt2_scan.py: PARTS_AT), found there by running the
port's Block on each layer's slice of the stacked variables, layer by layer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from examples.zoo import gpt2_flax, gpt2_scan, gpt2_scan_convert, gpt2_scan_linen, inputs
from examples.zoo.configs import GPT2Config
from examples.zoo.convert import abstract, jax_dtype, linen_variables, load_nnx
from examples.zoo.gpt2_scan import CONFIG

LAYER = 1  # the layer each bug is planted in: neither the first nor the last


class Causal(nnx.Variable):
    """A layer's switch, not a parameter: True = its attention is causal."""


class SwitchedAttention(gpt2_flax.Attention):
    """gpt2_flax.Attention whose causal mask applies only where this layer's Causal switch is on."""

    def __init__(self, config: GPT2Config, *, dtype, rngs: nnx.Rngs):
        super().__init__(config, dtype=dtype, rngs=rngs)
        self.causal = Causal(jnp.ones((), dtype=bool))  # () per layer; (n_layers,) once stacked

    def __call__(self, x):
        B, T, D = x.shape
        q, k, v = jnp.split(self.c_attn(x), 3, axis=-1)  # 3 x (B, T, D)
        q, k, v = (t.reshape(B, T, self.n_heads, self.d_head).transpose(0, 2, 1, 3) for t in (q, k, v))  # (B, H, T, d_head)
        scores = (q @ k.swapaxes(-2, -1)) * jnp.asarray(self.scale, x.dtype)  # (B, H, T, T)
        keep = jnp.tril(jnp.ones((T, T), dtype=bool)) | ~self.causal[...]  # (T, T): every key where the switch is off
        scores = jnp.where(keep, scores, jnp.finfo(scores.dtype).min)
        context = jax.nn.softmax(scores, axis=-1) @ v  # (B, H, T, d_head)
        return self.c_proj(context.transpose(0, 2, 1, 3).reshape(B, T, D))  # (B, T, D)


def switched_block(config: GPT2Config, *, dtype, rngs: nnx.Rngs) -> gpt2_flax.Block:
    """gpt2_flax.Block with SwitchedAttention for its attn."""
    block = gpt2_flax.Block(config, dtype=dtype, rngs=rngs)
    block.attn = SwitchedAttention(config, dtype=dtype, rngs=rngs)
    return block


def transposes_layer1_out_kernel(state, config: GPT2Config = CONFIG):
    """gpt2_scan_convert.to_flax, except that layer 1's attn.c_proj Conv1D weight is transposed as
    if it were nn.Linear's: (D, D), so the stacked kernel's row fits."""
    arrays = gpt2_scan_convert.to_flax(state, config)
    kernel = arrays["transformer.h.attn.c_proj.kernel"].copy()  # (n_layers, D, D)
    kernel[LAYER] = state[f"transformer.h.{LAYER}.attn.c_proj.weight"].T
    return arrays | {"transformer.h.attn.c_proj.kernel": kernel}


def out_kernel_transposed_layer1(dtype: str = "float32"):
    """The nnx.scan port, converted by a converter that transposes layer 1's square c_proj weight."""
    model = abstract(lambda: gpt2_scan.ScanGPT2LMHeadModel(CONFIG, dtype=dtype, rngs=nnx.Rngs(0)))
    return load_nnx(model, gpt2_scan_convert.reference_arrays(transposes_layer1_out_kernel)), inputs.gpt2(CONFIG)


def out_kernel_transposed_layer1_linen(dtype: str = "float32"):
    """The same converter's arrays in the Linen port, as (module, variables)."""
    module, x = gpt2_scan_linen.ScanGPT2LMHeadModel(CONFIG), inputs.gpt2(CONFIG)
    return (module, linen_variables(module, x, gpt2_scan_convert.reference_arrays(transposes_layer1_out_kernel), dtype)), x


def mask_off_layer1(dtype: str = "float32"):
    """The nnx.scan port whose stacked attention has a Causal switch per layer, off for layer 1."""

    def swap(model):
        model.transformer.h = gpt2_scan.stacked(lambda rngs: switched_block(CONFIG, dtype=jax_dtype(dtype), rngs=rngs), CONFIG.n_layers, nnx.Rngs(0))

    model = abstract(lambda: gpt2_scan.ScanGPT2LMHeadModel(CONFIG, dtype=dtype, rngs=nnx.Rngs(0)), swap)
    load_nnx(model, gpt2_scan_convert.reference_arrays())
    model.transformer.h.attn.causal.set_value(jnp.asarray(np.arange(CONFIG.n_layers) != LAYER))  # (n_layers,): built abstractly, set here
    return model, inputs.gpt2(CONFIG)
