"""glibc's malloc settings, the one place the project sets them: each policy is named in POLICIES
with what it is for and the benchmark row that justifies it, and applied by `use` (for the rest
of the process) or, for the port check's runs, by `kept_for_reuse` (for a block).

Why: a run that allocates and frees blocks of the same sizes over and over (every NumPy training
step's temporaries, ~100 KiB each; a large model's layers, a GPT-2 small attention block's 100 MB
of float64 scores, then their mask, then their softmax) meets glibc's starting thresholds, which
hand every block above the mmap threshold (128 KiB at first, at most 32 MiB) back to the kernel
as soon as it is freed, so the next one of that size page-faults each of its 4 KiB pages in again,
zeroed anew; on a virtual machine a fault costs microseconds. Frameworks keep theirs in their own
allocators. Results are the same under every policy: only where memory comes from changes.

Nothing is set where glibc is not the C library (macOS, musl, Windows): `use` returns False.
`kept_for_reuse` also changes nothing where the process was started with its own malloc settings
(GLIBC_TUNABLES glibc.malloc.*, MALLOC_*_ variables): those are the user's to choose. A program
that calls mallopt itself while a block runs gets glibc's settled values back after it: glibc has
no call that reads them.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import threading
from collections.abc import Iterator

# mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4

KEPT = 2**31 - 1  # mallopt takes a C int: the largest threshold it can be told
# the largest block a port check's run keeps for reuse: GPT-2 small's largest at 1024 tokens (its
# float64 logits, 411 MB) stay; a larger one (a 1B model's embedding read as float64, 2 GB) is
# mapped and handed back when freed. Kept, a block of that size is not reused by the next one of
# the same size (torch asks a few bytes more, for alignment), and each would add its size to the
# process: six 2 GB blocks in turn left 5.9 GiB resident, against 0.1 GiB with this threshold
KEPT_BLOCK = 512 * 1024 * 1024
SETTLED_MMAP = 4 * 1024 * 1024 * ctypes.sizeof(ctypes.c_long)  # DEFAULT_MMAP_THRESHOLD_MAX: 32 MiB on 64-bit
SETTLED_TRIM = 2 * SETTLED_MMAP  # the dynamic rule keeps the trim threshold at twice the mmap threshold

# policy -> ((mallopt option, value), ...), what it is for, and the row of benchmarks/RESULTS.md
# that justifies it
POLICIES: dict[str, tuple[tuple[tuple[int, int], ...], str]] = {
    "settled": (
        ((M_MMAP_THRESHOLD, SETTLED_MMAP), (M_TRIM_THRESHOLD, SETTLED_TRIM)),
        "the NumPy trainer (glibc's own settled thresholds, reached at once): the NumPy training table's numpy rows",
    ),
    "kept": (
        ((M_MMAP_THRESHOLD, KEPT_BLOCK), (M_TRIM_THRESHOLD, KEPT)),
        "a port check's model runs, for the block only (kept_for_reuse): the port check at GPT-2 small's size and at 1B",
    ),
    "never_unmapped": (
        ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, KEPT)),
        "benchmarks/attention.py --keep-freed-memory: its rows measured with freed memory resident",
    ),
    "returned": (
        ((M_MMAP_THRESHOLD, 1 << 16),),
        "benchmarks/attention.py's memory probe: resident memory follows what is alive (its memory columns)",
    ),
}

_lock = threading.Lock()
_depth = 0  # blocks open now (threads, nesting): only the outermost one sets and settles


def user_settings(environ=os.environ) -> list[str]:
    """The malloc settings the process was started with: GLIBC_TUNABLES' glibc.malloc.* entries
    and the MALLOC_*_ variables glibc reads; [] when there are none."""
    tunables = [entry for entry in environ.get("GLIBC_TUNABLES", "").split(":") if entry.startswith("glibc.malloc.")]
    return tunables + sorted(name for name in environ if name.startswith("MALLOC_") and name.endswith("_"))


@functools.cache
def _glibc():
    """glibc's handle, or None where the C library is another."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def use(policy: str) -> bool:
    """Set `policy` (a key of POLICIES) for the rest of this process; False where there is no
    glibc, or where it refuses one of its settings."""
    libc = _glibc()
    settings, _ = POLICIES[policy]
    return libc is not None and all([bool(libc.mallopt(option, value)) for option, value in settings])


def _libc():
    """glibc's handle for kept_for_reuse, or None where the C library is another or malloc is the
    user's to set."""
    return None if user_settings() else _glibc()


@contextlib.contextmanager
def kept_for_reuse() -> Iterator[None]:
    """For the block: freed memory stays in the heap for the next allocations; after it (also on
    error), glibc's settled thresholds and the free heap handed back. A no-op where glibc is not
    the C library or the process set its own malloc settings."""
    global _depth
    libc = _libc()
    if libc is None:
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            for option, value in POLICIES["kept"][0]:
                libc.mallopt(option, value)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for option, value in POLICIES["settled"][0]:
                    libc.mallopt(option, value)
                libc.malloc_trim(0)


def hand_back() -> bool:
    """Return the free memory of every arena to the kernel now (glibc's malloc_trim): memory that
    another thread freed (a framework's own workers), which this thread's allocations cannot
    reuse, would otherwise stay resident beside them. False where there is no glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
