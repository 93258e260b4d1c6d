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
    warning), a parameter name for "unpaired" (the check stops, naming it). dtype: the one the check
    runs in: float64, where no precision gap can pass for a bug."""

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
    "missing_bias": ("vit", "patch_embed.bias", "the patch embedding without its bias: torch's has nowhere to go", "unpaired"),
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


# --- ports that change the model's shape ---
# head-shaped kernels (Flax's and Equinox's own attention against torch's), a fused projection kept
# (D, 3, H, d_head), a norm that sees (B, C, H*W) in torch and (B, H, W, C) in Flax, torch's packed
# recurrent gates against the JAX libraries' cells. Their submodules' outputs and parameters differ
# in shape, so sides.py cannot run them: each family's own test (tests/tools/port_check_zoo/
# test_zoo_<family>.py) checks its pairs and bugs without the port checker.


def _shaped(reference: str, port: str, fresh: str, convert: str) -> Pair:
    return Pair(f"{ZOO}.{reference}", f"{ZOO}.{port}", f"{ZOO}.{fresh}", f"{ZOO}.{convert}")


SHAPED = {
    "heads": _shaped("heads_torch:reference", "heads_convert:ported", "heads_flax:fresh", "heads_convert:to_flax"),
    "heads_equinox": _shaped("heads_torch:reference", "heads_convert:ported_equinox", "heads_equinox:fresh_equinox", "heads_convert:to_equinox"),
    "fused": _shaped("fused_torch:reference", "fused_convert:ported", "fused_flax:fresh", "fused_convert:to_flax"),
    "vae": _shaped("vae_torch:reference", "vae_convert:ported", "vae_flax:fresh", "vae_convert:to_flax"),
    "lstm": _shaped("rnn_torch:lstm", "rnn_convert:ported_lstm_flax", "rnn_flax:fresh_lstm", "rnn_convert:lstm_to_flax"),
    "lstm_equinox": _shaped("rnn_torch:lstm", "rnn_convert:ported_lstm_equinox", "rnn_equinox:fresh_lstm", "rnn_convert:lstm_to_equinox"),
    "lstm_no_bias_equinox": _shaped(
        "rnn_torch:lstm_no_bias", "rnn_convert:ported_lstm_no_bias_equinox", "rnn_equinox:fresh_lstm_no_bias", "rnn_convert:lstm_no_bias_to_equinox"
    ),
    "gru_equinox": _shaped("rnn_torch:gru", "rnn_convert:ported_gru_equinox", "rnn_equinox:fresh_gru", "rnn_convert:gru_to_equinox"),
    "gru_no_bias_equinox": _shaped(
        "rnn_torch:gru_no_bias", "rnn_convert:ported_gru_no_bias_equinox", "rnn_equinox:fresh_gru_no_bias", "rnn_convert:gru_no_bias_to_equinox"
    ),
    # GPT-2's blocks stacked on a leading layer axis and scanned: nnx.scan, jax.lax.scan over an
    # nnx.split state, a scan over blocks of two layers, nnx.remat around the body, Linen's nn.scan
    "gpt2_scan": _shaped("gpt2_scan_convert:reference", "gpt2_scan_convert:ported", "gpt2_scan:fresh", "gpt2_scan_convert:to_flax"),
    "gpt2_scan_split": _shaped("gpt2_scan_convert:reference", "gpt2_scan_convert:ported_split", "gpt2_scan:fresh_split", "gpt2_scan_convert:to_flax"),
    "gpt2_scan_grouped": _shaped(
        "gpt2_scan_convert:reference_grouped", "gpt2_scan_convert:ported_grouped", "gpt2_scan:fresh_grouped", "gpt2_scan_convert:to_flax_grouped"
    ),
    "gpt2_scan_remat": _shaped("gpt2_scan_convert:reference", "gpt2_scan_convert:ported_remat", "gpt2_scan:fresh_remat", "gpt2_scan_convert:to_flax"),
    "gpt2_scan_linen": _shaped("gpt2_scan_convert:reference", "gpt2_scan_convert:ported_linen", "gpt2_scan_linen:fresh", "gpt2_scan_convert:to_flax"),
}

# one line per bug: (reference, port, where the check must name it, what it is[, section[, dtype]]);
# section "unpaired": the check stops, naming that reference parameter (no verdict from weights it
# cannot pair); "gradient" with dtype float32 where a float32 port's summed biases alone part a
# float64 check's outputs (a port converted in float32 holds b_ih + b_hh rounded once)
_SHAPED_TABLE = {
    "key_value_swapped": (
        "heads_torch:reference",
        "heads_bugs:key_value_swapped",
        "blocks.0.attn",
        "in_proj's K and V chunks swapped by the converter",
    ),
    "out_head_order": (
        "heads_torch:reference",
        "heads_bugs:out_head_order",
        "blocks.0.attn",
        "out kernel's input axis split (d_head, H), not (H, d_head)",
    ),
    "causal_mask_missing": (
        "heads_torch:reference",
        "heads_bugs:causal_mask_missing",
        "blocks.0.attn",
        "nnx.MultiHeadAttention called without the mask",
    ),
    "heads_layernorm_eps": ("heads_torch:reference", "heads_bugs:layernorm_eps", "blocks.0.ln_1", "nnx.LayerNorm at Flax's default eps 1e-6"),
    "output_bias_dropped": (
        "heads_torch:reference",
        "heads_bugs:output_bias_dropped",
        "blocks.0.attn.out_proj.bias",
        "eqx.nn.MultiheadAttention's output bias left off (its default): torch's has nowhere to go",
        "unpaired",
    ),
    "query_scaled_twice": (
        "heads_torch:reference",
        "heads_bugs:query_scaled_twice",
        "blocks.0.attn",
        "1/sqrt(d_head) folded into query_proj: Equinox scales again",
    ),
    "qkv_heads_interleaved": (
        "fused_torch:reference",
        "fused_bugs:qkv_heads_interleaved",
        "blocks.0.attn.qkv",
        "fused weight read in GPT-NeoX's per-head order",
    ),
    "qkv_untransposed": (
        "fused_torch:reference",
        "fused_bugs:qkv_untransposed",
        "blocks.0.attn.qkv",
        "(3D, D) reshaped to (D, 3, H, d_head) without the transpose",
    ),
    "proj_head_axes_swapped": ("fused_torch:reference", "fused_bugs:proj_head_axes_swapped", "blocks.0.attn.proj", "proj's input split (d_head, H)"),
    "scores_over_d_head": ("fused_torch:reference", "fused_bugs:scores_over_d_head", "blocks.0.attn.proj", "scores scaled by 1/d_head"),
    "causal_mask_off": ("fused_torch:reference", "fused_bugs:causal_mask_off", "blocks.0.attn.proj", "no causal mask"),
    "group_norm_eps": (
        "vae_torch:reference",
        "vae_bugs:group_norm_eps",
        "attn.group_norm",
        "GroupNorm at torch's default 1e-5 where the block sets 1e-6",
    ),
    "positions_width_major": ("vae_torch:reference", "vae_bugs:positions_width_major", "attn.to_q", "the map flattened W before H"),
    "residual_before_out": ("vae_torch:reference", "vae_bugs:residual_before_out", "attn.to_out", "to_out(context + x), not x + to_out(context)"),
    "conv_kernel_reshaped": (
        "vae_torch:reference",
        "vae_bugs:conv_kernel_reshaped",
        "conv_out",
        "(out, in, kH, kW) reshaped, not transposed, to (kH, kW, in, out)",
    ),
    "lstm_gates_tf_order": ("rnn_torch:lstm", "rnn_bugs:lstm_gates_tf_order", "lstm", "torch's gates i, f, g, o read in TF1's order i, g, f, o"),
    "lstm_hidden_bias_dropped": ("rnn_torch:lstm", "rnn_bugs:lstm_hidden_bias_dropped", "lstm", "each cell bias b_ih alone, b_hh dropped"),
    "lstm_batch_first_ignored": ("rnn_torch:lstm", "rnn_bugs:lstm_batch_first_ignored", "lstm", "a time-major nnx.RNN given batch-first inputs"),
    "gru_hn_folded": ("rnn_torch:gru", "rnn_bugs:gru_hn_folded", "gru", "b_hn summed into nnx.GRUCell's input bias, outside r *"),
    "gru_keras_gate_order": ("rnn_torch:gru", "rnn_bugs:gru_keras_gate_order", "gru", "Keras's gate order z, r, h: r and z swapped"),
    "gru_carry_detached": (
        "rnn_torch:gru",
        "rnn_bugs:gru_carry_detached",
        "gru.weight_ih_l0",
        "stop_gradient on the carry at every step: the same outputs, other gradients",
        "gradient",
        "float32",
    ),
    "scan_out_kernel_transposed": (
        "gpt2_scan_convert:reference",
        "gpt2_scan_bugs:out_kernel_transposed_layer1",
        "transformer.h.1.attn.c_proj",
        "the converter transposes layer 1's square c_proj kernel only (its slice of the stack)",
    ),
    "scan_out_kernel_transposed_linen": (
        "gpt2_scan_convert:reference",
        "gpt2_scan_bugs:out_kernel_transposed_layer1_linen",
        "transformer.h.1.attn.c_proj",
        "the same in the nn.scan port",
    ),
    "scan_mask_off": ("gpt2_scan_convert:reference", "gpt2_scan_bugs:mask_off_layer1", "transformer.h.1.attn.c_proj", "layer 1's attention unmasked"),
    "gru_cell_without_b_hn": (
        "rnn_torch:gru_zero_hn",
        "rnn_convert:ported_gru_flax",
        "gru.bias_hh_l0",
        "nnx.GRUCell has no room for torch's b_hn: with b_hn zero the outputs agree, its gradient does not (the lint says why)",
        "gradient",
        "float32",
    ),
}


def _shaped_bug(reference: str, port: str, parts_at: str, what: str, section: str = "output", dtype: str = "float64") -> Bug:
    return Bug(f"{ZOO}.{reference}", f"{ZOO}.{port}", parts_at, section, what, dtype)


SHAPED_BUGS = {name: _shaped_bug(*row) for name, row in _SHAPED_TABLE.items()}

# --train: (reference factory, port factory, the step where the trainings part, 0 where they do not):
# torch's LSTM trains b_ih and b_hh apart, a JAX cell holds their sum, so that pair parts at once
TRAINED = {
    "heads": (f"{ZOO}.heads_train:reference", f"{ZOO}.heads_train:port", 0),
    "heads_equinox": (f"{ZOO}.heads_train:reference", f"{ZOO}.heads_train:port_equinox", 0),
    "fused": (f"{ZOO}.fused_train:reference", f"{ZOO}.fused_train:port", 0),
    "vae": (f"{ZOO}.vae_train:reference", f"{ZOO}.vae_train:port", 0),
    "lstm_no_bias_equinox": (f"{ZOO}.rnn_train:lstm_no_bias_reference", f"{ZOO}.rnn_train:lstm_no_bias_port", 0),
    "gru_no_bias_equinox": (f"{ZOO}.rnn_train:gru_no_bias_reference", f"{ZOO}.rnn_train:gru_no_bias_port", 0),
    "lstm_summed_biases": (f"{ZOO}.rnn_train:lstm_reference", f"{ZOO}.rnn_train:lstm_port", 1),
    "gpt2_scan": (f"{ZOO}.gpt2_scan_train:reference", f"{ZOO}.gpt2_scan_train:port", 0),
    "gpt2_scan_split": (f"{ZOO}.gpt2_scan_train:reference", f"{ZOO}.gpt2_scan_train:port_split", 0),
}


def resolve(spec: str):
    """The function `package.module:function` names."""
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)


def build(spec: str, **kwargs):
    """What the factory `spec` returns, called with `kwargs` (dtype="float64", say)."""
    return resolve(spec)(**kwargs)
