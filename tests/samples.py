"""Sample data shared by tests that need attention weights without running a model."""

import numpy as np

import numpy_ref


def causal_weights(H, T, seed):
    """Realistic attention weights (H, T, T): numpy_ref's softmax over causally masked random scores."""
    scores = np.random.default_rng(seed).standard_normal((H, T, T)) * 2
    return numpy_ref.softmax(np.where(numpy_ref.causal_mask(T), scores, -np.inf))
