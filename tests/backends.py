"""The three implementations behind one NumPy interface (shared.backends), and the odd,
distinct sizes the tests use so that a swapped axis fails."""

from shared.backends import BACKENDS, central_difference  # noqa: F401  (used by the tests)
from shared.config import ModelConfig

SMALL = ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=7)
B, T = 3, 5
