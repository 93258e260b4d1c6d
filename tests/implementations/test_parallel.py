"""Data-parallel training on each framework's own engine equals the single-device run.

torch: real DistributedDataParallel over 2 gloo ranks (processes). JAX: a real 2- and
4-device mesh, in one subprocess with XLA_FLAGS asking for 4 CPU devices (this process
started JAX with one). Short runs with odd sizes, a smaller last batch and two epochs; the
default 3-epoch numbers are `python -m mhsa.parity.data_parallel`'s.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mhsa.parity import data_parallel as dp_parity
from mhsa.registry import get, names
from shared import adam_state, training, weights
from shared.config import TrainConfig
from shared.tolerances import tolerance
from tests.backends import SMALL
from tests.machinery.xla_flags import with_quick_compile
from tests.paths import ROOT

# float64: batches of 12, 12 and a last one of 4 per epoch, each splits into 2 and into 4 shards;
# float32: full batches only (each shape is one more XLA compilation, the bulk of this file's time)
RUNS = {"float64": dict(epochs=2, batch_size=12, n_sequences=28, seed=3), "float32": dict(epochs=2, batch_size=12, n_sequences=24, seed=3)}
JAX_DPS = {"float64": (2, 4), "float32": (2,)}  # in the subprocess; dp=1 runs in this process


def config(dtype, **changes) -> TrainConfig:
    return TrainConfig(dtype=dtype, **{**RUNS[dtype], **changes})


def offset_shard(x, rank, dp):
    """A planted fault: the last rank's shard starts one sequence late (wrapping around)."""
    size = x.shape[-2] // dp
    start = rank * size + (rank == dp - 1)
    return np.take(x, np.arange(start, start + size), axis=-2, mode="wrap")


