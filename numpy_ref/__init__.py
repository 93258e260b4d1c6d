"""Pure-NumPy forward reference over the exchange dict, in the style of picoGPT."""

from numpy_ref.attention import attention, causal_mask, merge_heads, softmax, split_heads
from numpy_ref.model import cross_entropy, forward, intermediates, loss

__all__ = [
    "attention", "causal_mask", "cross_entropy", "forward", "intermediates",
    "loss", "merge_heads", "softmax", "split_heads",
]
