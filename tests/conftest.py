"""Test set-up: JAX float64 on (every layer gets an explicit dtype, so float32 tests stay
float32), and fixtures that run a test once per registered backend, or once per backend
with a capability of shared.protocol.

One JAX compilation cache on disk for the session (a temporary folder, removed at the end;
a subfolder per pytest-xdist worker): the in-process tests and the subprocesses they start
read and write it, so a computation compiled once (a train step of SMALL, say) is not
compiled again by the next call or process that needs it. A JAX_COMPILATION_CACHE_DIR set
by the caller is used as it is and kept."""

import os
import shutil
import tempfile

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # before JAX is imported: it reads these once
    _OWN_CACHE: str | None = tempfile.mkdtemp(prefix="mhsa-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE  # inherited by xdist workers and subprocesses
else:
    _OWN_CACHE = None
# every entry, however quick to compile: the tests compile many small functions
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# one subfolder per pytest-xdist worker: JAX writes an entry in place, without a lock unless the
# cache has a size limit, and a size limit rescans the whole folder on every write
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(os.environ["JAX_COMPILATION_CACHE_DIR"], os.environ["PYTEST_XDIST_WORKER"])
    # a worker per core (make test): a second thread of torch's OpenMP pool (or of NumPy's
    # OpenBLAS, which reads the same variable) would only spin against the other worker on these
    # tiny models (benchmarks/RESULTS.md, "Busy machine"); read once, when each library starts,
    # here and in the processes the tests start. Tests of --threads set their own.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import jax  # noqa: E402  (after the cache settings)
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)

from tests.backends import ADAPTERS, names  # noqa: E402  (after x64 is on)


def pytest_unconfigure(config):
    """The process that made the cache folder removes it (an xdist worker inherits it, and
    finds JAX_COMPILATION_CACHE_DIR already set)."""
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.fixture(params=names(), ids=str)
def backend(request):
    return ADAPTERS[request.param]


@pytest.fixture(params=names("grads"), ids=str)
def autodiff_backend(request):
    """Backends with their own gradient (loss_and_grads)."""
    return ADAPTERS[request.param]


@pytest.fixture(params=names("fused"), ids=str)
def fused_backend(request):
    """Backends with a fused attention kernel behind ModelConfig(attn_impl="fused")."""
    return ADAPTERS[request.param]


@pytest.fixture(params=names("train"), ids=str)
def trainer_backend(request):
    return ADAPTERS[request.param]


@pytest.fixture(scope="session")
def default_run():
    """run(name, dtype): the History of the default 3-epoch run (ModelConfig(), TrainConfig(dtype=dtype))
    of trainer `name`, trained once per session (per xdist worker) and shared by every test that reads it."""
    from shared.config import ModelConfig, TrainConfig
    from shared.tools import registry

    runs = {}

    def run(name, dtype):
        if (name, dtype) not in runs:
            runs[name, dtype] = registry.get(name).train.train(ModelConfig(), TrainConfig(dtype=dtype))
        return runs[name, dtype]

    return run
