"""The one list of backends. Every tool, every command-line choice and every test
parametrization comes from here; adding a backend is a package that satisfies
shared.protocol plus one line in REGISTRY.

Backends are imported only when used, so listing them costs nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Backend:
    name: str  # what users type: --backend NAME
    package: str  # the package that implements shared.protocol
    supports: frozenset[str]  # capabilities of shared.protocol.CAPABILITIES
    framework: str  # the module its start-up is measured against (benchmarks/train.py: `import FRAMEWORK`)

    def module(self, part: str) -> ModuleType:
        """The backend's `attention`, `model` or `train` module (imported on first use)."""
        return importlib.import_module(f"{self.package}.{part}")

    @property
    def model(self) -> ModuleType:
        return self.module("model")

    @property
    def train(self) -> ModuleType:
        return self.module("train")

    @property
    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None


REGISTRY: dict[str, Backend] = {
    backend.name: backend
    for backend in (
        Backend("numpy", "numpy_ref", frozenset({"grads", "train", "generate"}), "numpy"),
        Backend(
            "torch", "torch_impl", frozenset({"layers", "grads", "train", "train_check", "fused", "generate", "dp", "device", "compile"}), "torch"
        ),
        Backend("jax", "jax_impl", frozenset({"layers", "grads", "train", "train_check", "fused", "jit", "generate", "dp", "device"}), "jax"),
    )
}


def names(supporting: str | None = None) -> list[str]:
    """Registered backend names in registry order, optionally only those with a capability."""
    return [name for name, backend in REGISTRY.items() if supporting is None or supporting in backend.supports]


def get(name: str) -> Backend:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(REGISTRY)}") from None
