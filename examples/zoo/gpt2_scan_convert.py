"""The converters of the scanned GPT-2 ports (gpt2_scan.py, gpt2_scan_linen.py): the reference's
state_dict (gpt2_torch's names, one block per layer, transformer.h.<i>.*) -> the ports' variables,
each block's arrays stacked on a new leading layer axis (np.stack over the layers) in the layout
gpt2_convert.py gives one layer; every array used exactly once. And the references (gpt2_torch's
model at gpt2_scan.CONFIG's three layers and at GROUPED's four), the factories of the ports with
converted weights, built abstractly first (convert.py says why).

    transformer.h.{0,1,2}.attn.c_proj.weight (D, D) each -> transformer.h.attn.c_proj.kernel (3, D, D)

Layouts, per layer as in gpt2_convert.py: Conv1D weights are (in, out), Flax's kernel layout,
stacked as they are; LayerNorm weight -> scale; Embedding weight -> embedding; lm_head.weight
checked equal to transformer.wte.weight and dropped (the ports tie it through wte.attend). The
grouped port (two layers per scanned step) holds layers 0, 2, ... in transformer.h.layers_0 and
1, 3, ... in transformer.h.layers_1: layer i at layers_{i % 2}[i // 2]."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from flax import nnx

from examples.zoo import gpt2_scan, gpt2_scan_linen, gpt2_torch, inputs
from examples.zoo.configs import GPT2Config
from examples.zoo.convert import StateDict, abstract, linen_variables, load_nnx
from examples.zoo.gpt2_convert import CONV1DS, tied
from examples.zoo.gpt2_scan import CONFIG, GROUP, GROUPED
from examples.zoo.torch_weights import numpy_state

NORMS = (("scale", "weight"), ("bias", "bias"))  # LayerNorm: (Flax name, torch name)


def reference():
    """gpt2_torch's model at CONFIG (three layers) and (input_ids,): the reference factory."""
    return gpt2_torch.build(CONFIG), inputs.gpt2(CONFIG)


def reference_grouped():
    """gpt2_torch's model at GROUPED (four layers) and (input_ids,): the grouped port's reference."""
    return gpt2_torch.build(GROUPED), inputs.gpt2(GROUPED)


def shared(take: StateDict) -> dict[str, np.ndarray]:
    """The arrays outside the blocks: the tied embedding, the positions, ln_f."""
    arrays = {"transformer.wte.embedding": tied(take), "transformer.wpe.embedding": take("transformer.wpe.weight")}
    return arrays | {f"transformer.ln_f.{name}": take(f"transformer.ln_f.{torch}") for name, torch in NORMS}


def stacked(take: StateDict, layers: Sequence[int], into: str) -> dict[str, np.ndarray]:
    """The blocks `layers` of the state_dict as one stacked block under `into` ("transformer.h."):
    each array (len(layers), *its one-layer Flax shape), row k from layer layers[k]."""

    def stack(torch_name: str) -> np.ndarray:
        return np.stack([take(f"transformer.h.{i}.{torch_name}") for i in layers])  # (len(layers), ...)

    arrays: dict[str, np.ndarray] = {}
    for norm in ("ln_1", "ln_2"):
        arrays |= {f"{into}{norm}.{name}": stack(f"{norm}.{torch}") for name, torch in NORMS}
    for conv in CONV1DS:
        arrays |= {f"{into}{conv}.kernel": stack(f"{conv}.weight"), f"{into}{conv}.bias": stack(f"{conv}.bias")}  # (L, in, out), (L, out)
    return arrays


def to_flax(state: Mapping[str, np.ndarray], config: GPT2Config = CONFIG) -> dict[str, np.ndarray]:
    """torch state_dict (NumPy) -> {variable path: array} of the scanned ports (NNX and Linen alike):
    transformer.h.* stacked over all n_layers."""
    take = StateDict(state)
    arrays = shared(take) | stacked(take, range(config.n_layers), "transformer.h.")
    take.finish()
    return arrays


def to_flax_grouped(state: Mapping[str, np.ndarray], config: GPT2Config = GROUPED) -> dict[str, np.ndarray]:
    """torch state_dict (NumPy) -> {variable path: array} of the grouped port: layer i into
    transformer.h.layers_{i % GROUP}, row i // GROUP."""
    if config.n_layers % GROUP:
        raise ValueError(f"blocks of {GROUP} layers need an even n_layers; got {config.n_layers}")
    take = StateDict(state)
    arrays = shared(take)
    for k in range(GROUP):
        arrays |= stacked(take, range(k, config.n_layers, GROUP), f"transformer.h.layers_{k}.")
    take.finish()
    return arrays


def reference_arrays(convert=to_flax, config: GPT2Config = CONFIG) -> dict[str, np.ndarray]:
    """The reference's weights (gpt2_torch.build(config)) through `convert`."""
    return convert(numpy_state(gpt2_torch.build(config)), config)


def _ported(cls: type[gpt2_scan.ScanGPT2LMHeadModel], dtype: str, config: GPT2Config = CONFIG, convert=to_flax):
    model = abstract(lambda: cls(config, dtype=dtype, rngs=nnx.Rngs(0)))
    return load_nnx(model, reference_arrays(convert, config)), inputs.gpt2(config)


def ported(dtype: str = "float32"):
    """The nnx.scan port with converted weights and the reference's inputs: a factory for `mhsa port-check`."""
    return _ported(gpt2_scan.ScanGPT2LMHeadModel, dtype)


def ported_split(dtype: str = "float32"):
    """The jax.lax.scan (split state) port with converted weights."""
    return _ported(gpt2_scan.SplitScanGPT2LMHeadModel, dtype)


def ported_grouped(dtype: str = "float32"):
    """The grouped port (two layers per step) with reference_grouped's weights converted."""
    return _ported(gpt2_scan.GroupedScanGPT2LMHeadModel, dtype, GROUPED, to_flax_grouped)


def ported_remat(dtype: str = "float32"):
    """The rematerialized nnx.scan port with converted weights."""
    return _ported(gpt2_scan.RematScanGPT2LMHeadModel, dtype)


def ported_linen(dtype: str = "float32"):
    """The Linen port as (module, converted variables), and the reference's inputs."""
    module, x = gpt2_scan_linen.ScanGPT2LMHeadModel(CONFIG), inputs.gpt2(CONFIG)
    return (module, linen_variables(module, x, reference_arrays(), dtype)), x
