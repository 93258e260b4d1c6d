"""The zoo's tables: every faithful pair, and every planted bug with the place where a port check
must find it. Specs are `package.module:function` factories as `mhsa port-check` takes them; each
returns (model, inputs), inputs a tuple of NumPy arrays (positional) or, for the `_keywords` pair,
a dict of them (keyword arguments). The Flax factories take an optional dtype ("float32" by
default, "float64" with jax_enable_x64 on); a Linen port is the pair (module, variables)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

ZOO = "examples.zoo"


@dataclass(frozen=True)
class Pair:
    """A faithful pair: the reference, the port with the reference's weights converted by our
    converter, the port as built (Flax's initializers, for a check that transfers weights), and the
    converter itself (a torch state_dict in NumPy -> {Flax variable path: array}). unread: the
    variables the converter leaves in the port that the port never reads."""

    reference: str
    port: str
    fresh: str
    convert: str
    unread: tuple[str, ...] = ()


def _pair(
    family: str, reference: str = "reference", port: str = "ported", fresh: str = "fresh", fresh_in: str = "flax", unread: tuple[str, ...] = ()
) -> Pair:
    """{family}_torch:reference, {family}_convert:ported, {family}_{fresh_in}:fresh, {family}_convert:to_flax."""
    convert = f"{ZOO}.{family}_convert"
    return Pair(f"{ZOO}.{family}_torch:{reference}", f"{convert}:{port}", f"{ZOO}.{family}_{fresh_in}:{fresh}", f"{convert}:to_flax", unread)


FAITHFUL = {
    "llama": _pair("llama"),
    "llama_keywords": _pair("llama", "reference_keywords", "ported_keywords", "fresh_keywords"),
    "gpt2": _pair("gpt2"),
    "gpt2_linen": _pair("gpt2", port="ported_linen", fresh_in="linen"),
    "vit": _pair("vit"),
    "seq2seq": _pair("seq2seq", fresh_in="linen", unread=("encoder.embed_tokens.embedding",)),
    "convnet": _pair("convnet"),
}


@dataclass(frozen=True)
class Bug:
    """A broken port against its reference, on the reference's example inputs. parts_at: where the
    two first differ, a module path of the reference ("" = the model's own output) for section
    "output", a parameter name for "gradient" (the outputs agree), a module path for "lint" (the
    outputs agree in eval mode; the setting differs: the check passes, the lint names it as a
    warning). dtype: the one the check runs in: float64, where no precision gap can pass for a bug."""

    reference: str
    port: str
    parts_at: str
    section: str
    what: str
    dtype: str = "float64"


def _bug(name: str, family: str, parts_at: str, what: str, section: str = "output") -> Bug:
    return Bug(f"{ZOO}.{family}_torch:reference", f"{ZOO}.{family}_bugs:{name}", parts_at, section, what)


# one line per bug: (family, where the models part, what the bug is[, section]); its port is {family}_bugs:{name}
_TABLE = {
    "rope_interleaved": ("llama", "layers.0.self_attn.rotary", "RoPE over adjacent pairs; the reference turns the two halves"),
    "gqa_head_order": ("llama", "layers.0.self_attn.o_proj", "kv heads repeated with tile, not repeat_interleave"),
    "mask_polarity": ("llama", "layers.0.self_attn.o_proj", "attention_mask read as True = masked (the padded rows show it)"),
    "rmsnorm_eps": ("llama", "layers.0.input_layernorm", "RMSNorm at Flax's default eps 1e-6, not the config's 1e-5"),
    "transposed_square_kernel": ("llama", "layers.0.self_attn.q_proj", "the converter forgets to transpose the square q_proj"),
    "untied_embeddings": ("llama", "", "an lm_head of its own, at Flax's initialization; the reference ties it"),
    "layernorm_eps": ("gpt2", "transformer.h.0.ln_1", "LayerNorm at Flax's default eps 1e-6, not 1e-5"),
    "layernorm_eps_linen": ("gpt2", "transformer.h.0.ln_1", "the same in the Linen port"),
    "gelu_erf": ("gpt2", "transformer.h.0.mlp.c_proj", "exact GELU for the reference's tanh one (whose act has no Flax module)"),
    "attention_scale": ("gpt2", "transformer.h.0.attn.c_proj", "scores scaled by 1/d_head, not 1/sqrt(d_head)"),
    "conv1d_transposed": ("gpt2", "transformer.h.0.attn.c_proj", "the converter transposes a square Conv1D weight, (in, out) already"),
    "untied_embeddings_grads": ("gpt2", "transformer.wte.weight", "lm_head a copy of the embedding: same logits, other gradients", "gradient"),
    "softmax_wrong_axis": ("vit", "blocks.0.attn.proj", "attention softmax over the queries, not the keys"),
    "conv_kernel_transposed": ("vit", "stem.conv", "the converter reverses all four conv axes: kH, kW swap on a 3x3 kernel"),
    "batchnorm_stats_not_loaded": ("vit", "stem.bn", "running statistics not converted (buffers, not parameters)"),
    "missing_bias": ("vit", "patch_embed", "the patch embedding without its bias"),
    "same_padding_stride2": ("vit", "stem.down", "'SAME' at stride 2 on an even size pads (0, 1); torch's padding=1 pads (1, 1)"),
    "batchnorm_momentum": ("vit", "stem.bn", "torch's momentum 0.1 taken as Flax's (which means 0.9); eval agrees", "lint"),
    "untied_shared_embedding": (
        "seq2seq",
        "shared.weight",
        "the decoder's own copy of the shared embedding: same output, other gradients",
        "gradient",
    ),
    "final_layernorm_eps": ("seq2seq", "decoder.layer_norm", "the output's LayerNorm (at init: scale 1, bias 0) at Flax's eps 1e-6"),
    "cross_attention_causal": (
        "seq2seq",
        "decoder.layers.0.encoder_attn.out_proj",
        "cross-attention under the causal mask, after the scaled embedding's boundary",
    ),
    "images_channels_first": ("convnet", "conv_in", "torch's NCHW images handed to the port: at C = H = W they fit an NHWC conv"),
    "weight_norm_whole_kernel": ("convnet", "conv_wn", "the weight norm over the whole kernel, not per output channel"),
    "positions_interleaved": (
        "convnet",
        "embed_positions",
        "the sinusoidal table built interleaved (sin, cos, ...) where the reference concatenates",
    ),
}
BUGS = {name: _bug(name, *row) for name, row in _TABLE.items()}


def resolve(spec: str):
    """The function `package.module:function` names."""
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)


def build(spec: str, **kwargs):
    """What the factory `spec` returns, called with `kwargs` (dtype="float64", say)."""
    return resolve(spec)(**kwargs)
