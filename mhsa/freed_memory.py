"""glibc's malloc settings, the one place the tools reach them: `mallopt` (the benchmarks' process-wide
settings, bench_common) and `kept_for_reuse`, freed memory kept for reuse while the port check runs
a model (the reference, the port, and the reference's float64 run: mhsa/port_check/forward/check.py,
derived.py). A speed device for those runs alone. (numpy_ref/malloc.py sets glibc's settled values
for the NumPy trainer itself: an implementation does not import a tool.)

A large model's run allocates and frees blocks of the same sizes over and over, layer after
layer (a GPT-2 small attention block: 100 MB of float64 scores, then their mask, then their
softmax). glibc hands every block above its mmap threshold (at most 32 MiB) back to the kernel
as soon as it is freed, so the next one of that size takes a page fault for each of its 4 KiB
pages, zeroed anew; on a virtual machine a fault costs microseconds, and a float64 forward of
GPT-2 small at 1024 tokens takes one and a half million of them. For the duration of the block the threshold and
the trim threshold are raised, so freed blocks stay in the heap and the next allocations reuse
them; after it, the thresholds go to glibc's own settled values (those its dynamic rule reaches
once it has freed a block of 32 MiB) and the free heap is handed back (malloc_trim). Freed
blocks are reused, not added to, so the run's peak stays what it has in use at once.

kept_for_reuse changes nothing where glibc is not the C library (macOS, musl, Windows), or
where the process was started with its own malloc settings (GLIBC_TUNABLES glibc.malloc.*,
MALLOC_*_ variables): those are the user's to choose. A program that calls mallopt itself while
it runs gets glibc's settled values back after each block: glibc has no call that reads them.
Results are the same either way: only where memory comes from changes.
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
SETTLED_MMAP = 4 * 1024 * 1024 * ctypes.sizeof(ctypes.c_long)  # DEFAULT_MMAP_THRESHOLD_MAX: 32 MiB on 64-bit
SETTLED_TRIM = 2 * SETTLED_MMAP  # the dynamic rule keeps the trim threshold at twice the mmap threshold

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


def mallopt(*settings: tuple[int, int]) -> bool:
    """glibc's mallopt(option, value) for each (option, value), for the rest of this process;
    False where there is no glibc, or where it refuses one of them."""
    libc = _glibc()
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
            libc.mallopt(M_MMAP_THRESHOLD, KEPT)
            libc.mallopt(M_TRIM_THRESHOLD, KEPT)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                libc.mallopt(M_MMAP_THRESHOLD, SETTLED_MMAP)
                libc.mallopt(M_TRIM_THRESHOLD, SETTLED_TRIM)
                libc.malloc_trim(0)
