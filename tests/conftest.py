"""Test set-up: JAX float64 on (every layer gets an explicit dtype, so float32 tests stay
float32), and the `backend` fixture that runs a test once per implementation."""

import jax
import pytest

jax.config.update("jax_enable_x64", True)

from tests.backends import BACKENDS  # noqa: E402  (after x64 is on)


@pytest.fixture(params=sorted(BACKENDS), ids=str)
def backend(request):
    return BACKENDS[request.param]


@pytest.fixture(params=["torch", "jax"], ids=str)
def autodiff_backend(request):
    return BACKENDS[request.param]
