"""The encoder-decoder of seq2seq_torch.py in Flax Linen, written the way the popular library
writes its own Flax BART: one nn.Embed made in the model's `setup` as `shared` and handed to both
stacks (a Linen module passed to another keeps its own scope: its variables live once, at
`shared`), the embedding scaled by sqrt(d_model) in the stack after nn.Embed (torch scales inside
its embedding module: the same computation, split at another module boundary), the layers named
"0", "1", ... inside a module `layers`, so every other path and name is torch's.

A converted port's variables keep `encoder.embed_tokens.embedding` beside `shared.embedding`, as
real converters leave them (seq2seq_convert.py): nothing reads it. Linen modules compute in the
dtype of their parameters and inputs."""

from __future__ import annotations

import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from examples.zoo import inputs
from examples.zoo.configs import Seq2SeqConfig
from examples.zoo.convert import jax_dtype

TINY = Seq2SeqConfig()


class Attention(nn.Module):
    """(B, L, D), (B, M, D) -> (B, L, D): multi-head attention of the first over the second, causal when asked."""

    config: Seq2SeqConfig

    def setup(self):
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Dense(self.config.d_model) for _ in range(4))

    def __call__(self, x, memory, causal: bool = False):
        (B, L, D), M, H, d_head = x.shape, memory.shape[1], self.config.n_heads, self.config.d_head
        q = self.q_proj(x).reshape(B, L, H, d_head).transpose(0, 2, 1, 3)  # (B, H, L, d_head)
        k, v = (proj(memory).reshape(B, M, H, d_head).transpose(0, 2, 1, 3) for proj in (self.k_proj, self.v_proj))  # (B, H, M, d_head)
        scores = q @ k.swapaxes(-2, -1) / jnp.asarray(math.sqrt(d_head), x.dtype)  # (B, H, L, M)
        if causal:
            scores = jnp.where(jnp.tril(jnp.ones((L, M), dtype=bool)), scores, jnp.finfo(scores.dtype).min)
        context = jax.nn.softmax(scores, axis=-1) @ v  # (B, H, L, d_head)
        return self.out_proj(context.transpose(0, 2, 1, 3).reshape(B, L, D))  # (B, L, D)


class MLP(nn.Module):
    """(B, L, D) -> (B, L, D): widen, exact GELU, narrow."""

    config: Seq2SeqConfig

    def setup(self):
        self.fc1 = nn.Dense(self.config.d_ff)
        self.fc2 = nn.Dense(self.config.d_model)

    def __call__(self, x):
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))  # (B, L, D)


def layer_norm(config: Seq2SeqConfig) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=config.layer_norm_eps)  # not Flax's 1e-6


class Layer(nn.Module):
    """(B, L, D)[, encoder output (B, S, D)] -> (B, L, D): pre-LayerNorm self-attention, then (in
    the decoder, given the encoder's output) causal self-attention and cross-attention, then the
    MLP, each with a residual."""

    config: Seq2SeqConfig
    cross: bool = False

    def setup(self):
        self.self_attn_layer_norm = layer_norm(self.config)
        self.self_attn = Attention(self.config)
        if self.cross:
            self.encoder_attn_layer_norm = layer_norm(self.config)
            self.encoder_attn = Attention(self.config)
        self.final_layer_norm = layer_norm(self.config)
        self.mlp = MLP(self.config)

    def attend_encoder(self, x, memory):
        """(B, T, D), (B, S, D) -> (B, T, D): cross-attention over every source position."""
        return self.encoder_attn(self.encoder_attn_layer_norm(x), memory)

    def __call__(self, x, memory=None):
        h = self.self_attn_layer_norm(x)
        x = x + self.self_attn(h, h, causal=memory is not None)  # (B, L, D)
        if memory is not None:
            x = x + self.attend_encoder(x, memory)  # (B, L, D)
        return x + self.mlp(self.final_layer_norm(x))  # (B, L, D)


class Layers(nn.Module):
    """x, *context -> x through every layer in turn: the layers named "0", "1", ... as torch's ModuleList."""

    config: Seq2SeqConfig
    layer: type[Layer] = Layer
    cross: bool = False

    def setup(self):
        self.layers = [self.layer(self.config, self.cross, name=str(i)) for i in range(self.config.n_layers)]

    def __call__(self, x, *context):
        for layer in self.layers:
            x = layer(x, *context)
        return x


class Encoder(nn.Module):
    """input_ids (B, S) -> (B, S, D)."""

    config: Seq2SeqConfig
    embed_tokens: nn.Embed  # the model's `shared`

    def setup(self):
        self.layers = Layers(self.config)
        self.layer_norm = layer_norm(self.config)

    def __call__(self, input_ids):
        return self.layer_norm(self.layers(scaled(self.embed_tokens(input_ids), self.config)))


def scaled(x, config: Seq2SeqConfig):
    """The embedding (B, L, D) times sqrt(D): torch's ScaledEmbedding does it inside its module."""
    return x * jnp.asarray(math.sqrt(config.d_model), x.dtype)


class Decoder(nn.Module):
    """decoder_input_ids (B, T), encoder output (B, S, D) -> (B, T, D)."""

    config: Seq2SeqConfig
    embed_tokens: nn.Embed
    layer: ClassVar[type[Layer]] = Layer

    def setup(self):
        self.layers = Layers(self.config, self.layer, cross=True)
        self.layer_norm = layer_norm(self.config)

    def __call__(self, decoder_input_ids, memory):
        return self.layer_norm(self.layers(scaled(self.embed_tokens(decoder_input_ids), self.config), memory))


class Seq2Seq(nn.Module):
    """(input_ids (B, S), decoder_input_ids (B, T)) -> the decoder's output (B, T, D)."""

    config: Seq2SeqConfig = TINY
    decoder_type: ClassVar[type[Decoder]] = Decoder
    own_decoder_embedding: ClassVar[bool] = False  # True: the decoder reads an embedding of its own

    def setup(self):
        self.shared = nn.Embed(self.config.vocab_size, self.config.d_model)
        self.encoder = Encoder(self.config, self.shared)
        embedding = nn.Embed(self.config.vocab_size, self.config.d_model) if self.own_decoder_embedding else self.shared
        self.decoder = self.decoder_type(self.config, embedding)

    def __call__(self, input_ids, decoder_input_ids):
        return self.decoder(decoder_input_ids, self.encoder(input_ids))


def fresh(dtype: str = "float32"):
    """A port as built, `module.init`'s variables in `dtype`, and the reference's inputs, as
    (module, variables), inputs: a factory for `mhsa port-check`."""
    module, x = Seq2Seq(TINY), inputs.seq2seq(TINY)
    variables = module.init(jax.random.key(0), *x)
    return (module, jax.tree.map(lambda leaf: jnp.asarray(leaf, jax_dtype(dtype)), variables)), x
