"""The registered backends behind one NumPy interface (mhsa.parity.adapters), and the odd,
distinct sizes the tests use so that a swapped axis fails."""

import inspect

from mhsa import registry
from mhsa.parity.adapters import ADAPTERS, central_difference  # noqa: F401  (used by the tests)
from mhsa.registry import names  # noqa: F401  (used by the tests)
from shared.config import ModelConfig

SMALL = ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=7)
B, T = 3, 5


def new_block(name: str, *sizes, **options):
    """The attention layer of a backend with "layers": MultiHeadSelfAttention(d_model, n_heads,
    max_len, ...). Flax layers take their random keys as `rngs` (NNX's convention)."""
    layer = registry.get(name).module("attention").MultiHeadSelfAttention
    if "rngs" in inspect.signature(layer.__init__).parameters:
        from flax import nnx

        options["rngs"] = nnx.Rngs(0)
    return layer(*sizes, **options)


def package(name: str) -> str:
    """The package of a registered backend, e.g. for `python -m PACKAGE.train`."""
    return registry.get(name).package
