"""The registered backends behind one NumPy interface (mhsa.parity.adapters), and the odd,
distinct sizes the tests use so that a swapped axis fails."""

import inspect

import numpy as np
import pytest

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


def native(name: str, array):
    """A NumPy array as the framework's own array of backend `name`, what a user hands a layer or a model."""
    framework = registry.get(name).framework
    if framework == "torch":
        import torch

        return torch.from_numpy(np.asarray(array))
    if framework == "jax":
        import jax

        return jax.device_put(np.asarray(array))  # as jnp.asarray, without a staging program compiled per shape
    return np.asarray(array)


def called_directly(name: str, arrays: dict, config: ModelConfig = SMALL):
    """(block(x, mask=None), model(tokens, mask=None)) of backend `name`, called as a user calls
    them: the framework's layer and model on its own arrays, each call checked first by its public
    check (x and tokens are converted here, a mask is passed as it is given); numpy_ref's
    attention function, checked by check_attention, and TinyLM on NumPy arrays."""
    backend = registry.get(name)
    model = backend.model.from_exchange(arrays, config)
    if "layers" in backend.supports:

        def block(x, mask=None):
            x = native(name, x)
            model.attn.check(x, mask)
            return model.attn(x, mask=mask)

    else:
        attention = backend.module("attention")

        def block(x, mask=None):
            attention.check_attention(x, model.params, config.n_heads, mask)
            return attention.attention(x, model.params, config.n_heads, mask=mask)

    def whole(ids, mask=None):
        ids = native(name, ids)
        model.check(ids, mask)
        return model(ids, mask=mask)

    return block, whole


def skip_where_cuda_is_seen(name: str) -> None:
    """Skip the test where backend `name` sees a CUDA device: it tests the refusal of "cuda"."""
    try:
        registry.get(name).module("device").resolve("cuda")
    except ValueError:
        return
    pytest.skip(f"{name} sees a CUDA device here")
