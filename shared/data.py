"""The copy task, as NumPy arrays, so that every backend trains on the identical stream of batches."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def copy_task(n_sequences: int, seq_len: int, vocab_size: int, seed: int) -> np.ndarray:
    """Rows of one random id repeated: int64 (N, seq_len + 1).

    One example with seq_len = 4 and the id 7:

        row    = [7, 7, 7, 7, 7]
        input  = row[:-1] = [7, 7, 7, 7]
        target = row[1:]  = [7, 7, 7, 7]

    so at every position the next token equals the current one. The first position can
    only look at itself, later ones may attend to any earlier copy.
    """
    for name, value in (("n_sequences", n_sequences), ("seq_len", seq_len), ("vocab_size", vocab_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"copy_task: {name} must be a positive integer, got {value!r}")
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, size=n_sequences, dtype=np.int64)  # (N,)
    return np.repeat(ids[:, None], seq_len + 1, axis=1)  # (N, seq_len + 1)


def batches(rows: np.ndarray, batch_size: int, epochs: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield (x, y) int64 pairs, each (batch, T), for `epochs` passes over `rows` (N, T + 1).

    x = rows[:, :-1] and y = rows[:, 1:]. Each epoch is a fresh permutation drawn from one
    NumPy Generator seeded with `seed`, so the stream depends on nothing but the arguments.
    The last batch of an epoch is smaller when batch_size does not divide N; nothing is dropped.
    """
    if rows.ndim != 2 or rows.shape[1] < 2:
        raise ValueError(f"batches: rows must be (N, T + 1) with T >= 1, got shape {rows.shape}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
        raise ValueError(f"batches: batch_size must be a positive integer, got {batch_size!r}")
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(rows))  # (N,)
        for start in range(0, len(rows), batch_size):
            chunk = rows[order[start : start + batch_size]]  # (batch, T + 1)
            yield chunk[:, :-1], chunk[:, 1:]
