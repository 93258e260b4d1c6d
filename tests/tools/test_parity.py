"""Parity: the three implementations agree at every stage, gradient and training step, a run
handed from torch to JAX mid-way continues exactly, and the report names where a planted
fault makes them part."""

import inspect
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mhsa import registry
from mhsa.cli import main as mhsa
from mhsa.parity.report import build_report, format_report
from mhsa.parity.rows import FD, stepwise_row
from mhsa.parity.runs import inputs, padding_mask, reference_twins, trained
from shared import adam_state, weights
from shared.config import ModelConfig, TrainConfig
from shared.tolerances import K, assert_close, derived, reference_error, scale, stage_kind, stepwise, tolerance
from tests.backends import SMALL
from tests.paths import ROOT
from tests.tiers import first_fast

DEFAULT = ModelConfig()


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """torch at one thread for this module, as `mhsa parity` runs it: the report's lanes run
    beside each other, and a second torch thread on these sizes only spins for a core."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runs() -> dict:
    """Trained runs shared by this module's reports and tests (mhsa.parity.runs.trained's
    cache): the float64 default run of each trainer is trained once."""
    return {}


@pytest.mark.parametrize("dtype", first_fast(["float32", "float64"]))
@pytest.mark.parametrize("config", first_fast([SMALL, DEFAULT]), ids=["odd-sizes", "default"])
@pytest.mark.parametrize("masked", [False, True], ids=["causal", "padding"])
def test_every_stage_and_gradient_agrees(dtype, config, masked):
    report = build_report(config, dtype, seed=1, mask=padding_mask(config) if masked else None, epochs=0, samples=3, decode=False)
    assert report.passed, format_report(report)
    names = [row.name for row in report.rows]
    assert names[:12] == ["embed", "qkv", "q", "k", "v", "scores", "weights", "context", "merged", "attn_out", "logits", "loss"]
    assert names[12:] == list(reversed(weights.param_shapes(config)))  # backward order
    # not vacuous: every pair was compared, and on real numbers
    assert all(diff is not None for row in report.rows for diff in row.diffs.values())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float32_rows_are_held_to_k_times_the_references_own_error_and_float64_rows_to_design_md(dtype):
    config, seed = SMALL, 1
    report = build_report(config, dtype, seed=seed, epochs=0, samples=2, decode=False)
    assert report.passed, format_report(report)
    stages = {row.name: row for row in report.rows if row.section == "stage"}
    if dtype == "float64":  # no higher-precision twin: the fixed tolerances, and no error column
        assert all(row.reference_error is None for row in report.rows)
        assert stages["scores"].tol == tolerance("stage", dtype) and stages["weights"].tol == tolerance("weights", dtype)
        assert "own error" not in format_report(report)
        return
    # the reference in float32 and again in float64 from the same weights cast up: its own error
    reference = registry.get(registry.names()[0])
    arrays = weights.init_weights(config, seed, dtype)
    tokens, _ = inputs(config, seed)
    traces = {}
    for name, values in [("float32", arrays), ("float64", {key: value.astype(np.float64) for key, value in arrays.items()})]:
        traces[name] = {}
        reference.model.predict(reference.model.from_exchange(values, config), tokens, trace=traces[name])
    for stage in ("scores", "weights", "logits"):
        error = reference_error(traces["float32"][stage], traces["float64"][stage])
        assert stages[stage].reference_error == error > 0
        assert stages[stage].tol == derived(error, scale(traces["float64"][stage])) == K * max(error, 2**-24 * scale(traces["float64"][stage]))
    # every float32 row is derived, and shows it; the finite difference stays a float64 check
    assert all(row.reference_error is not None for row in report.rows)
    gradients = [row for row in report.rows if row.section == "gradient"]
    assert all(row.tol_of(FD) == tolerance("grad", "float64") and row.diffs[FD] < 1e-10 for row in gradients)
    text = format_report(report)
    assert "| numpy own error |" in text and "numpy f64 vs FD" in text and f"tolerance: {K:g} x numpy own error (numpy in float32 against" in text


@pytest.mark.slow  # three epochs of the default model in every trainer
def test_float64_default_run_trajectories_and_final_weights_agree(runs):
    report = build_report(DEFAULT, "float64", seed=0, epochs=3, samples=2, decode=False, runs=runs)
    trajectory = [row for row in report.rows if row.section == "trajectory"]
    assert [row.name.split(" (at step")[0] for row in trajectory] == [
        "trainings at each of the first 32 of 192 steps",
        "loss at each of 192 steps",
        "weights after 192 steps",
    ]
    assert report.passed, format_report(report)
    # torch against jax goes through the training check alone: the other rows leave its column empty
    assert [row.diffs["torch-jax"] is None for row in trajectory] == [False, True, True]


def faulty(module, old: str, new: str) -> dict:
    """Execute a copy of `module`'s source with one fault planted; returns its namespace."""
    source = inspect.getsource(module)
    assert source.count(old) == 1, f"the line to break is not in {module.__name__}: {old!r}"
    namespace = {"__name__": f"{module.__name__}_with_fault"}
    exec(compile(source.replace(old, new), f"<{module.__name__} with a fault>", "exec"), namespace)
    return namespace


