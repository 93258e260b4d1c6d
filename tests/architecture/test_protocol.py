"""Every registered backend provides what shared.protocol says, for each capability the
registry lists; and the registry is the one list of backends."""

import inspect

import pytest

from mhsa import registry
from shared import protocol


def missing(backend: registry.Backend) -> list[str]:
    """'module.name' for every name the protocol requires of `backend` that it lacks."""
    required = dict(protocol.REQUIRED)
    for capability in backend.supports:
        for module, names in protocol.CAPABILITIES[capability].items():
            required[module] = required.get(module, ()) + names
    absent = []
    for module, names in required.items():
        loaded = backend.module(module)
        absent += [f"{module}.{name}" for name in names if not callable(getattr(loaded, name, None))]
    return absent


@pytest.mark.parametrize("name", registry.names())
def test_every_backend_satisfies_the_protocol(name):
    backend = registry.get(name)
    assert backend.installed, f"{backend.package} is not importable"
    assert set(backend.supports) <= set(protocol.CAPABILITIES), f"unknown capability in {sorted(backend.supports)}"
    assert missing(backend) == []


def test_a_backend_that_lacks_a_function_fails_the_protocol(monkeypatch):
    backend = registry.get(registry.names("grads")[0])
    assert missing(backend) == []  # every module of the backend imported first: one imported later would fail on the missing name
    monkeypatch.delattr(backend.model, "loss_and_grads")
    assert missing(backend) == ["model.loss_and_grads"]


@pytest.mark.parametrize("name", registry.names())
def test_numpy_facing_functions_take_the_documented_keywords(name):
    model = registry.get(name).model
    assert list(inspect.signature(model.predict).parameters) == ["model", "tokens", "mask", "return_weights", "trace"]
    assert list(inspect.signature(model.attend).parameters) == ["model", "x", "mask", "return_weights"]


def test_the_registry_lists_the_reference_first():
    # parity reports compare every backend against the first, numpy_ref, which needs no framework
    assert registry.names()[0] == "numpy" and registry.get("numpy").package == "numpy_ref"


def test_an_unknown_backend_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown backend 'tf'; expected one of numpy, torch, jax"):
        registry.get("tf")
