"""What makes the NumPy trainer fast, apart from the lesson: glibc's malloc keeps the memory NumPy frees.

Why: every training step frees and allocates the same temporaries, which glibc's starting
thresholds map afresh at each step (keep_freed_memory below); kept mapped, the step reuses them.
"""

from __future__ import annotations

import ctypes
import ctypes.util


def keep_freed_memory() -> bool:
    """Let glibc's malloc keep the memory NumPy frees, as it does by itself once a large buffer
    has been freed (after `import torch`, for one). Returns False where there is no glibc.

    Every training step allocates and frees the same temporaries (~100 KiB each). With glibc's
    starting thresholds (128 KiB) the larger ones are mmap-ed and unmapped every step and the
    top of the heap is handed back to the kernel, so each step page-faults its memory in again;
    frameworks keep theirs in their own allocators. The values set are glibc's own ceilings for
    its dynamic thresholds on 64-bit (mmap 32 MiB, trim twice that), so nothing unusual is kept.
    """
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20) and mallopt(M_TRIM_THRESHOLD, 64 << 20))
