"""Deterministic tables that a model builds rather than learns, computed once in NumPy so that both
frameworks' models start from the same numbers: a fresh port holds them exactly as the reference
does, though none of its other weights are the reference's."""

from __future__ import annotations

import numpy as np


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
    """(length, channels) float32: position p's row is [sin(p w_0), ..., sin(p w_{c/2-1}), cos(p w_0), ...],
    the sines and cosines concatenated (Whisper's layout), timescales w_i geometric from 1 to
    1 / max_timescale."""
    if channels % 2 or channels < 4:
        raise ValueError(f"a sinusoidal table needs an even number of channels, at least 4; got {channels}")
    half = channels // 2
    inv_timescales = np.exp(-np.log(max_timescale) / (half - 1) * np.arange(half))  # (c/2,)
    scaled_time = np.arange(length)[:, None] * inv_timescales[None, :]  # (length, c/2)
    return np.concatenate([np.sin(scaled_time), np.cos(scaled_time)], axis=1).astype(np.float32)
