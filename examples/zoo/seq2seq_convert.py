"""The converter of the encoder-decoder pair: the reference's state_dict -> the Linen port's
variables ({Flax path: array}, Flax layout), every array used exactly once, every variable filled;
and the factory of the port with converted weights (what `mhsa port-check` checks by default).

The shared embedding: state_dict lists one tensor as shared.weight, encoder.embed_tokens.weight
and decoder.embed_tokens.weight; they are checked equal and written to shared.embedding. Like the
popular library's converters, this one also keeps encoder.embed_tokens.embedding, a variable that
the port never reads (its encoder reads `shared`). Linear weight (out, in) -> kernel (in, out);
LayerNorm weight -> scale; the embedding unscaled (both sides scale on the way out)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from examples.zoo import inputs, seq2seq_linen, seq2seq_torch
from examples.zoo.configs import Seq2SeqConfig
from examples.zoo.convert import StateDict, linen_variables
from examples.zoo.torch_weights import numpy_state

TINY = Seq2SeqConfig()
LEFTOVER = "encoder.embed_tokens.embedding"  # never read by the port: the encoder reads shared
ATTENTION = ("q_proj", "k_proj", "v_proj", "out_proj")


def shared(take: StateDict) -> np.ndarray:
    """shared.weight, after checking that both stacks' embed_tokens are the same array."""
    weight = take("shared.weight")
    for stack in ("encoder", "decoder"):
        if not np.array_equal(take(f"{stack}.embed_tokens.weight"), weight):
            raise ValueError(f"{stack}.embed_tokens.weight differs from shared.weight: the reference is not shared, the port is")
    return weight


def _layer(take: StateDict, prefix: str, attentions: tuple[str, ...], norms: tuple[str, ...]) -> dict[str, np.ndarray]:
    arrays = {}
    linears = [f"{prefix}.{attention}.{proj}" for attention in attentions for proj in ATTENTION] + [f"{prefix}.mlp.fc1", f"{prefix}.mlp.fc2"]
    for linear in linears:
        arrays |= {f"{linear}.kernel": take(f"{linear}.weight").T, f"{linear}.bias": take(f"{linear}.bias")}  # (out, in) -> (in, out)
    for norm in [f"{prefix}.{name}" for name in norms]:
        arrays |= {f"{norm}.scale": take(f"{norm}.weight"), f"{norm}.bias": take(f"{norm}.bias")}
    return arrays


def to_flax(state: Mapping[str, np.ndarray], config: Seq2SeqConfig = TINY) -> dict[str, np.ndarray]:
    """torch state_dict (NumPy) -> {Linen variable path: array in Flax layout}, the leftover included."""
    take = StateDict(state)
    embedding = shared(take)
    arrays = {"shared.embedding": embedding, LEFTOVER: embedding.copy()}
    for i in range(config.n_layers):
        arrays |= _layer(take, f"encoder.layers.{i}", ("self_attn",), ("self_attn_layer_norm", "final_layer_norm"))
        arrays |= _layer(
            take, f"decoder.layers.{i}", ("self_attn", "encoder_attn"), ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")
        )
    for stack in ("encoder", "decoder"):
        arrays |= {f"{stack}.layer_norm.scale": take(f"{stack}.layer_norm.weight"), f"{stack}.layer_norm.bias": take(f"{stack}.layer_norm.bias")}
    take.finish()
    return arrays


def ported(dtype: str = "float32", module: seq2seq_linen.Seq2Seq | None = None, convert=to_flax):
    """The Linen port (`module`, the faithful one by default) as (module, the reference's weights
    through `convert`), and the reference's inputs: a factory for `mhsa port-check`."""
    module, x = module or seq2seq_linen.Seq2Seq(TINY), inputs.seq2seq(TINY)
    return (module, linen_variables(module, x, convert(numpy_state(seq2seq_torch.build()), TINY), dtype, unread=(LEFTOVER,))), x
