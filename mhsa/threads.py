"""`--threads N` for every command that computes: how many threads torch, XLA and NumPy's BLAS
may use. The default leaves each library at its own default (one thread per core).

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


def one_torch_thread() -> None:
    """torch alone on one thread, the other libraries at their own defaults: torch sizes its pool
    from OMP_NUM_THREADS when it starts, or is told directly if it has started already."""
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
