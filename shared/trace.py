"""Named intermediates of one forward pass, collected by the real forward of every backend.

A forward marks its stages with `record(qkv=qkv, ...)`; nothing is kept unless the caller asked
for a trace with `with tracing(stages):`, so no forward takes a trace argument, and a record
costs one attribute read. The trace belongs to the thread that asked for it (`mhsa parity` runs
backends side by side in threads); it is an attribute of a threading.local, which torch.compile
and jax.jit trace as plain Python.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

STAGES = ("embed", "qkv", "q", "k", "v", "scores", "weights", "context", "merged", "attn_out", "logits")

_current = threading.local()  # .stages: the dict being filled (None: no trace asked for)


@contextlib.contextmanager
def tracing(stages: dict[str, Any] | None) -> Iterator[None]:
    """Inside: every stage a forward records in this thread is stored, as it is (the framework's
    array), in `stages`; with stages None, nothing is kept and the forward runs as untraced."""
    saved = getattr(_current, "stages", None)
    _current.stages = stages
    try:
        yield
    finally:
        _current.stages = saved


def recording() -> bool:
    """Whether this thread's forward is recorded (then a block runs every stage on its own, so
    that each can be recorded, never a fused kernel)."""
    return getattr(_current, "stages", None) is not None


def record(**stages: Any) -> None:
    """Keep each named stage when this thread is tracing; otherwise do nothing."""
    if getattr(_current, "stages", None) is not None:
        for name, value in stages.items():
            _current.stages[name] = value
