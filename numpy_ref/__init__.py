"""Pure-NumPy TinyLM over the exchange dict, in the style of picoGPT: the forward reference
(attention.py, model.py), the backward pass by hand (backward.py), Adam (adam.py) and a
trainer like the frameworks' (train.py, `python -m numpy_ref.train`)."""

from numpy_ref.attention import attention, causal_mask, merge_heads, softmax, split_heads
from numpy_ref.model import cross_entropy, forward, intermediates, loss

__all__ = [
    "attention", "causal_mask", "cross_entropy", "forward", "intermediates",
    "loss", "merge_heads", "softmax", "split_heads",
]
