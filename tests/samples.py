"""Sample data shared by tests: attention weights without running a model, and token ids of
SMALL's vocabulary."""

import numpy as np

from numpy_ref.attention import causal_mask, softmax
from tests.backends import SMALL, B, T


def causal_weights(H, T, seed):
    """Realistic attention weights (H, T, T): numpy_ref's softmax over causally masked random scores."""
    scores = np.random.default_rng(seed).standard_normal((H, T, T)) * 2
    return softmax(np.where(causal_mask(T), scores, -np.inf))


def tokens(shape=(B, T), dtype="int64"):
    """Token ids (B, T) of SMALL's vocabulary, the same at every call."""
    return np.random.default_rng(1).integers(0, SMALL.vocab_size, size=shape).astype(dtype)


def with_id(bad_id):
    """tokens() with one id, in the middle of the batch, replaced by `bad_id`."""
    ids = tokens()
    ids[1, 3] = bad_id
    return ids