def first_failure(config=SMALL, dtype="float64"):
    report = build_report(config, dtype, seed=2, epochs=0, samples=2, decode=False)
    assert not report.passed
    return report, report.first_failure


DTYPES = pytest.mark.parametrize("dtype", ["float64", "float32"])  # fixed tolerances, then derived ones


@DTYPES
def test_an_untransposed_kernel_is_found_at_attn_out(monkeypatch, dtype):
    import jax_impl.model

    # out_proj is square, so loading its weight untransposed raises nothing: only numbers show it
    copy = faulty(
        jax_impl.model,
        '"attn.out_proj.weight": (("attn", "out_proj", "kernel"), True),',
        '"attn.out_proj.weight": (("attn", "out_proj", "kernel"), False),',
    )
    monkeypatch.setattr(jax_impl.model, "from_exchange", copy["from_exchange"])
    report, row = first_failure(dtype=dtype)
    assert (row.section, row.name, row.failing_pair()) == ("stage", "attn_out", "jax-numpy")
    assert row.diffs["torch-numpy"] <= row.tol  # torch is still right
    assert "FAIL: first difference at stage 'attn_out': jax vs numpy" in format_report(report)


@DTYPES
def test_a_dropped_scale_is_found_at_scores(monkeypatch, dtype):
    import torch_impl.attention
    import torch_impl.model

    copy = faulty(torch_impl.attention, " * (1.0 / math.sqrt(self.d_head))", "")
    monkeypatch.setattr(torch_impl.model, "MultiHeadSelfAttention", copy["MultiHeadSelfAttention"])
    _, row = first_failure(dtype=dtype)
    assert (row.section, row.name, row.failing_pair()) == ("stage", "scores", "torch-numpy")


@DTYPES
def test_a_mask_shifted_by_one_is_found_at_weights(monkeypatch, dtype):
    import jax_impl.attention
    import jax_impl.model

    # diagonal=1: every query also sees the next key, a leak from the future
    copy = faulty(
        jax_impl.attention,
        "CausalMask(jnp.tril(jnp.ones((max_len, max_len), dtype=bool)))",
        "CausalMask(jnp.tril(jnp.ones((max_len, max_len), dtype=bool), k=1))",
    )
    monkeypatch.setattr(jax_impl.model, "MultiHeadSelfAttention", copy["MultiHeadSelfAttention"])
    report, row = first_failure(dtype=dtype)
    assert (row.section, row.name, row.failing_pair()) == ("stage", "weights", "jax-numpy")
    assert all(r.passed for r in report.rows[: report.rows.index(row)])  # scores (before the mask) still agree


