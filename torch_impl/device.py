"""Where a torch run computes: the device of a run, and float32 matmuls at full precision for runs
compared across backends (shared.protocol, capability "device")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def resolve(name: str) -> torch.device:
    """The torch device for a checked device name (shared.training.check_device): the CPU, or the
    first CUDA device. Raises ValueError when torch sees no GPU (a CPU-only build has no CUDA)."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device 'cuda': torch sees no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)")
    return torch.device(name)


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """float32 matmuls at full precision while open: TF32 off for matmuls and cuDNN (cuDNN's is on
    by default), restored on exit."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def accelerator() -> str | None:
    """'CUDA' where torch sees a GPU, else None."""
    return "CUDA" if torch.cuda.is_available() else None
