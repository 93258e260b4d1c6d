"""The train command (mhsa/train_cli.py: `mhsa train --backend NAME` and `python -m PACKAGE.train`):
it trains, saves, loads and resumes across backends; every flag or file it cannot use is refused
before the banner with its usage and one line (exit 2), an output that would overwrite an input
is refused before any work, a run that diverges stops in one line (exit 2), and no failure
prints a traceback. What it prints when all is well: test_train_output.py; Ctrl-C:
test_interrupt.py."""

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mhsa import registry, train_cli
from mhsa.cli import main
from mhsa.train_cli import full_precision
from shared import files, weights
from shared.config import ModelConfig, TrainConfig
from shared.history import History
from shared.weights import init_weights
from tests.backends import SMALL, names, package, skip_where_cuda_is_seen
from tests.commands import refused, run_cli
from tests.contract.test_checkpoint import is_pair, save
from tests.failing_disk import FailingOs
from tests.paths import ROOT
from tests.tiers import first_fast
from tests.weight_files import BAD_ARRAYS, Payload, changed, good_bytes, write_exchange

TRAINERS = names("train")
TINY = ["--quiet", "--epochs", "1", "--n-sequences", "40", "--batch-size", "8"]
TINY += ["--d-model", "8", "--n-heads", "2", "--seq-len", "5", "--vocab-size", "7"]


def run_main(capsys, backend, *flags):
    """train_cli.main in this process, as `python -m PACKAGE.train --quiet FLAGS`: (exit status, stdout, stderr)."""
    try:
        status = train_cli.main(backend, ["--quiet", *flags])
    except SystemExit as exit:
        status = exit.code
    out, err = capsys.readouterr()
    return status, out, err


# --- runs, saves, loads and resumes -----------------------------------------------------------------


