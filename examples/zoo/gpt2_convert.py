"""The converter of the GPT-2 pair: the reference's state_dict -> the port's variables ({Flax path:
array}, Flax layout), every array used exactly once, every variable filled; the NNX and the Linen
port share the names, so one converter serves both. And the factories of the ports with converted
weights (what `mhsa port-check` checks by default).

Layouts: Conv1D weights are (in, out) already, Flax's kernel layout: copied as they are (the
classic mistake is transposing them as if they were nn.Linear's); LayerNorm weight -> scale;
Embedding weight -> embedding. lm_head.weight is the same tensor as transformer.wte.weight: checked
equal, then dropped (the port ties it through wte.attend)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flax import nnx

from examples.zoo import gpt2_flax, gpt2_linen, gpt2_torch, inputs
from examples.zoo.configs import GPT2Config
from examples.zoo.convert import StateDict, abstract, linen_variables, load_nnx
from examples.zoo.torch_weights import numpy_state

TINY = GPT2Config()
CONV1DS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def tied(take: StateDict) -> np.ndarray:
    """transformer.wte.weight, after checking that lm_head.weight is the same array."""
    wte = take("transformer.wte.weight")
    if not np.array_equal(take("lm_head.weight"), wte):
        raise ValueError("lm_head.weight differs from transformer.wte.weight: the reference is not tied, the port is")
    return wte


def to_flax(state: Mapping[str, np.ndarray], config: GPT2Config = TINY) -> dict[str, np.ndarray]:
    """torch state_dict (NumPy) -> {Flax variable path: array in Flax layout}."""
    take = StateDict(state)
    arrays = {"transformer.wte.embedding": tied(take), "transformer.wpe.embedding": take("transformer.wpe.weight")}
    arrays |= {f"transformer.ln_f.{name}": take(f"transformer.ln_f.{torch}") for name, torch in (("scale", "weight"), ("bias", "bias"))}
    for i in range(config.n_layers):
        block = f"transformer.h.{i}."
        for norm in ("ln_1", "ln_2"):
            arrays |= {f"{block}{norm}.scale": take(f"{block}{norm}.weight"), f"{block}{norm}.bias": take(f"{block}{norm}.bias")}
        for conv in CONV1DS:
            arrays |= {f"{block}{conv}.kernel": take(f"{block}{conv}.weight"), f"{block}{conv}.bias": take(f"{block}{conv}.bias")}  # (in, out) both
    take.finish()
    return arrays


def reference_arrays(convert=to_flax) -> dict[str, np.ndarray]:
    """The reference's weights (gpt2_torch.build()) through `convert`."""
    return convert(numpy_state(gpt2_torch.build()), TINY)


def ported(dtype: str = "float32"):
    """The NNX port with converted weights and the reference's inputs: a factory for `mhsa port-check`."""
    return load_nnx(abstract(lambda: gpt2_flax.GPT2LMHeadModel(TINY, dtype=dtype, rngs=nnx.Rngs(0))), reference_arrays()), inputs.gpt2(TINY)


def ported_linen(dtype: str = "float32"):
    """The Linen port as (module, converted variables), and the reference's inputs."""
    module, x = gpt2_linen.GPT2LMHeadModel(TINY), inputs.gpt2(TINY)
    return (module, linen_variables(module, x, reference_arrays(), dtype)), x
