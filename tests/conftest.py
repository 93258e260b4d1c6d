"""Test set-up: JAX float64 on (every layer gets an explicit dtype, so float32 tests stay
float32), and fixtures that run a test once per registered backend, or once per backend
with a capability of shared.protocol.

One JAX compilation cache on disk, read and written by the in-process tests and the
subprocesses they start, so a computation compiled once (a train step of SMALL, say) is not
compiled again by the next call, process or session that needs it: pytest's cache folder
(.pytest_cache/d/mhsa-jax, kept between sessions that ended normally: tests/machinery/jax_cache.py),
or a temporary folder removed at the end when pytest's cache is off (-p no:cacheprovider).
A JAX_COMPILATION_CACHE_DIR set by the caller is used as it is and left alone.

XLA compiles the tests' programs with its quickest settings (tests/machinery/xla_flags.py), added to the
caller's XLA_FLAGS, so the tests' subprocesses compile that way too."""

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from tests.machinery import caller  # noqa: F401  (first: the environment before this file changes it)
from tests.machinery.xla_flags import with_quick_compile

# a session started with Ctrl-C ignored (a background job of a non-interactive shell) would pass
# that on to the processes the Ctrl-C tests start, and they would wait for a Ctrl-C that never
# lands; Python's own handler is reset to the default at every exec, as in a terminal
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_CALLERS_CACHE = "JAX_COMPILATION_CACHE_DIR" in os.environ  # before a session's folder is chosen
# every entry, however quick to compile: the tests compile many small functions
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# by default JAX also points XLA's GPU autotuning cache into the cache folder, and that path
# enters every cache key: an entry of worker gw0's folder would never match in gw1's, however shared
os.environ.setdefault("JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES", "none")
os.environ["XLA_FLAGS"] = with_quick_compile(os.environ.get("XLA_FLAGS", ""))  # tests/machinery/xla_flags.py
# one subfolder per pytest-xdist worker: JAX writes an entry in place, without a lock unless the
# cache has a size limit, and a size limit rescans the whole folder on every write
if "PYTEST_XDIST_WORKER" in os.environ:
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:  # set by the caller, or by the session (pytest_configure)
        os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(os.environ["JAX_COMPILATION_CACHE_DIR"], os.environ["PYTEST_XDIST_WORKER"])
    # a worker per core (make test): a second thread of torch's OpenMP pool (or of NumPy's
    # OpenBLAS, which reads the same variable) would only spin against the other worker on these
    # tiny models (docs/performance.md, "Threads"); read once, when each library starts,
    # here and in the processes the tests start. Tests of --threads set their own.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from tests.backends import ADAPTERS, names  # noqa: E402
from tests.docs import transcripts  # noqa: E402
from tests.machinery import jax_cache, scheduling  # noqa: E402

_session_cache: dict[str, object] = {}  # this session's folder, and whether it is temporary


def start_jax() -> None:
    """JAX for the tests of this process, before any test module is imported: float64 on, the
    session's cache folder (read from the environment, where JAX was not imported before), and its
    CPU backend started now. XLA reads XLA_FLAGS once, when the backend starts: started by the first
    test that computes, it would take the flags of whatever that test set, and a command line run
    in-process (`mhsa parity`, `--threads 1`: --xla_cpu_multi_thread_eigen=false) would choose how
    every later test of the worker multiplies, by which tests the worker was dealt first."""
    import jax

    jax.config.update("jax_enable_x64", True)
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.devices()


def runs_no_test(config) -> bool:
    """Whether this process hands every test to xdist workers (`make test`'s -n 2): it never
    imports JAX (most of a second at the start, before the workers start, and at the end)."""
    workers = config.getoption("numprocesses", None) and config.getoption("dist", "no") != "no"
    return bool(workers) and not config.getoption("collectonly")


def pytest_configure(config):
    """Choose the session's JAX cache folder, and the documents' (transcripts.shared_cache), in the
    process that runs the session (an xdist worker finds them in its environment, set here before
    the workers start); then start JAX where tests run."""
    if hasattr(config, "workerinput"):
        start_jax()
        return
    _choose_cache_folders(config)
    if not runs_no_test(config):
        start_jax()