def test_mhsa_train_runs_a_backend(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--backend", TRAINERS[0], "--epochs", "1", "--n-sequences", "64", "--n-heads", "8"]) == 0
    out, err = capsys.readouterr()
    assert "n_heads=8 (d_head=4)" in out and "epoch 1/1" in out, err


def test_a_small_run_defaults_to_one_thread_a_large_one_to_the_libraries_own_and_threads_n_sets_n(capsys, monkeypatch):
    import mhsa.threads
    from mhsa.threads import default_train_threads

    applied = []  # what each run asked for, none of it applied to this process's libraries
    monkeypatch.setattr(train_cli, "apply_threads", applied.append)
    monkeypatch.setattr(mhsa.threads, "apply_threads", applied.append)
    m, t = ModelConfig(), TrainConfig()
    assert default_train_threads(t.batch_size, m.max_len, m.d_model, m.vocab_size) == 1  # the lesson's model and batch
    assert default_train_threads(32, 256, 512, 32000) is None  # a step of billions of multiply-adds
    assert run_main(capsys, TRAINERS[0], *TINY)[0] == 0
    assert applied == [1]  # the command line's default, applied before the framework starts
    applied.clear()
    assert main(["train", "--backend", TRAINERS[0], "--threads", "2", *TINY]) == 0
    assert applied == [2]  # a given --threads alone, applied before the command starts (mhsa.cli.run_guarded)


@pytest.mark.parametrize("backend", first_fast(TRAINERS))
def test_save_then_load_continues_from_the_saved_weights(backend, tmp_path):
    flags = ["--epochs", "1", "--n-sequences", "128", "--seq-len", "6", "--vocab-size", "9"]
    first = run_cli(backend, *flags, "--save", "w.safetensors", "--history", "a.json", "--heatmap-head", "3", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "head 3 of 4" in first.stdout and "saved weights to w.safetensors" in first.stdout
    second = run_cli(backend, "--epochs", "1", "--n-sequences", "128", "--load", "w.safetensors", "--history", "b.json", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "max_len=6" in second.stdout and "init=w.safetensors" in second.stdout
    a, b = History.load(tmp_path / "a.json"), History.load(tmp_path / "b.json")
    assert b.losses[0] < a.losses[0] / 2  # starts where the first run left off, not from scratch
    clash = run_cli(backend, "--load", "w.safetensors", "--n-heads", "2", "--d-model", "32", cwd=tmp_path)
    assert clash.returncode == 2 and "--n-heads 2 (file has 4)" in clash.stderr


def test_a_run_saved_by_one_backend_is_resumed_by_another(tmp_path):
    first, other = TRAINERS[0], TRAINERS[1]
    flags = ["--epochs", "1", "--n-sequences", "96", "--seq-len", "6", "--vocab-size", "9", "--heatmap-head", "2"]
    saved = run_cli(first, *flags, "--save", "w.safetensors", "--history", "a.json", cwd=tmp_path)
    assert saved.returncode == 0, saved.stderr
    out = saved.stdout
    assert out.startswith(f"backend {first}\nmodel  vocab_size=9 d_model=32 n_heads=4 (d_head=8) max_len=6")
    assert "epoch 1/1  mean loss " in out and "final loss " in out and f"{first} · head 2 of 4" in out
    assert "saved weights to w.safetensors (Adam's state to w.adam.safetensors)" in out and saved.stderr == ""
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["backend"] == first and len(data["losses"]) == 3
    resumed = run_cli(other, "--epochs", "2", "--n-sequences", "96", "--resume", "w.safetensors", "--history", "b.json", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resume after epoch 1 (step 3) of a saved run" in resumed.stdout
    history = History.load(tmp_path / "b.json")
    assert history.first_step == 3 and len(history.losses) == 3


RESUMED_RUN = ["--n-sequences", "48", "--batch-size", "16"]  # not --quiet: the tests read the banner
MODEL = ["--seq-len", "5", "--vocab-size", "11", "--d-model", "24"]


@pytest.mark.parametrize("backend", first_fast(TRAINERS))
def test_resume_keeps_the_saved_lr_unless_a_flag_overrides_it_and_says_so(tmp_path, backend):
    done = run_cli(backend, *RESUMED_RUN, *MODEL, "--epochs", "1", "--lr", "0.02", "--save", "run.safetensors", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    kept = run_cli(backend, *RESUMED_RUN, "--epochs", "2", "--resume", "run.safetensors", cwd=tmp_path)
    assert kept.returncode == 0, kept.stderr
    assert "lr=0.02 " in kept.stdout and "overridden" not in kept.stdout
    changed_lr = run_cli(backend, *RESUMED_RUN, "--epochs", "2", "--resume", "run.safetensors", "--lr", "0.005", cwd=tmp_path)
    assert changed_lr.returncode == 0, changed_lr.stderr
    assert "lr=0.005 " in changed_lr.stdout and "overridden from the saved run: lr=0.005 (saved run: 0.02)" in changed_lr.stdout


def test_resume_reads_each_file_once(tmp_path, monkeypatch):
    path = tmp_path / "run.safetensors"
    save(path, train_config=TrainConfig(epochs=1, batch_size=16, n_sequences=48), epochs_done=1)
    opened = []
    real = files.open_regular
    monkeypatch.setattr(files, "open_regular", lambda name, what: opened.append(Path(name).name) or real(name, what))
    done = run_cli(TRAINERS[0], *RESUMED_RUN, "--epochs", "2", "--resume", str(path), "--history", "h.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(opened) == ["run.adam.safetensors", "run.safetensors"]
    history = json.loads((tmp_path / "h.json").read_text())
    assert history["init"] == "file" and history["source"] == str(path)
    assert history["source_sha256"] == weights.read(path).digest


def test_a_full_disk_during_the_commands_save_says_what_is_on_disk(tmp_path, monkeypatch):
    path = tmp_path / "run.safetensors"
    save(path, seed=0)
    failing = FailingOs(fail_at=3)  # the figure's write, fsync and rename go through; the weights' temporary does not
    monkeypatch.setattr(files, "os", failing)
    done = run_cli(
        TRAINERS[0], *RESUMED_RUN, *MODEL, "--quiet", "--epochs", "1", "--save", str(path), "--plot", str(tmp_path / "p.png"), cwd=tmp_path
    )
    monkeypatch.undo()
    assert done.returncode == 2 and failing.calls == ["write", "fsync", "replace", "write"]
    assert done.stderr == (
        f"python -m {package(TRAINERS[0])}.train: error: [Errno 28] cannot write {str(path)!r}: No space left on device; "
        f"nothing was replaced: a checkpoint saved there before is whole; written before it: {tmp_path / 'p.png'}\n"
    )
    assert is_pair(path, seed=0, scale=1.0)


# --- flags it cannot use: exit 2, its usage and one line, before any work ---------------------------

BAD_FLAGS = {
    "--epochs -1": (["--epochs", "-1"], r"error: argument --epochs: expected an integer in \[1, 1000000\], got -1"),
    "--n-heads 5 --d-model 32": (["--n-heads", "5", "--d-model", "32"], r"error: d_model=32 is not divisible by n_heads=5"),
    "--dtype float16": (["--dtype", "float16"], r"error: argument --dtype: invalid choice: 'float16' \(choose from 'float32', 'float64'\)"),
    "--lr 0": (["--lr", "0"], r"error: argument --lr: expected a positive finite number, got 0"),
    "--heatmap-head 4": (["--heatmap-head", "4"], r"error: --heatmap-head 4 is out of range: the model has 4 heads \(0..3\)"),
    "--save in a missing folder": (
        ["--save", "no/such/folder/w.safetensors"],
        r"error: --save 'no/such/folder/w.safetensors': folder 'no/such/folder' does not exist",
    ),
    "--history a folder": (["--history", "."], r"error: --history '.' is a directory, expected a file name"),
    "D=T=65536": (
        ["--d-model", "65536", "--seq-len", "65536", "--n-heads", "1"],
        r"error: this run needs an estimated [\d.]+ GiB of memory \(parameters .* GiB, activations .* GiB, data .* GiB\), "
        r"more than the .* available; choose smaller sizes",
    ),
    "--n-sequences 2e9": (["--n-sequences", "2000000000"], r"error: this run needs an estimated [\d.]+ GiB of memory"),
}


@pytest.mark.parametrize("backend_name", TRAINERS)
@pytest.mark.parametrize("case", BAD_FLAGS, ids=str)
def test_bad_flags_exit_2_with_an_argparse_message_before_any_training(capsys, backend_name, case):
    flags, pattern = BAD_FLAGS[case]
    status, out, err = run_main(capsys, backend_name, *flags)
    assert status == 2
    assert err.startswith("usage: ")
    assert re.search(rf"^python -m {package(backend_name)}.train: {pattern}", err.splitlines()[-1]), err
    assert "Traceback" not in err and out == ""  # refused before a single step


@pytest.mark.parametrize("name", [name for name in TRAINERS if name not in names("layers")])
def test_native_init_is_refused_before_any_work_where_a_backend_has_no_layers(capsys, name):
    err = refused(capsys, "train", "--backend", name, "--init", "native")
    assert f"--init native asks for the framework layers' own initializers; the {name} backend has none" in err


DP_3 = "batch_size=32 is not divisible by dp=3: every global batch is split into 3 equal shards"


@pytest.mark.parametrize("name", names("dp"))
def test_a_dp_that_does_not_split_the_batch_is_refused_before_the_banner_with_the_commands_usage(capsys, name):
    err = refused(capsys, "train", "--backend", name, "--dp", "3")
    assert err.startswith("usage: mhsa train ") and err.splitlines()[-1] == f"mhsa train: error: {DP_3}"
    result = run_cli(name, "--dp", "3", cwd=".")
    assert result.returncode == 2 and result.stdout == "" and result.stderr.startswith(f"usage: python -m {package(name)}.train ")
    assert result.stderr.splitlines()[-1] == f"python -m {package(name)}.train: error: {DP_3}"


@pytest.mark.parametrize(
    "name, flags, message",
    [
        *[
            (name, [], f"--compile: the {name} backend has no opt-in compiler; --compile is for torch")
            for name in TRAINERS
            if name not in names("compile")
        ],
        *[
            (name, ["--dp", "2"], "--compile with --dp 2: torch.compile runs on one device here; leave out one of the two")
            for name in names("compile")
        ],
    ],
)
def test_the_compile_flag_is_refused_where_it_cannot_apply_before_any_work(capsys, name, flags, message):
    err = refused(capsys, "train", "--backend", name, "--compile", *flags)
    assert message in err, err


@pytest.mark.parametrize("name", [name for name in TRAINERS if registry.get(name).framework != "jax"])
def test_no_jax_cache_is_refused_for_a_backend_without_jax(capsys, name):
    assert f"--no-jax-cache: the {name} backend does not compile with JAX" in refused(capsys, "train", "--backend", name, "--no-jax-cache")


# --- --device and --full-precision ------------------------------------------------------------------


@pytest.mark.parametrize("name", [name for name in TRAINERS if "device" not in registry.get(name).supports])
def test_a_cpu_only_backend_refuses_cuda_before_any_work(capsys, name):
    err = refused(capsys, "train", "--backend", name, "--device", "cuda")
    assert f"--device cuda: the {name} backend runs on the CPU only" in err


@pytest.mark.parametrize("name", names("device"))
def test_cuda_with_data_parallel_is_refused_before_any_work(capsys, name):
    err = refused(capsys, "train", "--backend", name, "--device", "cuda", "--dp", "2")
    assert "device 'cuda' with dp=2: the data-parallel trainers run their ranks on CPU devices only" in err


def test_an_unknown_device_is_refused_by_the_parser(capsys):
    err = refused(capsys, "train", "--backend", TRAINERS[0], "--device", "tpu")
    assert "argument --device: invalid choice: 'tpu' (choose from " in err


@pytest.mark.parametrize("name", names("device"))
def test_cuda_where_the_framework_sees_no_gpu_is_refused_before_the_banner(capsys, name):
    skip_where_cuda_is_seen(name)
    err = refused(capsys, "train", "--backend", name, "--device", "cuda", "--quiet")
    assert err.startswith("usage: mhsa train "), err
    assert err.splitlines()[-1].startswith(f"mhsa train: error: device 'cuda': {name} sees no CUDA device"), err


@pytest.mark.parametrize("name", names("device"))
def test_full_precision_sets_what_parity_sets_for_the_run_and_restores_it(name):
    before = _precision_settings()
    with full_precision(registry.get(name), True):
        torch_tf32, cudnn_tf32, torch_precision, jax_precision = _precision_settings()
        if name == "torch":
            assert (torch_tf32, cudnn_tf32, torch_precision) == (False, False, "highest")
        else:
            assert jax_precision == "highest"
    assert _precision_settings() == before
    with full_precision(registry.get(name), False):
        assert _precision_settings() == before


# a framework that compiles per precision setting (capability "jit") would compile the run twice;
# the settings test above covers it
@pytest.mark.parametrize("name", [name for name in TRAINERS if "jit" not in registry.get(name).supports])
def test_full_precision_trains_the_same_run_on_a_cpu(tmp_path, capsys, monkeypatch, name):
    """The run is trained inside full_precision; on a CPU float32 matmuls are always full
    precision, so the flag changes no loss."""
    asked = []
    monkeypatch.setattr(train_cli, "full_precision", lambda backend, flag: asked.append(flag) or full_precision(backend, flag))
    losses = {}
    for flag in ([], ["--full-precision"]):
        path = tmp_path / f"history{len(flag)}.json"
        assert main(["train", "--backend", name, *TINY, "--history", str(path), *flag]) == 0
        losses[bool(flag)] = json.loads(path.read_text())["losses"]
    capsys.readouterr()
    assert asked == [False, True]
    assert losses[True] == losses[False], f"{name}: --full-precision changed the losses on a CPU"


def _precision_settings() -> tuple:
    import jax
    import torch

    return (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
        jax.config.jax_default_matmul_precision,
    )


# --- JAX's compilation cache ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, note",
    [
        ([], None),  # on by default, and silent
        (["--no-jax-cache"], None),
        ([], "JAX's compilation cache is off, /nowhere cannot be used (planted): every program was compiled afresh"),
    ],
)
def test_the_train_command_keeps_jaxs_compiled_programs_unless_told_not_to(monkeypatch, tmp_path, flags, note):
    """Where the cache lives and what it keeps: tests/tools/test_compile_cache.py."""
    from mhsa import compile_cache

    asked = []
    monkeypatch.setattr(compile_cache, "enable_jax_cache", lambda: asked.append(True) or note or "JAX's compiled programs are kept in ...")
    result = run_cli("jax", *TINY, *flags, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert asked == ([] if flags else [True])
    assert result.stdout.startswith("final loss ") and result.stdout.count("\n") == 1, result.stdout  # --quiet: the final line alone
    assert result.stderr == (f"note: {note}\n" if note else ""), result.stderr


# --- weights files it cannot use --------------------------------------------------------------------


def nan_weights():
    arrays = init_weights(SMALL, 0)
    arrays["pos_emb.weight"][2, 5] = np.nan
    return arrays


def infinite_weights():
    arrays = init_weights(SMALL, 0)
    arrays["attn.out_proj.weight"][1, 2] = -np.inf
    return arrays


# name: (write the file at `path`, the message after "error: ", a pattern: {path} is the file's repr)
BAD_LOAD_FILES = {
    "missing key": (lambda path: write_exchange(path, changed(drop="lm_head.bias")), "weights file {path}: " + BAD_ARRAYS["missing key"][2][1:]),
    "truncated": (
        lambda path: path.write_bytes(good_bytes(path.parent)[:-1]),
        r"weights file {path} is truncated: its header describes more data than the file holds$",
    ),
    "pickle": (
        lambda path: path.write_bytes(pickle.dumps(Payload(path.parent / "unpickled"))),
        r"weights file {path} is not a safetensors file \(no valid header; a pickle or torch.save file is refused and never unpickled\)$",
    ),
    "NaN": (
        lambda path: weights.save(path, nan_weights(), SMALL),
        r"weights file {path} holds NaN or infinite values in \['pos_emb.weight'\]; refusing to use it$",
    ),
    "infinity": (
        lambda path: weights.save(path, infinite_weights(), SMALL),
        r"weights file {path} holds NaN or infinite values in \['attn.out_proj.weight'\]; refusing to use it$",
    ),
    "float64 without --dtype": (
        lambda path: weights.save(path, init_weights(SMALL, 0, "float64"), SMALL),
        r"weights file {path} is float64 and this run trains in float32; add --dtype float64$",
    ),
}


@pytest.mark.parametrize("backend_name", TRAINERS)
@pytest.mark.parametrize("case", BAD_LOAD_FILES, ids=str)
def test_a_load_file_it_cannot_use_exits_2_naming_it_before_the_banner(capsys, tmp_path, backend_name, case):
    write, pattern = BAD_LOAD_FILES[case]
    path = tmp_path / "bad.safetensors"
    write(path)
    status, out, err = run_main(capsys, backend_name, "--epochs", "1", "--n-sequences", "64", "--load", str(path))
    # the file's line alone where the flags are right; a file that asks for another flag (--dtype) is a flag error, with the usage
    flag_error = case == "float64 without --dtype"
    assert status == 2 and out == "" and (err.startswith("usage: ") if flag_error else len(err.splitlines()) == 1), err
    expected = rf"python -m {package(backend_name)}.train: error: " + pattern.replace("{path}", re.escape(repr(str(path))))
    assert re.fullmatch(expected, err.splitlines()[-1]), err
    assert not (tmp_path / "unpickled").exists()


@pytest.mark.slow
def test_load_of_a_fifo_exits_2_at_once(tmp_path):
    path = tmp_path / "model.safetensors"
    os.mkfifo(path)
    done = subprocess.run(
        [sys.executable, "-m", "mhsa.cli", "train", "--backend", TRAINERS[0], "--load", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == f"mhsa train: error: weights file {str(path)!r} is a FIFO, expected a regular file"


# --- outputs never overwrite inputs or each other ---------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        "--history is --load",
        "--save is --load",
        "--history is --save's companion",
        "--history is a hard link to --load",
        "--history and --save",
        "--save is --resume",
    ],
)
def test_an_output_colliding_with_an_input_or_another_output_is_refused_before_any_work(capsys, tmp_path, case):
    source = tmp_path / "model.safetensors"
    weights.save(source, init_weights(SMALL, 0), SMALL)
    before = source.read_bytes()
    link = tmp_path / "link.json"
    os.link(source, link)
    argv = {
        "--history is --load": ["--load", str(source), "--history", str(source)],
        "--save is --load": ["--load", str(source), "--save", str(tmp_path / "." / "model.safetensors")],
        "--history is --save's companion": ["--save", str(tmp_path / "x.safetensors"), "--history", str(tmp_path / "x.adam.safetensors")],
        "--history is a hard link to --load": ["--load", str(source), "--history", str(link)],
        "--history and --save": ["--save", str(tmp_path / "out.safetensors"), "--history", str(tmp_path / "out.safetensors")],
        "--save is --resume": ["--resume", str(source), "--save", str(source)],
    }[case]
    status, out, err = run_main(capsys, TRAINERS[0], "--epochs", "1", "--n-sequences", "32", *argv)
    assert status == 2 and out == "", err
    assert re.search(r"(is the input .* it would be overwritten|are the same file)", err.splitlines()[-1]), err
    assert source.read_bytes() == before


# --- a run that fails ---------------------------------------------------------------------------------

SMALL_RUN = ["--epochs", "1", "--n-sequences", "64", "--seq-len", "5", "--vocab-size", "11", "--d-model", "24"]


@pytest.mark.parametrize("backend_name", TRAINERS)
def test_a_run_whose_loss_overflows_stops_in_one_line(capsys, tmp_path, backend_name):
    # lr 1e30 overflows float32 at the first update (lr 1e6 does not: Adam moves each weight by
    # about lr per step and the copy task still learns when saturated)
    status, out, err = run_main(capsys, backend_name, *SMALL_RUN, "--lr", "1e30", "--save", str(tmp_path / "w.safetensors"))
    assert status == 2
    assert err.splitlines() == [
        f"python -m {package(backend_name)}.train: error: loss became non-finite at step 1 (epoch 1): nan; training stopped (try a smaller --lr)"
    ]
    assert os.listdir(tmp_path) == []  # nothing saved from a diverged run


@pytest.mark.slow
def test_as_a_command_the_errors_are_one_line_without_traceback(tmp_path):
    # the same two failures in a real process: the exit status and stderr a user sees
    diverged = subprocess.run(
        [sys.executable, "-m", f"{package(TRAINERS[0])}.train", "--quiet", *SMALL_RUN, "--lr", "1e30"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert diverged.returncode == 2
    assert diverged.stderr.splitlines() == [
        f"python -m {package(TRAINERS[0])}.train: error: loss became non-finite at step 1 (epoch 1): nan; training stopped (try a smaller --lr)"
    ]
    bad_flags = subprocess.run(
        [sys.executable, "-m", "mhsa.cli", "train", "--backend", TRAINERS[0], "--n-heads", "5", "--d-model", "32"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad_flags.returncode == 2
    assert bad_flags.stderr.splitlines()[-1] == (
        "mhsa train: error: d_model=32 is not divisible by n_heads=5; d_model must be a multiple of n_heads (d_head = d_model // n_heads)"
    )
    assert "Traceback" not in diverged.stderr + bad_flags.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", names("dp"))
def test_a_tmpdir_too_deep_for_a_socket_is_said_in_one_line_where_the_ranks_need_one(tmp_path, name):
    # a rank server (multiprocessing's forkserver) listens on a Unix socket in a folder it makes in
    # TMPDIR, and a socket's path holds at most 107 bytes: a backend that needs one says so; one that
    # does not trains as usual
    deep = tmp_path / ("x" * 100)
    deep.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", f"{package(name)}.train", *TINY, "--dp", "2"],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(deep)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode == 0:
        assert done.stderr == ""
        return
    assert (done.returncode, done.stderr.splitlines()) == (
        2,
        [
            f"python -m {package(name)}.train: error: TMPDIR {str(deep)!r}: too long for the socket of the ranks' server "
            "(a Unix socket's path holds at most 107 bytes); set TMPDIR to a shorter folder, such as /tmp"
        ],
    )
