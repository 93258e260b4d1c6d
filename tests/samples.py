"""Sample data shared by tests that need attention weights without running a model."""

import numpy as np

from numpy_ref.attention import causal_mask, softmax


def causal_weights(H, T, seed):
    """Realistic attention weights (H, T, T): numpy_ref's softmax over causally masked random scores."""
    scores = np.random.default_rng(seed).standard_normal((H, T, T)) * 2
    return softmax(np.where(causal_mask(T), scores, -np.inf))