def test_a_softmax_with_eps_in_its_denominator_passes_the_fixed_tolerances_and_fails_the_derived_ones(monkeypatch):
    import jax_impl.attention
    import jax_impl.model

    # the training check's hand-written LayerNorm with eps 1e-6, in this model: a hand-written softmax with
    # "+ 1e-6 for stability"; a row with one allowed key comes out 1 / (1 + 1e-6), not 1
    copy = faulty(
        jax_impl.attention,
        "weights = nnx.softmax(scores, axis=-1)",
        "weights = (lambda e: e / (e.sum(axis=-1, keepdims=True) + 1e-6))(jnp.exp(scores - scores.max(axis=-1, keepdims=True)))",
    )
    monkeypatch.setattr(jax_impl.model, "MultiHeadSelfAttention", copy["MultiHeadSelfAttention"])
    report = build_report(DEFAULT, "float32", seed=2, epochs=0, samples=1, decode=False)
    row = report.first_failure
    assert row is not None and (row.section, row.name, row.failing_pair()) == ("stage", "weights", "jax-numpy"), format_report(report)
    assert row.diffs["torch-numpy"] <= row.tol  # torch is still right
    assert row.diffs["jax-numpy"] > K * row.reference_error  # about seven times the reference's own error, beyond K
    # and every stage is inside docs/DESIGN.md's fixed tolerances (the weights' 1e-6, the others' 1e-5)
    for stage in (r for r in report.rows if r.section == "stage"):
        assert max(diff for diff in stage.diffs.values() if diff is not None) <= tolerance(stage_kind(stage.name), "float32"), stage
    assert "FAIL: first difference at stage 'weights': jax vs numpy 9.54e-07 > " in format_report(report)


@pytest.mark.slow  # the whole command: every section, trainings included
def test_mhsa_parity_prints_the_table_and_exits_by_the_result(capsys, monkeypatch):
    from mhsa import compile_cache

    # JAX's persistent cache is asked for unless --no-jax-cache (this process keeps its own settings)
    asked = []
    monkeypatch.setattr(compile_cache, "enable_jax_cache", lambda: asked.append("cache"))
    assert mhsa(["parity", "--epochs", "0", "--samples", "1", "--n-heads", "2", "--d-model", "12", "--seq-len", "5", "--vocab-size", "7"]) == 0
    out = capsys.readouterr().out
    assert "| compared" in out and "| torch vs numpy |" in out and "PASS: all" in out
    widest = max(len(line) for line in out.splitlines() if line.startswith("|"))
    assert widest <= 120  # the default --width: long names wrap within their column
    assert asked == ["cache"]
    import torch_impl.attention
    import torch_impl.model

    copy = faulty(torch_impl.attention, " * (1.0 / math.sqrt(self.d_head))", "")
    monkeypatch.setattr(torch_impl.model, "MultiHeadSelfAttention", copy["MultiHeadSelfAttention"])
    tiny = ["--epochs", "0", "--samples", "1", "--n-heads", "2", "--d-model", "12", "--seq-len", "5", "--vocab-size", "7"]
    assert mhsa(["parity", *tiny, "--no-jax-cache"]) == 1
    out = capsys.readouterr().out
    assert "| scores" in out and "<- the implementations part here" in out
    assert max(len(line) for line in out.splitlines()) <= 120  # the marker joins the name where it does not fit after the row
    assert asked == ["cache"]  # not asked again


