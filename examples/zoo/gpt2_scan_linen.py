"""The scanned GPT-2 of gpt2_scan.py in Flax Linen: gpt2_linen.py's Block (imported) lifted by
`nn.scan` over a layer axis, as Linen decoders stack their layers (MaxText's Linen decoder, T5X):
`transformer.h` is one scanned block whose every parameter is (n_layers, ...), made with one
params rng per layer (split_rngs), so that h.ln_1.scale holds the reference's h.0.ln_1.weight,
h.1.ln_1.weight, ... in its rows. Everything else is gpt2_linen.py's, names included.

nn.scan needs a body (carry, *xs) -> (carry, y): ScanBlock is gpt2_linen.Block returning its
output twice, as the carry and as this layer's y, stacked by the scan into (n_layers, B, T, D),
the hidden states the output holds. A subclass, not a wrapper, so that the block's submodules
(ln_1, attn, ...) sit directly under transformer.h, where gpt2_scan.py's NNX port has them too:
one converter (gpt2_scan_convert.to_flax) serves both. `mhsa port-check` takes a Linen port as
the pair (module, variables)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from examples.zoo import gpt2_linen, inputs
from examples.zoo.configs import GPT2Config
from examples.zoo.convert import jax_dtype
from examples.zoo.gpt2_flax import CausalLMOutput
from examples.zoo.gpt2_scan import CONFIG, unstacked


class ScanBlock(gpt2_linen.Block):
    """h (B, T, D) -> (h, h): gpt2_linen.Block as nn.scan's body, the output as carry and as y."""

    def __call__(self, h):
        h = super().__call__(h)  # (B, T, D)
        return h, h


def scanned_blocks(config: GPT2Config, name: str = "h") -> nn.Module:
    """ScanBlock lifted over n_layers: params stacked on axis 0, one params rng per layer, nothing
    scanned over but the layers (in_axes=(): the body takes the carry only)."""
    scan = nn.scan(ScanBlock, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=(), length=config.n_layers)
    return scan(config, name=name)


class ScanGPT2Model(nn.Module):
    """input_ids (B, T) -> the hidden states, (B, T, D) each, the last after ln_f; the blocks scanned."""

    config: GPT2Config

    def setup(self):
        self.wte = nn.Embed(self.config.vocab_size, self.config.d_model)
        self.wpe = nn.Embed(self.config.n_positions, self.config.d_model)
        self.drop = nn.Dropout(0.1, deterministic=True)
        self.h = scanned_blocks(self.config)
        self.ln_f = nn.LayerNorm(epsilon=self.config.layer_norm_epsilon)  # not Flax's 1e-6

    def __call__(self, input_ids):
        B, T = input_ids.shape
        positions = self.wpe(jnp.broadcast_to(jnp.arange(T), (B, T)))  # (B, T, D): per row
        h = self.drop(self.wte(input_ids) + positions)  # (B, T, D)
        _, outputs = self.h(h)  # (n_layers, B, T, D)
        hidden_states = [h, *unstacked(outputs)]
        return (*hidden_states[:-1], self.ln_f(hidden_states[-1]))


class ScanGPT2LMHeadModel(nn.Module):
    """input_ids (B, T) -> CausalLMOutput(logits (B, T, V), hidden_states)."""

    config: GPT2Config = CONFIG

    def setup(self):
        self.transformer = ScanGPT2Model(self.config)

    def __call__(self, input_ids):
        hidden_states = self.transformer(input_ids)
        return CausalLMOutput(logits=self.transformer.wte.attend(hidden_states[-1]), hidden_states=hidden_states)


def fresh(dtype: str = "float32"):
    """A port as built, `module.init`'s variables in `dtype`, and the reference's inputs, as
    (module, variables), inputs: a factory for `mhsa port-check`."""
    module, x = ScanGPT2LMHeadModel(CONFIG), inputs.gpt2(CONFIG)
    variables = module.init(jax.random.key(0), *x)
    return (module, jax.tree.map(lambda leaf: jnp.asarray(leaf, jax_dtype(dtype)), variables)), x
