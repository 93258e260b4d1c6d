"""The registered backends behind one NumPy interface (shared.tools.backends), and the odd,
distinct sizes the tests use so that a swapped axis fails."""

from shared.config import ModelConfig
from shared.tools.backends import ADAPTERS, central_difference  # noqa: F401  (used by the tests)
from shared.tools.registry import names  # noqa: F401  (used by the tests)

SMALL = ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=7)
B, T = 3, 5
