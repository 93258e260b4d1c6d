"""Named intermediates of one forward pass, collected by the real forward of every backend.

A forward pass given `trace={}` stores each stage under its name; with `trace=None` (the
default, and always inside compiled code) recording costs nothing.
"""

from typing import Any

STAGES = ("embed", "qkv", "q", "k", "v", "scores", "weights", "context", "merged", "attn_out", "logits")


def record(trace: dict[str, Any] | None, name: str, value: Any) -> None:
    if trace is not None:
        trace[name] = value
