"""Input checks shared by every backend, over shapes and dtype names, so that the same bad
input raises the same exception with the same message in NumPy, PyTorch and JAX."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

# the index dtypes every backend embeds: torch's nn.Embedding refuses any other
TOKEN_DTYPES = ("int32", "int64")


def check_block(d_model, n_heads, max_len) -> None:
    """Sizes of one attention block: positive integers with d_model % n_heads == 0.

    max_len None: no context limit (numpy_ref's pure attention function)."""
    sizes = (("d_model", d_model), ("n_heads", n_heads)) + ((("max_len", max_len),) if max_len is not None else ())
    for name, value in sizes:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        if value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value}")
    if d_model % n_heads != 0:
        raise ValueError(
            f"d_model={d_model} is not divisible by n_heads={n_heads}; "
            f"d_model must be a multiple of n_heads (d_head = d_model // n_heads)"
        )


def dtype_kind(name: str) -> str:
    """'float', 'int', 'bool' or 'other' for a dtype name such as 'float32' or 'torch.int64'."""
    name = _neutral(name)
    if name == "bool":
        return "bool"
    if name.startswith(("float", "bfloat")):
        return "float"
    if name.startswith(("int", "uint")):
        return "int"
    return "other"


def _neutral(name: str) -> str:
    # 'torch.float32' -> 'float32': the same message in every backend
    return str(name).removeprefix("torch.")


def check_input(shape: tuple, dtype_name: str, d_model: int, max_len: int | None) -> None:
    """x must be a float (B, T, D) with D == d_model and 1 <= T <= max_len (no limit if None)."""
    if dtype_kind(dtype_name) != "float":
        raise TypeError(f"attention input must be a floating-point array (B, T, D), got dtype {_neutral(dtype_name)}")
    if len(shape) != 3:
        raise ValueError(f"attention input must have rank 3 (B, T, D), got rank {len(shape)} with shape {tuple(shape)}")
    _, T, D = shape
    if D != d_model:
        raise ValueError(f"attention input width D={D} does not match d_model={d_model} (input shape {tuple(shape)})")
    check_length(T, max_len)


def check_tokens(shape: tuple, dtype_name: str, vocab_size: int, max_len: int, low=None, high=None) -> None:
    """tokens must be integer (B, T) with 1 <= T <= max_len and every id in [0, vocab_size).

    `low` and `high` are the smallest and largest id when they are known (None while tracing).
    """
    if _neutral(dtype_name) not in TOKEN_DTYPES:
        raise TypeError(f"tokens must be an integer array (B, T) of {' or '.join(TOKEN_DTYPES)}, got dtype {_neutral(dtype_name)}")
    if len(shape) != 2:
        raise ValueError(f"tokens must have rank 2 (B, T), got rank {len(shape)} with shape {tuple(shape)}")
    check_length(shape[1], max_len)
    if low is not None and (low < 0 or high >= vocab_size):
        bad = low if low < 0 else high
        raise ValueError(f"token id {bad} is out of range: ids must lie in [0, {vocab_size}) for vocab_size={vocab_size}")


def check_length(T: int, max_len: int | None) -> None:
    if T < 1:
        raise ValueError(f"sequence length T={T} must be at least 1")
    if max_len is not None and T > max_len:
        raise ValueError(f"sequence length T={T} is longer than max_len={max_len}")


def check_mask(mask_shape: tuple, dtype_name: str, target: tuple) -> None:
    """A mask (True = may attend) must be boolean and broadcast to `target` = (B, H, T, T)."""
    if dtype_kind(dtype_name) != "bool":
        raise TypeError(f"mask must be a boolean array (True = may attend), got dtype {_neutral(dtype_name)}")
    try:
        broadcast = np.broadcast_shapes(tuple(mask_shape), tuple(target))
    except ValueError:
        broadcast = None
    if broadcast != tuple(target):
        raise ValueError(f"mask of shape {tuple(mask_shape)} does not broadcast to (B, H, T, T) = {tuple(target)}")


def check_writable(path, flag: str) -> None:
    """An output file a run will write at its end: refuse it before any work, not after.

    Its folder must exist and be writable, and the path must not be a folder itself."""
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a directory, expected a file name")
    if not folder.is_dir():
        raise ValueError(f"{flag} {str(path)!r}: folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {str(path)!r}: folder {str(folder)!r} is not writable")
