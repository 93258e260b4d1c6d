"""The GPT-2-style model of gpt2_torch.py in Flax NNX with its blocks STACKED and SCANNED, the way
production JAX decoders are written (MaxText's scan_layers): one gpt2_flax.Block whose every
parameter has a leading layer axis, made by `nnx.vmap` at init (one rng split per layer), run by a
scan over that axis: one compiled block body however deep the model, instead of the reference's
nn.ModuleList `transformer.h` of n_layers blocks named "0", "1", .... The blocks themselves
(Attention, MLP, Block) are gpt2_flax.py's, imported: only the stacking differs.

    transformer.h: the reference's h.0, h.1, h.2 as one Block, h.ln_1.scale (n_layers, D), ...
        layer i of the reference is the slice [i] of every array under transformer.h

Four ways to run the stack, one class each (the variables are the same in all but the grouped one):
- ScanGPT2LMHeadModel: `nnx.scan` over the stacked Block (in_axes=(nnx.Carry, 0)).
- SplitScanGPT2LMHeadModel: `jax.lax.scan` over the state of `nnx.split(transformer.h)`, the
  graphdef closed over and `nnx.merge`d inside the body (the style from before nnx.scan).
- GroupedScanGPT2LMHeadModel: a scan over blocks of two consecutive layers: transformer.h holds
  two Blocks, layers_0 and layers_1, each stacked over n_layers / 2; layer i of the reference is
  layers_{i % 2} at slice i // 2 (MaxText's several decoder layers per scanned step).
- RematScanGPT2LMHeadModel: ScanGPT2LMHeadModel with `nnx.remat` around the scanned body, so the
  backward pass recomputes each block's activations instead of storing them.

The scans return every block's output stacked, (n_layers, B, T, D), beside the carry, so that the
output is gpt2_flax's CausalLMOutput with the same hidden_states as the reference's.

The reference is gpt2_torch's model at CONFIG (three layers: the zoo's TINY has two, too few to
plant a bug in a middle layer) or at GROUPED (four, for the blocks of two); gpt2_scan_convert.py
builds both references and converts their weights; gpt2_scan_linen.py is the same model in Linen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from examples.zoo import inputs
from examples.zoo.configs import GPT2Config, gpt2_small
from examples.zoo.convert import jax_dtype
from examples.zoo.gpt2_flax import TINY, Block, CausalLMOutput, layer_norm

CONFIG = dataclasses.replace(TINY, n_layers=3)  # a first, a middle and a last layer
GROUPED = dataclasses.replace(TINY, n_layers=4)  # two scanned steps of two layers each
GROUP = 2  # layers per scanned step of the grouped port


def stacked(make: Callable[[nnx.Rngs], nnx.Module], n: int, rngs: nnx.Rngs) -> nnx.Module:
    """The module `make(rngs)` builds, n times over with rngs split n ways, as ONE module whose
    every variable has a leading axis of n (nnx.vmap over the split rng keys)."""

    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def build(rngs: nnx.Rngs):
        return make(rngs)

    return build(rngs)


def unstacked(outputs: jax.Array) -> tuple[jax.Array, ...]:
    """A scan's stacked per-layer outputs (n_layers, B, T, D) -> n_layers arrays (B, T, D)."""
    return tuple(outputs[i] for i in range(outputs.shape[0]))


