"""Broken ports of the encoder-decoder pair, each the faithful Linen port of seq2seq_linen.py with
the reference's weights converted by seq2seq_convert.py, and exactly one porting bug planted: a
subclass whose `setup` builds one module otherwise, or a converter that does one step more.
examples/zoo/catalog.py lists them with the module where each must be found."""

from __future__ import annotations

from flax import linen as nn

from examples.zoo import seq2seq_convert, seq2seq_linen
from examples.zoo.configs import Seq2SeqConfig
from examples.zoo.gpt2_bugs import LINEN_LN_EPS

TINY = Seq2SeqConfig()
OWN_EMBEDDING = "decoder.embed_tokens.embedding"


class UntiedSeq2Seq(seq2seq_linen.Seq2Seq):
    """The decoder with an embedding of its own (the encoder keeps `shared`): filled with a copy of
    the shared weights, it gives the same outputs, but each copy learns from one stack only."""

    own_decoder_embedding = True


def with_own_embedding(state, config: Seq2SeqConfig = TINY):
    """seq2seq_convert.to_flax, and the shared weights copied once more, for the decoder's own embedding."""
    arrays = seq2seq_convert.to_flax(state, config)
    return arrays | {OWN_EMBEDDING: arrays["shared.embedding"].copy()}


def untied_shared_embedding(dtype: str = "float32"):
    """An untied decoder embedding holding a copy of the shared one: same outputs, other gradients."""
    return seq2seq_convert.ported(dtype, UntiedSeq2Seq(TINY), with_own_embedding)


class FlaxEpsDecoder(seq2seq_linen.Decoder):
    """The decoder's final LayerNorm built as nn.LayerNorm() builds it: Flax's epsilon 1e-6, not 1e-5."""

    def setup(self):
        self.layers = seq2seq_linen.Layers(self.config, self.layer, cross=True)
        self.layer_norm = nn.LayerNorm(epsilon=LINEN_LN_EPS)


class FinalEpsSeq2Seq(seq2seq_linen.Seq2Seq):
    decoder_type = FlaxEpsDecoder


def final_layernorm_eps(dtype: str = "float32"):
    """The output's LayerNorm, at init (scale 1, bias 0) on both sides, at Flax's default epsilon."""
    return seq2seq_convert.ported(dtype, FinalEpsSeq2Seq(TINY))


class CausalCrossLayer(seq2seq_linen.Layer):
    def attend_encoder(self, x, memory):
        """Cross-attention masked as if it were self-attention: target position t sees source positions <= t only."""
        return self.encoder_attn(self.encoder_attn_layer_norm(x), memory, causal=True)


class CausalCrossDecoder(seq2seq_linen.Decoder):
    layer = CausalCrossLayer


class CausalCrossSeq2Seq(seq2seq_linen.Seq2Seq):
    decoder_type = CausalCrossDecoder


def cross_attention_causal(dtype: str = "float32"):
    """The decoder's cross-attention under the causal mask: a bug after the scaled embedding's
    boundary (torch scales inside its embedding module, the port after nn.Embed)."""
    return seq2seq_convert.ported(dtype, CausalCrossSeq2Seq(TINY))
