"""`--threads N` for every command that computes: how many threads torch, XLA and NumPy's BLAS
may use. The default leaves each library at its own default (one thread per core), except the
trainers': a model as small as the lesson's trains on one thread (default_train_threads).

On a busy machine a second torch thread can slow a small model's training by an order of
magnitude or more while it waits for a core (docs/performance.md, "Threads"; the one-thread
rows of benchmarks/RESULTS.md's training tables): `--threads 1` avoids that.

- torch: OMP_NUM_THREADS=N before torch starts (torch sizes its pool from it), or
  torch.set_num_threads(N) if it already has.
- NumPy's BLAS (and torch's OpenMP, where threadpoolctl sees it): threadpoolctl's limit.
- XLA (JAX) reads its thread settings once, when JAX starts: N = 1 asks for a single-threaded
  CPU backend (--xla_cpu_multi_thread_eigen=false); XLA has no setting for other counts, so
  N > 1 leaves it at one thread per core. Set before JAX starts; after that it cannot change.
"""

from __future__ import annotations

import argparse
import os
import sys

from mhsa.flags import int_flag

XLA_SINGLE_THREAD = "--xla_cpu_multi_thread_eigen=false"


def add_threads_argument(parser: argparse.ArgumentParser, default: str = "each library's own") -> None:
    parser.add_argument(
        "--threads",
        type=int_flag("--threads"),
        metavar="N",
        help=f"threads for torch, NumPy's BLAS and (N = 1) XLA, in [1, 1024] (default: {default})",
    )


def apply_threads(threads: int | None) -> None:
    """Limit every library to `threads`; None changes nothing. Call before the frameworks start."""
    if threads is None:
        return
    if threads == 1 and XLA_SINGLE_THREAD not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {XLA_SINGLE_THREAD}".strip()
    os.environ["OMP_NUM_THREADS"] = str(threads)  # torch sizes its pool from it when it starts
    if "torch" in sys.modules:  # already started: tell it directly
        sys.modules["torch"].set_num_threads(threads)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads)  # NumPy's BLAS, already loaded, for the rest of the process


# multiply-adds of one training step below which the trainers default to one thread: a step this
# small (the default run's is under 3 million) is over before a second thread has work to share,
# and on a busy machine every parallel region waits for a scheduler tick (docs/performance.md)
ONE_THREAD_WORK = 200_000_000


def default_train_threads(batch_size: int, seq_len: int, d_model: int, vocab_size: int) -> int | None:
    """The trainers' --threads when none is given: 1 for a step under ONE_THREAD_WORK
    multiply-adds, otherwise None (each library's own). A step's work is its tokens times the
    weights each token passes through (QKV and output projections 4·D², the head D·V) plus the
    attention scores and sums (2·T·D per token)."""
    work = batch_size * seq_len * (4 * d_model * d_model + d_model * vocab_size + 2 * seq_len * d_model)
    return 1 if work < ONE_THREAD_WORK else None
