"""A BART-style encoder-decoder in PyTorch: the reference of the zoo's encoder-decoder pair
(seq2seq_linen.py is its Linen port, seq2seq_convert.py the converter).

    input_ids (B, S) -> encoder: shared(ids) -> layers.i (pre-LayerNorm self-attention, MLP) -> layer_norm
    decoder_input_ids (B, T) -> decoder: shared(ids) -> layers.i (causal self-attention, cross-attention
      over the encoder's output, MLP) -> layer_norm -> the output (B, T, D)

What a port has to reproduce (examples/zoo/catalog.py):
- One embedding module, `shared`, used by the encoder and the decoder: the state_dict lists its
  weight three times (shared, encoder.embed_tokens, decoder.embed_tokens), named_parameters once.
- The embedding scales by sqrt(d_model) inside its own module (ScaledEmbedding), as the popular
  library's BART and XGLM do in torch; their Flax twins scale after nn.Embed, in the stack.
- The model ends in a LayerNorm as torch initializes it (weight 1, bias 0): the sum of the output
  is a constant, so a gradient check through that sum sees only rounding. The layers' own norms
  look trained.
- Attention scores scaled by 1/sqrt(d_head); exact GELU; LayerNorm eps 1e-5.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from examples.zoo import inputs
from examples.zoo.configs import Seq2SeqConfig
from examples.zoo.torch_weights import trained_look

TINY = Seq2SeqConfig()


class ScaledEmbedding(nn.Embedding):
    """ids (B, L) -> (B, L, D): the embedding times sqrt(D), inside the module."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__(vocab_size, d_model)
        self.embed_scale = math.sqrt(d_model)

    def forward(self, ids):
        return super().forward(ids) * self.embed_scale


class Attention(nn.Module):
    """(B, L, D), (B, M, D) -> (B, L, D): multi-head attention of the first over the second,
    causal when asked."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.n_heads, self.d_head = config.n_heads, config.d_head
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(config.d_model, config.d_model) for _ in range(4))

    def forward(self, x, memory, causal: bool = False):
        B, L, D = x.shape
        M = memory.shape[1]
        q = self.q_proj(x).view(B, L, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, L, d_head)
        k, v = (proj(memory).view(B, M, self.n_heads, self.d_head).transpose(1, 2) for proj in (self.k_proj, self.v_proj))  # (B, H, M, d_head)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, H, L, M)
        if causal:
            scores = scores.masked_fill(~torch.ones(L, M, dtype=torch.bool).tril(), torch.finfo(scores.dtype).min)
        context = scores.softmax(dim=-1) @ v  # (B, H, L, d_head)
        return self.out_proj(context.transpose(1, 2).reshape(B, L, D))  # (B, L, D)


class MLP(nn.Module):
    """(B, L, D) -> (B, L, D): widen, exact GELU, narrow."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(config.d_ff, config.d_model)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))  # (B, L, D)


class Layer(nn.Module):
    """(B, L, D)[, encoder output (B, S, D)] -> (B, L, D): pre-LayerNorm self-attention, then (in
    the decoder, given the encoder's output) causal self-attention and cross-attention, then the
    MLP, each with a residual."""

    def __init__(self, config: Seq2SeqConfig, cross: bool = False):
        super().__init__()
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.self_attn = Attention(config)
        if cross:
            self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
            self.encoder_attn = Attention(config)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, memory=None):
        h = self.self_attn_layer_norm(x)
        x = x + self.self_attn(h, h, causal=memory is not None)  # (B, L, D)
        if memory is not None:
            x = x + self.encoder_attn(self.encoder_attn_layer_norm(x), memory)  # (B, L, D)
        return x + self.mlp(self.final_layer_norm(x))  # (B, L, D)


class Encoder(nn.Module):
    """input_ids (B, S) -> (B, S, D)."""

    def __init__(self, config: Seq2SeqConfig, embed_tokens: ScaledEmbedding):
        super().__init__()
        self.embed_tokens = embed_tokens  # the model's `shared`, not a copy
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.n_layers))
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)  # (B, S, D), scaled
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class Decoder(nn.Module):
    """decoder_input_ids (B, T), encoder output (B, S, D) -> (B, T, D)."""

    def __init__(self, config: Seq2SeqConfig, embed_tokens: ScaledEmbedding):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.layers = nn.ModuleList(Layer(config, cross=True) for _ in range(config.n_layers))
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, decoder_input_ids, memory):
        x = self.embed_tokens(decoder_input_ids)  # (B, T, D), scaled
        for layer in self.layers:
            x = layer(x, memory)
        return self.layer_norm(x)


class Seq2Seq(nn.Module):
    """(input_ids (B, S), decoder_input_ids (B, T)) -> the decoder's output (B, T, D)."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.shared = ScaledEmbedding(config.vocab_size, config.d_model)
        self.encoder = Encoder(config, self.shared)
        self.decoder = Decoder(config, self.shared)

    def forward(self, input_ids, decoder_input_ids):
        return self.decoder(decoder_input_ids, self.encoder(input_ids))


def build(config: Seq2SeqConfig = TINY, seed: int = 0) -> Seq2Seq:
    """The reference from `seed`: the layers' norms look trained, each stack's final layer_norm
    stays at torch's init (weight 1, bias 0)."""
    torch.manual_seed(seed)
    model = Seq2Seq(config)
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        trained_look(layer, seed)
    return model.eval()


def reference():
    """The reference and its inputs (input_ids (3, 7), decoder_input_ids (3, 5)): a factory for `mhsa port-check`."""
    return build(), inputs.seq2seq(TINY)
