"""Where a JAX run computes: the device of a run, and float32 matmuls at full precision for runs
compared across backends (shared.protocol, capability "device")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import jax.extend.backend


def resolve(name: str) -> jax.Device:
    """The JAX device for a checked device name (shared.training.check_device): the first CPU
    device, or the first CUDA device. Raises ValueError when JAX has no such backend (a CPU-only
    jaxlib has no CUDA)."""
    try:
        return jax.devices("cuda" if name == "cuda" else "cpu")[0]
    except RuntimeError:  # JAX: "Unknown backend cuda" (no CUDA plugin) or no device on it
        names = ", ".join(sorted(jax.extend.backend.backends()))
        raise ValueError(f"device {name!r}: jax sees no CUDA device (jax {jax.__version__}: backends {names})") from None


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """float32 matmuls at full precision while open, in every thread (the setting is process-wide,
    not a thread-local context): JAX's default uses TF32 on GPUs (bf16 passes on TPUs). Restored
    on exit."""
    saved = getattr(jax.config, "jax_default_matmul_precision")  # noqa: B009 - the stubs lack the flags
    jax.config.update("jax_default_matmul_precision", "highest")
    try:
        yield
    finally:
        jax.config.update("jax_default_matmul_precision", saved)


def accelerator() -> str | None:
    """The platform JAX computes on by default ('gpu', 'tpu'), or None on a CPU."""
    backend = jax.default_backend()
    return None if backend == "cpu" else backend