class ScanGPT2Model(nnx.Module):
    """input_ids (B, T) -> the hidden states, (B, T, D) each, the last after ln_f; the blocks stacked
    in transformer.h and run by nnx.scan."""

    def __init__(self, config: GPT2Config, *, dtype, rngs: nnx.Rngs):
        self.wte = nnx.Embed(config.vocab_size, config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.wpe = nnx.Embed(config.n_positions, config.d_model, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.drop = nnx.Dropout(0.1, deterministic=True)
        self.h = self.stack(config, dtype=dtype, rngs=rngs)
        self.ln_f = layer_norm(config, dtype=dtype, rngs=rngs)

    def stack(self, config: GPT2Config, *, dtype, rngs: nnx.Rngs) -> nnx.Module:
        """One Block per layer, stacked: every parameter (n_layers, ...)."""
        return stacked(lambda rngs: Block(config, dtype=dtype, rngs=rngs), config.n_layers, rngs)

    def layers(self, h: jax.Array) -> tuple[jax.Array, ...]:
        """h (B, T, D) -> every block's output, (B, T, D) each, in order."""

        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
        def step(h, block):
            h = block(h)  # (B, T, D): the block of this step's layer, its variables sliced from the stack
            return h, h

        _, outputs = step(h, self.h)  # (n_layers, B, T, D)
        return unstacked(outputs)

    def __call__(self, input_ids):
        B, T = input_ids.shape
        positions = self.wpe(jnp.broadcast_to(jnp.arange(T), (B, T)))  # (B, T, D): per row
        h = self.drop(self.wte(input_ids) + positions)  # (B, T, D)
        hidden_states = [h, *self.layers(h)]
        hidden_states[-1] = self.ln_f(hidden_states[-1])
        return tuple(hidden_states)


class SplitScanGPT2Model(ScanGPT2Model):
    """ScanGPT2Model's variables, run by jax.lax.scan over the stacked block's state."""

    def layers(self, h: jax.Array) -> tuple[jax.Array, ...]:
        graphdef, state = nnx.split(self.h)  # state: every array (n_layers, ...)

        def step(h, layer):
            block = nnx.merge(graphdef, layer)  # one layer's Block: its arrays sliced from the stack
            h = block(h)  # (B, T, D)
            return h, h

        _, outputs = jax.lax.scan(step, h, state)  # (n_layers, B, T, D)
        return unstacked(outputs)


class TwoLayers(nnx.Module):
    """Two consecutive layers, layers_0 then layers_1: one step of the grouped scan."""

    def __init__(self, config: GPT2Config, *, dtype, rngs: nnx.Rngs):
        self.layers_0 = Block(config, dtype=dtype, rngs=rngs)
        self.layers_1 = Block(config, dtype=dtype, rngs=rngs)

    def __call__(self, h):
        first = self.layers_0(h)  # (B, T, D)
        return first, self.layers_1(first)


class GroupedScanGPT2Model(ScanGPT2Model):
    """transformer.h: a TwoLayers stacked n_layers / 2 times, scanned: layer i is layers_{i % 2} at slice i // 2."""

    def stack(self, config: GPT2Config, *, dtype, rngs: nnx.Rngs) -> nnx.Module:
        if config.n_layers % GROUP:
            raise ValueError(f"blocks of {GROUP} layers need an even n_layers; got {config.n_layers}")
        return stacked(lambda rngs: TwoLayers(config, dtype=dtype, rngs=rngs), config.n_layers // GROUP, rngs)

    def layers(self, h: jax.Array) -> tuple[jax.Array, ...]:
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))
        def step(h, pair):
            first, second = pair(h)  # (B, T, D) each: layers 2g and 2g + 1
            return second, jnp.stack([first, second])  # (2, B, T, D)

        _, outputs = step(h, self.h)  # (n_layers / 2, 2, B, T, D)
        return unstacked(outputs.reshape(-1, *h.shape))  # (n_layers, B, T, D): step-major, layer 2g + k at [g, k]


class RematScanGPT2Model(ScanGPT2Model):
    """ScanGPT2Model with nnx.remat around the scanned body."""

    def layers(self, h: jax.Array) -> tuple[jax.Array, ...]:
        @nnx.remat
        def body(h, block):
            h = block(h)  # (B, T, D)
            return h, h

        _, outputs = nnx.scan(body, in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))(h, self.h)  # (n_layers, B, T, D)
        return unstacked(outputs)


class ScanGPT2LMHeadModel(nnx.Module):
    """input_ids (B, T) -> CausalLMOutput(logits (B, T, V), hidden_states), the blocks scanned."""

    transformer_class = ScanGPT2Model  # the transformer's class: how the stack is built and run

    def __init__(self, config: GPT2Config = CONFIG, *, dtype: str = "float32", rngs: nnx.Rngs):
        self.transformer = self.transformer_class(config, dtype=jax_dtype(dtype), rngs=rngs)

    def unembed(self, h):
        """(B, T, D) -> (B, T, V): the tied output layer."""
        return self.transformer.wte.attend(h)

    def __call__(self, input_ids):
        hidden_states = self.transformer(input_ids)
        return CausalLMOutput(logits=self.unembed(hidden_states[-1]), hidden_states=hidden_states)


class SplitScanGPT2LMHeadModel(ScanGPT2LMHeadModel):
    """ScanGPT2LMHeadModel, its stack run by jax.lax.scan over nnx.split's state."""

    transformer_class = SplitScanGPT2Model


class GroupedScanGPT2LMHeadModel(ScanGPT2LMHeadModel):
    """The blocks scanned two layers per step."""

    transformer_class = GroupedScanGPT2Model

    def __init__(self, config: GPT2Config = GROUPED, *, dtype: str = "float32", rngs: nnx.Rngs):
        super().__init__(config, dtype=dtype, rngs=rngs)


class RematScanGPT2LMHeadModel(ScanGPT2LMHeadModel):
    """ScanGPT2LMHeadModel with the scanned body rematerialized."""

    transformer_class = RematScanGPT2Model


def fresh(dtype: str = "float32"):
    """The nnx.scan port as built, Flax's initializers, and the reference's inputs: a factory for `mhsa port-check`."""
    return ScanGPT2LMHeadModel(CONFIG, dtype=dtype, rngs=nnx.Rngs(0)), inputs.gpt2(CONFIG)


def fresh_split(dtype: str = "float32"):
    """The jax.lax.scan port as built, and the reference's inputs."""
    return SplitScanGPT2LMHeadModel(CONFIG, dtype=dtype, rngs=nnx.Rngs(0)), inputs.gpt2(CONFIG)


def fresh_grouped(dtype: str = "float32"):
    """The grouped port (four layers, two per step) as built, and its reference's inputs."""
    return GroupedScanGPT2LMHeadModel(GROUPED, dtype=dtype, rngs=nnx.Rngs(0)), inputs.gpt2(GROUPED)


def fresh_remat(dtype: str = "float32"):
    """The rematerialized nnx.scan port as built, and the reference's inputs."""
    return RematScanGPT2LMHeadModel(CONFIG, dtype=dtype, rngs=nnx.Rngs(0)), inputs.gpt2(CONFIG)


def small(batch: int = 1, length: int = 1024):
    """GPT-2 small's shape (12 layers) stacked and scanned, a fresh port, and gpt2_torch.small's
    inputs: for benchmarks (benchmarks/port_check_scan.py: the scan against gpt2_flax.small's list)."""
    config = gpt2_small()
    return ScanGPT2LMHeadModel(config, rngs=nnx.Rngs(0)), inputs.gpt2(config, (batch, length))