def _choose_cache_folders(config) -> None:
    _session_cache["docs"] = transcripts.shared_cache()  # the documents' own cache folder (tests/docs/transcripts.py)
    _session_cache["docs"].__enter__()
    if _CALLERS_CACHE:
        return
    cache = getattr(config, "cache", None)
    kept = cache.mkdir("mhsa-jax") if cache is not None else None
    held = jax_cache.lock(kept) if kept is not None else None
    if held is None:  # pytest's cache is off, or another session is using the folder now
        folder, temporary = Path(tempfile.mkdtemp(prefix="mhsa-tests-jax-cache-")), True
        state = "temporary" + (f" ({kept} is in use by another session)" if kept is not None else "")
    else:
        folder, temporary, state = kept, False, jax_cache.open_for_session(kept)
    _session_cache.update(folder=folder, temporary=temporary, crashed=False, state=state, lock=held)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(folder)  # inherited by xdist workers and subprocesses


def pytest_report_header(config):
    if "folder" in _session_cache:
        return f"JAX compilation cache: {_session_cache['folder']}: {_session_cache['state']}"
    return None


def pytest_collection_modifyitems(config, items):
    items[:] = scheduling.ordered(items)  # tests/machinery/scheduling.py


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadscope":
        return scheduling.make_scheduler(config, log)
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """An xdist worker died: it may have been writing a cache entry."""
    _session_cache["crashed"] = True


def pytest_sessionfinish(session, exitstatus):
    folder = _session_cache.get("folder")
    normal = exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED)
    if folder is not None and not _session_cache["temporary"] and normal and not _session_cache["crashed"]:
        jax_cache.close_after_session(folder)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """A temporary folder goes with the session that made it; the kept one is unlocked.

    An xdist worker has sent its results by now (its sessionfinish): it leaves at once, without
    the interpreter's own ending, which takes seconds once torch and JAX are imported (tearing down
    their modules and C++ state) while the session waits for the worker to be gone."""
    if hasattr(config, "workerinput"):
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(0)
    if "docs" in _session_cache:
        _session_cache.pop("docs").__exit__(None, None, None)
    if _session_cache.get("temporary"):
        shutil.rmtree(_session_cache["folder"], ignore_errors=True)
    if _session_cache.get("lock") is not None:
        _session_cache["lock"].close()


def _restore_environment(before: dict) -> None:
    for key in set(os.environ) | set(before):
        if key != "PYTEST_CURRENT_TEST" and os.environ.get(key) != before.get(key):
            if key in before:
                os.environ[key] = before[key]
            else:
                del os.environ[key]


@pytest.fixture(autouse=True)
def _environment_restored():
    """What a test's command line run in this process sets in os.environ (XLA_FLAGS for --threads 1
    or --dp, OMP_NUM_THREADS for --threads) ends with the test: left behind, it would reach every
    later subprocess of the worker, and JAX hashes XLA_FLAGS into its compilation cache keys, so
    what a later test compiles would depend on which tests ran before it in that worker."""
    before = dict(os.environ)
    yield
    _restore_environment(before)


@pytest.fixture(autouse=True, scope="module")
def _environment_restored_after_the_module():
    """The same for a command line run by a module-scoped fixture (set up before a test's own
    snapshot): what it sets ends with its module."""
    before = dict(os.environ)
    yield
    _restore_environment(before)


@pytest.fixture
def patched_jax():
    """For a test that patches a function JAX traces (nnx.softmax, a loss, an optimizer): JAX keeps
    each jitted program it traced, keyed by shapes and static arguments, not by the functions it
    called, so a later test of this process with the same shapes would run the patched program.
    Its in-memory caches are emptied when the test ends (the compilation cache on disk is keyed by
    the program itself and needs nothing)."""
    yield
    import jax

    jax.clear_caches()


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
    from mhsa import registry
    from shared.config import ModelConfig, TrainConfig

    runs = {}

    def run(name, dtype):
        if (name, dtype) not in runs:
            runs[name, dtype] = registry.get(name).train.train(ModelConfig(), TrainConfig(dtype=dtype))
        return runs[name, dtype]

    return run
