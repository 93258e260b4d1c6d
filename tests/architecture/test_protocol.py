"""Every registered backend provides what shared.protocol says, for each capability the
registry lists; the registry is the one list of backends, and its first is a reference that
needs no framework."""

import inspect

import pytest

from mhsa import registry
from shared import protocol
from tests.architecture.test_layers import FRAMEWORKS, imports, project_sources


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


def framework_imports(package: str) -> list[str]:
    """'module imports framework' for every module of `package`, and every project module it
    reaches through its imports, that imports a framework (read statically, as test_layers reads
    them; a trainer's `__main__` launcher, which hands over to the tools, is not the library)."""
    sources = project_sources()
    found, reached, todo = [], set(), [module for module in sources if module.split(".")[0] == package]
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        for statement in imports(sources[module], skip_main_launcher=True):
            if statement[0].split(".")[0] in FRAMEWORKS:
                found.append(f"{module} imports {statement[0]}")
            todo += [name for name in statement if name in sources]
    return sorted(found)


def test_the_reference_every_parity_row_compares_against_runs_on_numpy_alone():
    """mhsa.parity holds every backend against the registry's first and takes its float64 finite
    difference from that backend's loss_fn on NumPy arrays (mhsa/parity/adapters.py): the first
    backend has its own gradient, and neither it nor the contract it uses imports a framework."""
    reference = registry.get(registry.names()[0])
    assert "grads" in reference.supports
    assert framework_imports(reference.package) == []
    assert framework_imports("torch_impl"), "the check sees a framework where there is one"


def test_an_unknown_backend_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown backend 'tf'; expected one of numpy, torch, jax"):
        registry.get("tf")
