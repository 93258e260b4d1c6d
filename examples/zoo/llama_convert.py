"""The converter of the Llama pair, written as a porter writes one: the reference's state_dict ->
the NNX port's variables ({Flax path: array}, Flax layout), every array of the state_dict used
exactly once and every variable of the port filled; and the factories of the port with converted
weights (the user who ran their converter, which is what `mhsa port-check` checks by default).

Layouts: Linear weights (out, in) -> kernels (in, out), transposed; RMSNorm weight -> scale;
Embedding weight -> embedding, unchanged. The tied output layer is the embedding: nothing else
to convert."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flax import nnx

from examples.zoo import inputs, llama_flax, llama_torch
from examples.zoo.configs import LlamaConfig, llama_3_2_1b
from examples.zoo.convert import StateDict, abstract, load_nnx
from examples.zoo.torch_weights import numpy_state

TINY = LlamaConfig()
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def to_flax(state: Mapping[str, np.ndarray], config: LlamaConfig = TINY) -> dict[str, np.ndarray]:
    """torch state_dict (NumPy) -> {NNX variable path: array in Flax layout}."""
    take = StateDict(state)
    arrays = {"embed_tokens.embedding": take("embed_tokens.weight"), "norm.scale": take("norm.weight")}
    for i in range(config.n_layers):
        layer = f"layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            arrays[f"{layer}{norm}.scale"] = take(f"{layer}{norm}.weight")
        for linear in LINEARS:
            arrays[f"{layer}{linear}.kernel"] = take(f"{layer}{linear}.weight").T  # (out, in) -> (in, out)
    take.finish()
    return arrays


def port(model: llama_flax.Llama, convert=to_flax, *, complete: bool = True) -> llama_flax.Llama:
    """`model` with the reference's weights (llama_torch.build()) written in by `convert`."""
    return load_nnx(model, convert(numpy_state(llama_torch.build()), TINY), complete=complete)


def ported(dtype: str = "float32"):
    """The port with converted weights and the reference's inputs: a factory for `mhsa port-check`."""
    return port(abstract(lambda: llama_flax.Llama(TINY, dtype=dtype, rngs=nnx.Rngs(0)))), inputs.llama(TINY)


def ported_keywords(dtype: str = "float32"):
    """`ported` with {"input_ids", "attention_mask"} as keyword inputs."""
    return port(abstract(lambda: llama_flax.Llama(TINY, dtype=dtype, rngs=nnx.Rngs(0)))), inputs.llama_keywords(TINY)


def large(batch: int = 1, length: int = 32):
    """llama_torch.large's model converted to a port built abstractly, and its inputs: for benchmarks."""
    reference, batch_inputs = llama_torch.large(batch, length)
    config = llama_3_2_1b()
    arrays = to_flax(numpy_state(reference), config)
    return load_nnx(abstract(lambda: llama_flax.Llama(config, dtype="float32", rngs=nnx.Rngs(0))), arrays), batch_inputs
