"""The environment the test session was started with, read before tests/conftest.py changes any
of it (OMP_NUM_THREADS in an xdist worker, the JAX cache and XLA_FLAGS): the transcripts run
their commands with the caller's thread and BLAS settings, as a user's shell would
(tests/docs/transcripts.py)."""

import os

ENVIRONMENT = dict(os.environ)