@pytest.mark.slow
def test_jax_cache_keeps_every_compiled_program_where_asked(tmp_path):
    # a fresh process: JAX decides at its first compilation whether it has a cache
    program = (
        "from mhsa.compile_cache import enable_jax_cache; print(enable_jax_cache()); "
        "import jax, jax.numpy as jnp; jax.jit(lambda x: x + 1)(jnp.ones(3)).block_until_ready()"
    )
    env = {key: value for key, value in os.environ.items() if key != "JAX_COMPILATION_CACHE_DIR"}
    root = ROOT  # the checkout whose shared/ is tested
    default = subprocess.run(
        [sys.executable, "-c", program], cwd=root, env={**env, "XDG_CACHE_HOME": str(tmp_path / "xdg")}, capture_output=True, text=True
    )
    assert default.returncode == 0, default.stderr
    assert (
        default.stdout.strip()
        == f"JAX's compiled programs are kept in {tmp_path / 'xdg' / 'mhsa' / 'jax'} for the next run (--no-jax-cache: compile afresh)"
    )
    assert any((tmp_path / "xdg" / "mhsa" / "jax").iterdir())  # a program of microseconds is kept too
    # a directory the user gave JAX wins
    own = subprocess.run(
        [sys.executable, "-c", program],
        cwd=root,
        env={**env, "XDG_CACHE_HOME": str(tmp_path / "other"), "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "own")},
        capture_output=True,
        text=True,
    )
    assert own.returncode == 0, own.stderr
    assert own.stdout.strip() == f"JAX's compilation cache: {tmp_path / 'own'} (JAX_COMPILATION_CACHE_DIR)" and not (tmp_path / "other").exists()
    # a cache folder that cannot be made: the run compiles afresh, says so once, and JAX warns of nothing
    (tmp_path / "a file").write_text("")
    blocked = subprocess.run(
        [sys.executable, "-c", program], cwd=root, env={**env, "XDG_CACHE_HOME": str(tmp_path / "a file")}, capture_output=True, text=True
    )
    assert blocked.returncode == 0 and blocked.stderr == "", blocked.stderr
    assert blocked.stdout.startswith(f"JAX's compilation cache is off, {tmp_path / 'a file' / 'mhsa' / 'jax'} cannot be used (")
    # entries cut short (a kill halfway through a write) or overwritten: compiled again, the same result
    for entry in (tmp_path / "xdg" / "mhsa" / "jax").iterdir():
        entry.write_bytes(entry.read_bytes()[:7])
    checked = program + "; print(jax.jit(lambda x: x + 1)(jnp.ones(3)).tolist())"
    cut = subprocess.run(
        [sys.executable, "-c", checked], cwd=root, env={**env, "XDG_CACHE_HOME": str(tmp_path / "xdg")}, capture_output=True, text=True
    )
    assert cut.returncode == 0, cut.stderr
    assert cut.stdout.splitlines()[-1] == "[2.0, 2.0, 2.0]"
    # a size limit: the least recently read entries go, the folder stays within it
    limited = (
        "from mhsa.compile_cache import enable_jax_cache; enable_jax_cache(size_limit=12000); "
        "import jax, jax.numpy as jnp; [jax.jit(lambda x, n=n: x * n + n)(jnp.ones(n)).block_until_ready() for n in range(1, 9)]"
    )
    small = subprocess.run(
        [sys.executable, "-c", limited], cwd=root, env={**env, "XDG_CACHE_HOME": str(tmp_path / "small")}, capture_output=True, text=True
    )
    assert small.returncode == 0 and small.stderr == "", small.stderr
    entries = [path for path in (tmp_path / "small" / "mhsa" / "jax").iterdir() if path.name.endswith("-cache")]
    assert 1 <= len(entries) < 8 and sum(path.stat().st_size for path in entries) <= 12000, [path.stat().st_size for path in entries]
    # an entry without its access-time file (a kill between JAX's two writes, or a folder kept by a
    # version without the limit): later runs still keep their programs, and nothing is warned
    for atime in (tmp_path / "small" / "mhsa" / "jax").glob("*-atime"):
        atime.unlink()
    another = limited.replace("x * n + n", "x * n - n")
    after = subprocess.run(
        [sys.executable, "-c", another], cwd=root, env={**env, "XDG_CACHE_HOME": str(tmp_path / "small")}, capture_output=True, text=True
    )
    assert after.returncode == 0 and after.stderr == "", after.stderr
    kept = [path for path in (tmp_path / "small" / "mhsa" / "jax").iterdir() if path.name.endswith("-cache")]
    assert set(kept) - set(entries) and sum(path.stat().st_size for path in kept) <= 12000, sorted(path.name for path in kept)


@pytest.mark.parametrize("dtype", first_fast(["float32", "float64"]))
def test_torch_then_jax_hand_off_matches_the_all_torch_run(dtype, tmp_path, runs):
    import jax_impl.train
    import torch_impl.model
    import torch_impl.train

    full = trained("torch", DEFAULT, TrainConfig(dtype=dtype), cache=runs).result()  # torch_impl.train.train's run, trained once
    first = torch_impl.train.train(DEFAULT, TrainConfig(epochs=1, dtype=dtype))
    path = tmp_path / "epoch1.safetensors"
    weights.save(path, torch_impl.model.to_exchange(first.model), DEFAULT)
    adam_state.save(
        adam_state.companion_path(path),
        torch_impl.train.optimizer_to_exchange(first.optimizer, first.model, TrainConfig(epochs=1, dtype=dtype)),
        DEFAULT,
    )
    resume = adam_state.load(adam_state.companion_path(path), DEFAULT)
    assert (resume.step, resume.epochs_done) == (64, 1)
    rest = jax_impl.train.train(DEFAULT, TrainConfig(dtype=dtype), init=path, resume=resume)
    assert rest.first_step == 64 and len(rest.losses) == 128
    joined = first.losses + rest.losses
    assert_close(f"{dtype} torch 1 epoch + jax 2 epochs vs torch 3 epochs", joined, full.losses, tolerance("trajectory", dtype))
    # without Adam's state the continuation is visibly different: the moments matter
    restarted = jax_impl.train.train(DEFAULT, TrainConfig(epochs=2, dtype=dtype), init=path)
    assert np.abs(np.array(restarted.losses[:20]) - np.array(full.losses[64:84])).max() > 1e-3


def test_resume_refuses_a_different_batch_stream(tmp_path):
    import torch_impl.model
    import torch_impl.train

    first = torch_impl.train.train(SMALL, TrainConfig(epochs=1, n_sequences=64))
    state = torch_impl.train.optimizer_to_exchange(first.optimizer, first.model, TrainConfig(epochs=1, n_sequences=64))
    with pytest.raises(ValueError, match=r"seed=1 \(saved run: 0\)"):
        torch_impl.train.train(SMALL, TrainConfig(epochs=2, n_sequences=64, seed=1), resume=state)
    with pytest.raises(ValueError, match=r"--epochs 1 is the total and the saved run already trained 1"):
        torch_impl.train.train(SMALL, TrainConfig(epochs=1, n_sequences=64), resume=state)


def test_mhsa_compare_reports_the_gap_and_plots(tmp_path, capsys):
    from shared.history import History

    base = dict(
        backend="torch", model_config=SMALL, train_config=TrainConfig(epochs=1, n_sequences=160, batch_size=32), epoch_losses=[1.0], seconds=1.0
    )
    History(losses=[3.0, 2.0, 1.0, 0.5, 0.25], **base).save(tmp_path / "a.json")
    History(losses=[3.0, 2.0, 1.1], **base).save(tmp_path / "b1.json")
    History(losses=[0.5, 0.2], first_step=3, **base).save(tmp_path / "b2.json")
    files = [str(tmp_path / name) for name in ("a.json", "b1.json", "b2.json")]
    assert mhsa(["compare", *files, "--plot", str(tmp_path / "gap.png")]) == 1  # the runs differ by 0.1: beyond the tolerance
    out = capsys.readouterr().out
    assert "compared 5 common steps (0..4)" in out
    assert "max |A - B|  1.000e-01 at step 2" in out and "mean |A - B| 3.000e-02" in out
    assert (tmp_path / "gap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from mhsa.compare import compare, comparison_figure, join, trajectory_tolerance

    first, second = History.load(tmp_path / "a.json"), join([History.load(tmp_path / "b1.json"), History.load(tmp_path / "b2.json")])
    figure = comparison_figure(compare(first, second), ("A", "B"), trajectory_tolerance(first, second))
    lines = [line for line in figure.axes[1].get_lines() if line.get_label().startswith("trajectory tolerance")]
    assert [list(line.get_ydata()) for line in lines] == [[tolerance("trajectory", "float32")] * 2], "gap.png lacks the tolerance line"
    assert json.loads((tmp_path / "b2.json").read_text())["first_step"] == 3


@DTYPES
def test_a_planted_fault_in_numpys_backward_pass_is_named_at_its_gradient_row(monkeypatch, dtype):
    from numpy_ref import backward

    # the softmax gradient without the subtraction: w * g instead of w * (g - sum(w * g)); in
    # float32 the reference's float64 twin carries the fault too, so its own error stays small
    monkeypatch.setattr(backward, "softmax_backward", lambda g_weights, weights: weights * g_weights)
    report, row = first_failure(dtype=dtype)
    assert row.section == "gradient" and row.name.startswith("attn.qkv_proj."), format_report(report)  # the layer before the softmax
    assert row.failing_pair() in ("torch-numpy", "jax-numpy")
    assert row.diffs["torch-jax"] <= row.tol  # the frameworks still agree with each other
    # every stage, the loss and the gradients the backward pass reaches before the softmax still agree
    assert all(r.passed for r in report.rows if r.section == "stage")
    assert next(r for r in report.rows if r.name == "lm_head.weight").passed
    assert row.diffs[FD] > tolerance("grad", "float64")  # the finite difference, a float64 check in either dtype, sees it too


def test_mhsa_parity_sizes_a_float32_report_by_its_float64_reference_runs(capsys, monkeypatch):
    from shared import checks

    asked = []

    def refuse(*sizes):
        asked.append(sizes[-1])
        raise ValueError("planted: this run needs more memory than there is")

    monkeypatch.setattr(checks, "check_training_fits", refuse)
    with pytest.raises(SystemExit) as exit:
        mhsa(["parity", "--dtype", "float32"])
    assert exit.value.code == 2 and asked == [8]  # bytes per value: the reference's float64 twin
    assert "planted: this run needs more memory than there is" in capsys.readouterr().err


def test_mhsa_parity_refuses_a_data_parallel_run_against_itself(capsys):
    with pytest.raises(SystemExit) as exit:
        mhsa(["parity", "--dp", "1"])
    assert exit.value.code == 2
    assert "--dp 1 compares a run with itself: give 2 or more, or 0 to skip the data-parallel section" in capsys.readouterr().err


def test_lanes_run_side_by_side_and_each_in_order():
    import threading

    from mhsa.parity.lanes import Lanes

    order, other_started = [], threading.Event()
    with Lanes() as lanes:
        # the first job of lane "a" waits for lane "b" to start: lanes one after another would time out here
        first = lanes.submit("a", lambda: other_started.wait(timeout=60) and order.append("a1"))
        second = lanes.submit("a", order.append, "a2")
        lanes.submit("b", other_started.set)
        second.result()
    assert first.exception() is None and order == ["a1", "a2"]


def test_a_failing_job_stops_the_report_with_its_error(monkeypatch):
    from mhsa.parity.adapters import ADAPTERS

    class Broken(type(ADAPTERS["jax"])):
        def loss_and_grads(self, *args, **kwargs):
            raise RuntimeError("planted: no gradient today")

    adapters = {**ADAPTERS, "jax": Broken(ADAPTERS["jax"].backend)}
    with pytest.raises(RuntimeError, match="planted: no gradient today"):
        build_report(SMALL, "float64", seed=2, epochs=0, samples=1, decode=False, adapters=adapters)


@pytest.mark.slow  # three epochs of the default model in every trainer
def test_float32_trajectory_steps_are_held_to_the_references_own_error_by_that_step(runs):
    report = build_report(DEFAULT, "float32", seed=0, epochs=3, samples=1, decode=False, runs=runs)
    assert report.passed, format_report(report)
    trainings, row = [row for row in report.rows if row.section == "trajectory"]
    assert trainings.derived_elsewhere and trainings.reference_error is None  # derived from torch's and jax's own errors
    config = TrainConfig(dtype="float32")
    reference, *others = registry.names("train")
    own = trained(reference, DEFAULT, config, cache=runs).result().losses
    twin, nudged = (future.result().losses for future in reference_twins(DEFAULT, config, cache=runs))
    errors, tols = stepwise(own, twin, running=True, responses=[nudged])
    assert row.name == "loss at each of 192 steps" and (row.reference_error, row.tol) == (errors[row.step], tols[row.step])
    assert np.all(np.diff(errors) >= 0) and errors[0] < 1e-6 < errors[-1]  # one rounding at the start, Adam's scalars later
    # every trainer's loss within its step's tolerance (jax's too, whose optax takes b2 rounded
    # to float32 in its bias correction when JAX runs without x64: the twin's response covers it)
    for name in others:
        gap = np.abs(np.subtract(trained(name, DEFAULT, config, cache=runs).result().losses, own))
        assert np.all(gap <= tols), (name, int(np.argmax(gap / tols)))


@pytest.mark.slow  # a data-parallel training in each dp backend
def test_the_data_parallel_section_trains_each_dp_backend_with_its_parallel_engine(monkeypatch):
    calls = []
    for name in registry.names("dp"):
        backend = registry.get(name)

        def record(config, train_config, dp, *args, backend=backend, **kwargs):
            calls.append((backend.name, dp, train_config.epochs, train_config.dtype))
            return backend.train.train(config, train_config)  # the single-device run stands in: no processes, no devices

        monkeypatch.setattr(backend.module("parallel"), "train", record)
    report = build_report(SMALL, "float32", seed=3, epochs=1, samples=1, decode=False, dp=2)
    assert sorted(calls) == sorted((name, 2, 1, "float32") for name in registry.names("dp"))
    rows = [row for row in report.rows if row.section == "data-parallel"]
    assert [row.name for row in rows] == ["loss at each of 64 steps"] and rows[0].reference_error is not None
    names = registry.names("dp")
    assert set(rows[0].diffs) == {f"dp {name}" for name in names} | {f"dp {a}-{b}" for a, b in itertools.combinations(names, 2)}
    assert report.passed and all(rows[0].diffs[f"dp {name}"] == 0.0 for name in names), format_report(report)


def test_a_row_over_steps_shows_its_first_step_beyond_tolerance_or_else_its_closest():
    gaps = {"a-b": np.array([1.0, 3.0, 9.0, 2.0]), "a-c": None, "b-c": np.array([0.0, 0.0, 0.0, 5.0])}
    passing = stepwise_row("trajectory", "loss", gaps, [10.0, 10.0, 10.0, 5.0], errors=[1.0, 2.0, 3.0, 4.0])
    assert passing.passed and passing.step == 3 and passing.diffs == {"a-b": 2.0, "a-c": None, "b-c": 5.0}
    assert (passing.tol, passing.reference_error) == (5.0, 4.0)
    failing = stepwise_row("trajectory", "loss", gaps, [10.0, 2.0, 1.0, 1.0])
    assert not failing.passed and failing.step == 1 and failing.failing_pair() == "a-b" and failing.reference_error is None
    fixed = stepwise_row("decode", "ids", {"a-b": np.array([0.0, 0.0])}, 0.0)  # one tolerance for every step, a gap of 0 passes it
    assert fixed.passed and fixed.tol == 0.0
    with pytest.raises(ValueError, match="need one value per step for at least one step"):
        stepwise_row("decode", "nothing", {"a-b": np.array([])}, 1.0)
