"""Test set-up: JAX float64 on (every layer gets an explicit dtype, so float32 tests stay
float32), and fixtures that run a test once per registered backend, or once per backend
with a capability of shared.protocol."""

import jax
import pytest

jax.config.update("jax_enable_x64", True)

from tests.backends import ADAPTERS, names  # noqa: E402  (after x64 is on)


@pytest.fixture(params=names(), ids=str)
def backend(request):
    return ADAPTERS[request.param]


@pytest.fixture(params=names("grads"), ids=str)
def autodiff_backend(request):
    """Backends with their own gradient (loss_and_grads)."""
    return ADAPTERS[request.param]


@pytest.fixture(params=names("fused"), ids=str)
def fused_backend(request):
    """Backends with a fused attention kernel behind ModelConfig(attn_impl="fused")."""
    return ADAPTERS[request.param]


@pytest.fixture(params=names("train"), ids=str)
def trainer_backend(request):
    return ADAPTERS[request.param]
