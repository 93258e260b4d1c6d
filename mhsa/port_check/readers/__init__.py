"""The port check's readers, one folder per framework: each reads any user's model of its framework
(its parameters in the exchange convention, its submodules' outputs in call order, its gradients)
and is the only part of the port check that imports that framework: `torch/` a `torch.nn.Module`,
`flax/` a Flax NNX module or Linen pair, `equinox/` an `eqx.Module` (an optional extra), each with
the trainer of `--train`. Beside them, for any JAX library's reader: `jaxpr.py` reads a traced JAX
program (what it reads, each output's layout), `jax_program.py` runs a model as one program of its
arrays (its outputs and gradients), `optax_steps.py` what the trainers do with optax alike."""

import importlib
from typing import cast

from mhsa.port_check.readers.protocol import Reader

# the sides the port check reads, each through its own reader module (a user's model is not a
# backend of the registry: it is any torch.nn.Module, Flax NNX module or Linen pair, eqx.Module)
READERS = {
    "torch": "mhsa.port_check.readers.torch.reader",
    "jax": "mhsa.port_check.readers.flax.reader",
    "equinox": "mhsa.port_check.readers.equinox.reader",  # equinox itself imported only for an Equinox model
}
# the trainer of --train beside each reader (its module's Trainer, probe, owns, check_setup); a
# reader without one is compared by the forward check only
TRAINERS = {
    "torch": "mhsa.port_check.readers.torch.training",
    "jax": "mhsa.port_check.readers.flax.training",
    "equinox": "mhsa.port_check.readers.equinox.training",
}
# the readers' libraries that are optional extras, and how to install each
EXTRAS = {"equinox": 'pip install -e ".[equinox]"'}


def install_hint(module: str | None) -> str:
    """'; equinox is an optional extra: pip install -e ".[equinox]"' for a missing module that is a
    reader's optional extra (or one inside it); "" for any other."""
    top = (module or "").split(".")[0]
    return f"; {top} is an optional extra: {EXTRAS[top]}" if top in EXTRAS else ""


def reader_of(model) -> tuple[str, Reader]:
    """(side name, its reader: a module satisfying Reader, readers/protocol.py) that reads `model`."""
    for name, module in READERS.items():
        reader = importlib.import_module(module)
        if reader.owns(model):
            return name, cast(Reader, reader)
    raise TypeError(
        f"model of type {type(model).__name__} is not one the port check can read "
        f"(a torch.nn.Module, an nnx.Module, a Linen (module, variables) pair, or an eqx.Module)"
    )


def trainer_of(model):
    """(side name, the trainer module of --train) for `model`'s reader (reader_of)."""
    name, _ = reader_of(model)
    return name, importlib.import_module(TRAINERS[name])