def failing_shard(x, rank, dp):
    """A planted crash: the last rank raises at its first batch."""
    if rank == dp - 1:
        raise ValueError("planted failure in the last rank")
    return x[..., rank * (x.shape[-2] // dp) : (rank + 1) * (x.shape[-2] // dp), :]


def outcome(history, name):
    return np.asarray(history.losses), get(name).model.to_exchange(history.model)


# --- the JAX side: one subprocess with 4 simulated CPU devices --------------------------------


def jax_child(folder: str) -> None:
    """Run in the subprocess: every JAX run this file checks, written to folder/jax.npz."""
    from jax_impl import parallel

    parallel.prepare(4)  # before JAX starts: 4 CPU devices
    import jax

    jax.config.update("jax_enable_x64", True)
    # repeated runs of one shape and sharding (the fault, the resume) reuse their compiled epoch; in
    # a folder of its own beside the session's cache (kept with it), or in this test's folder
    session = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    jax.config.update("jax_compilation_cache_dir", str(Path(session) / "dp-child" if session else Path(folder) / "xla_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    from jax_impl import train

    out, folder = {}, Path(folder)
    for dtype, dps in JAX_DPS.items():
        for dp in dps:
            out[(dtype, dp)] = outcome(parallel.train(SMALL, config(dtype), dp), "jax")
    out[("fault", 2)] = outcome(parallel.train(SMALL, config("float64"), 2, shard=offset_shard), "jax")
    # a dp=2 checkpoint after epoch 1 of 2, resumed at dp=4; the torch side resumes it too
    first = parallel.train(SMALL, config("float64", epochs=1), 2)
    saved = train.optimizer_to_exchange(first.optimizer, first.model, config("float64", epochs=1))
    weights.save(folder / "epoch1.safetensors", get("jax").model.to_exchange(first.model), SMALL)
    adam_state.save(adam_state.companion_path(folder / "epoch1.safetensors"), saved, SMALL)
    out[("resumed", 4)] = outcome(parallel.train(SMALL, config("float64"), 4, init=folder / "epoch1.safetensors", resume=saved), "jax")
    errors = {}
    try:
        parallel.train(SMALL, config("float64", batch_size=16, n_sequences=32), 8)
    except ValueError as error:
        errors["too many"] = str(error)
    arrays = {f"{kind}/{dp}/losses": losses for (kind, dp), (losses, _) in out.items()}
    arrays.update({f"{kind}/{dp}/{name}": value for (kind, dp), (_, exchange) in out.items() for name, value in exchange.items()})
    np.savez(folder / "jax.npz", **arrays)
    (folder / "errors.json").write_text(json.dumps(errors))


@pytest.fixture(scope="module")
def jax_started(tmp_path_factory):
    """Start the JAX subprocess at once, so it runs while the torch ranks train."""
    folder = tmp_path_factory.mktemp("jax_dp")
    env = dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS=with_quick_compile(""))
    code = f"import tests.implementations.test_parallel as t; t.jax_child({str(folder)!r})"
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield process, folder
    if process.poll() is None:
        process.kill()


@pytest.fixture(scope="module")
def jax_runs(jax_started):
    """(kind, dp) -> (losses, exchange) of every JAX run, and the errors it saw."""
    from jax_impl import train

    process, folder = jax_started
    found = {(dtype, 1): outcome(train.train(SMALL, config(dtype)), "jax") for dtype in RUNS}  # while it runs
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    data = np.load(folder / "jax.npz")
    for key in data.files:
        kind, dp, name = key.split("/", 2)
        losses, exchange = found.setdefault((kind, int(dp)), (None, {}))
        found[(kind, int(dp))] = (data[key], exchange) if name == "losses" else (losses, {**exchange, name: data[key]})
    return found, json.loads((folder / "errors.json").read_text()), folder


@pytest.fixture(scope="module")
def torch_runs(jax_started):
    """(kind, dp) -> (losses, exchange) of torch at dp=1 (in this process) and over 2 DDP ranks."""
    from torch_impl import parallel, train

    found = {}
    for dtype in RUNS:
        for dp in (1, 2):
            found[(dtype, dp)] = outcome(train.train(SMALL, config(dtype)) if dp == 1 else parallel.train(SMALL, config(dtype), dp), "torch")
    found[("fault", 2)] = outcome(parallel.train(SMALL, config("float64"), 2, shard=offset_shard), "torch")
    return found


def section(torch_runs, jax_runs, dtype, dp, kind=None):
    """dp_parity's rows for these runs: each backend's dp run (or a faulty one) against its dp=1."""
    found = {"torch": torch_runs, "jax": jax_runs[0]}
    chosen = {name: {1: runs[(dtype, 1)], dp: runs[(kind or dtype, dp)]} for name, runs in found.items() if (dtype, dp) in runs}
    return dp_parity.rows(chosen, dtype, dp)


# --- the mathematics equals the single-device run ---------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_two_torch_ranks_and_two_jax_devices_match_their_single_device_runs_and_each_other(torch_runs, jax_runs, dtype):
    rows = section(torch_runs, jax_runs, dtype, 2)
    assert set(rows[0].diffs) == {"dp torch", "dp jax", "dp torch-jax"}
    for row in rows:
        assert row.passed, dp_parity.format_rows(rows, dp_parity.columns(names("dp"), 2))
    steps = 2 * config(dtype).steps_per_epoch
    assert rows[0].name == f"loss at each of {steps} steps"
    assert [row.name for row in rows][1:] == ([f"weights after {steps} steps"] if dtype == "float64" else [])
    print(dtype, {key: f"{value:.1e}" for key, value in rows[0].diffs.items()})


@pytest.mark.slow
def test_four_jax_devices_match_the_single_device_run_in_float64(torch_runs, jax_runs):
    rows = section({}, jax_runs, "float64", 4)
    assert [set(row.diffs) for row in rows] == [{"dp jax"}, {"dp jax"}]
    assert all(row.passed for row in rows), [(row.name, row.diffs) for row in rows]
    losses, exchange = jax_runs[0][("float64", 4)]
    reference, reference_weights = jax_runs[0][("float64", 1)]
    assert np.abs(losses - reference).max() <= tolerance("trajectory", "float64")
    assert max(np.abs(exchange[name] - reference_weights[name]).max() for name in exchange) <= 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("name", names("dp"))
def test_a_shard_offset_by_one_sequence_fails_the_data_parallel_rows_naming_the_first_step(torch_runs, jax_runs, name):
    found = {"torch": torch_runs, "jax": jax_runs[0]}[name]
    rows = dp_parity.rows({name: {1: found[("float64", 1)], 2: found[("fault", 2)]}}, "float64", 2)
    assert not rows[0].passed and not rows[1].passed
    gap = np.abs(found[("fault", 2)][0] - found[("float64", 1)][0])
    first = int(np.flatnonzero(gap > 1e-10)[0])  # 0, or 1 when the displaced row repeats the same id
    assert first <= 1 and rows[0].name == f"loss at each of 6 steps, first beyond tolerance at step {first}"
    report = dp_parity.format_rows(rows, dp_parity.columns([name], 2))
    assert report.splitlines()[-1].startswith(f"FAIL: data-parallel '{rows[0].name}': {name} dp=2 vs 1")


# --- checkpoints are ordinary checkpoints --------------------------------------------------------


@pytest.mark.slow
def test_a_jax_dp2_checkpoint_resumes_at_dp4_and_in_torch_at_dp1_as_if_never_stopped(torch_runs, jax_runs):
    from torch_impl import train

    found, _, folder = jax_runs
    reference = found[("float64", 1)][0]
    assert np.abs(found[("resumed", 4)][0] - reference[len(reference) // 2 :]).max() <= tolerance("trajectory", "float64")
    saved = adam_state.load(adam_state.companion_path(folder / "epoch1.safetensors"), SMALL)
    resumed = train.train(SMALL, config("float64"), init=folder / "epoch1.safetensors", resume=saved)
    assert np.abs(np.asarray(resumed.losses) - torch_runs[("float64", 1)][0][len(reference) // 2 :]).max() <= 1e-10


# --- clear errors before any work ----------------------------------------------------------------


@pytest.mark.parametrize("name", names("dp"))
@pytest.mark.parametrize(
    "dp, changes, expected",
    [
        (0, {}, "dp must be a positive integer, got 0"),
        (5, {}, "batch_size=12 is not divisible by dp=5: every global batch is split into 5 equal shards"),
        (
            3,
            {"n_sequences": 26},
            "the last batch of each epoch has 2 sequences (n_sequences=26 % batch_size=12), "
            "not divisible by dp=3: choose n_sequences so that every batch splits into 3 equal shards",
        ),
    ],
)
def test_a_split_that_cannot_be_equal_is_refused_with_one_line(name, dp, changes, expected):
    with pytest.raises(ValueError) as raised:
        get(name).module("parallel").train(SMALL, config("float32", **changes), dp)
    assert str(raised.value) == expected


@pytest.mark.slow
def test_more_devices_than_jax_has_is_refused_naming_the_flag(jax_runs):
    assert jax_runs[1]["too many"] == (
        "dp=8 needs 8 devices, but only 4 are available (jax.devices() on cpu; "
        "on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts)"
    )


def test_a_dp_that_is_not_an_int_is_a_type_error():
    with pytest.raises(TypeError, match=r"dp must be an int, got 2.0 \(float\)"):
        training.check_data_parallel(config("float32"), 2.0)


@pytest.mark.parametrize(
    "flags, expected",
    [
        ("", "--xla_force_host_platform_device_count=4"),
        ("--xla_cpu_foo=1", "--xla_cpu_foo=1 --xla_force_host_platform_device_count=4"),
        ("--xla_force_host_platform_device_count=2", "--xla_force_host_platform_device_count=4"),
        ("--xla_force_host_platform_device_count=8", "--xla_force_host_platform_device_count=8"),
    ],
)
def test_prepare_asks_xla_for_at_least_dp_cpu_devices(monkeypatch, flags, expected):
    from jax_impl import parallel

    monkeypatch.setenv("XLA_FLAGS", flags)
    parallel.prepare(4)
    assert os.environ["XLA_FLAGS"] == expected


# --- a failing rank stops every rank -------------------------------------------------------------


@pytest.mark.slow
def test_a_rank_that_raises_stops_every_rank_with_one_message_and_no_hang(torch_runs):
    import multiprocessing

    from torch_impl import parallel

    def hung(signum, frame):
        raise TimeoutError("the data-parallel run hung after a rank failed")

    before = {child.pid for child in multiprocessing.active_children()}
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    started = time.perf_counter()
    try:
        with pytest.raises(training.RankFailedError) as raised:
            parallel.train(SMALL, config("float32"), 2, shard=failing_shard)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    message = str(raised.value)
    assert message.startswith("data-parallel rank 1 of 2 failed: ValueError: planted failure in the last rank (test_parallel.py:")
    assert message.endswith("; all 2 ranks were stopped") and "\n" not in message
    assert not {child.pid for child in multiprocessing.active_children()} - before  # no rank left behind
    assert time.perf_counter() - started < 60


@pytest.mark.slow
def test_a_torch_data_parallel_run_registers_nothing_with_the_resource_tracker(torch_runs, monkeypatch):
    # an interrupted command leaves at once (mhsa.cli.leave_busy_threads), perhaps as a run makes or
    # frees what it talks to its ranks with: a named semaphore (a multiprocessing.Queue's lock) caught
    # half-registered so is reported by multiprocessing's resource tracker on the terminal; pipes are not
    from multiprocessing import resource_tracker

    from torch_impl import parallel

    registered = []
    monkeypatch.setattr(resource_tracker, "register", lambda name, rtype: registered.append((name, rtype)))
    parallel.train(SMALL, config("float32", epochs=1), 2)
    assert registered == []
