"""Hostile input, one family at a time: files that would hang or flood a reader, outputs that
would overwrite inputs, sizes that cannot fit, integer flags out of their documented range,
one dtype rule for every backend's block, histories that are not histories, and Ctrl-C at
any moment of a real process. Every case ends in one line, never a hang or a traceback."""

import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from mhsa import flags, registry, train_cli
from mhsa.cli import main as mhsa
from mhsa.epoch_keeper import has_on_epoch
from shared import checks, weights
from shared.history import History
from shared.weights import init_weights
from tests.backends import SMALL, names, package
from tests.paths import ROOT


def finishes(call, seconds=10.0):
    """call() in a daemon thread: (finished, exception). A reader that blocks fails the test
    instead of hanging it."""
    outcome = {}

    def target():
        try:
            call()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), outcome.get("error")


# --- files that are not regular files ---------------------------------------------------------


def special(tmp_path, kind) -> Path:
    path = tmp_path / "model.safetensors"
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "/dev/zero symlink":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    return path


READERS = {
    "weights": lambda path: weights.load(path),
    "history": lambda path: History.load(path),
}


@pytest.mark.parametrize("reader", READERS, ids=str)
@pytest.mark.parametrize("kind, word", [("FIFO", "a FIFO"), ("/dev/zero symlink", "a device"), ("directory", "a directory")])
def test_a_fifo_a_device_or_a_folder_is_refused_at_once(tmp_path, reader, kind, word):
    path = special(tmp_path, kind)
    done, error = finishes(lambda: READERS[reader](path))
    assert done, f"reading {kind} did not return"
    assert isinstance(error, ValueError) and re.search(rf"'{re.escape(str(path))}' is {word}, expected a regular file$", str(error)), error


def test_train_load_of_a_fifo_exits_2_at_once(tmp_path):
    path = special(tmp_path, "FIFO")
    done = subprocess.run(
        [sys.executable, "-m", "mhsa.cli", "train", "--backend", names("train")[0], "--load", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == f"mhsa train: error: weights file {str(path)!r} is a FIFO, expected a regular file"


# --- crafted safetensors headers ----------------------------------------------------------------


def crafted(tmp_path, header: bytes, length: int | None = None, body: bytes = b"") -> Path:
    path = tmp_path / "crafted.safetensors"
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + body)
    return path


def test_an_oversized_header_is_refused_before_it_is_read(tmp_path):
    path = crafted(tmp_path, b"{" + b" " * 64, length=weights.MAX_HEADER + 1)
    with open(path, "r+b") as file:  # sparse: the announced header exists on disk
        file.truncate(8 + weights.MAX_HEADER + 1)
    with pytest.raises(ValueError, match=rf"its header announces {weights.MAX_HEADER + 1} bytes, more than the {weights.MAX_HEADER}-byte limit"):
        weights.load(path)


def test_a_deeply_nested_header_is_refused_without_recursion(tmp_path):
    path = crafted(tmp_path, b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    with pytest.raises(ValueError, match=r"its header nests 100001 levels deep, more than the 3 a safetensors header has"):
        weights.load(path)


def test_a_huge_sparse_file_is_refused_before_its_body_is_read(tmp_path):
    path = tmp_path / "huge.safetensors"
    weights.save(path, init_weights(SMALL, 0), SMALL)
    with open(path, "r+b") as file:
        file.truncate(path.stat().st_size + (1 << 40))  # a terabyte of holes after the data
    with pytest.raises(ValueError, match=r"1099511627776 bytes follow the data its header describes"):
        weights.load(path)


def test_a_body_larger_than_memory_is_refused_naming_the_estimate(tmp_path):
    config = SMALL.__class__(vocab_size=2**28, d_model=64, n_heads=4, max_len=7)  # tok_emb alone: 64 GiB
    shapes = weights.param_shapes(config)
    header, offset = {"__metadata__": {"format": weights.FORMAT, "format_version": "1", "config": json.dumps(config.to_dict())}}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    if offset <= checks.available_memory():
        pytest.skip("this machine has more memory than the crafted file declares")
    path = crafted(tmp_path, json.dumps(header).encode())
    with open(path, "r+b") as file:
        file.truncate(path.stat().st_size + offset)
    with pytest.raises(ValueError, match=r"reading weights file .* needs an estimated [\d.]+ GiB of memory, more than the .* available"):
        weights.load(path)


def test_overlapping_tensors_are_refused_in_one_line(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    path = crafted(tmp_path, json.dumps(header).encode(), body=bytes(12))
    with pytest.raises(ValueError, match=r"tensor 'b' starts at byte 4, expected 8 \(tensors overlap or leave a gap\)"):
        weights.load(path)


def test_bfloat16_weights_are_named_as_such(tmp_path):
    import safetensors.numpy

    path = tmp_path / "bf16.safetensors"
    arrays = {name: value.astype(ml_dtypes.bfloat16).view(np.uint16) for name, value in init_weights(SMALL, 0).items()}
    payload = safetensors.numpy.save(arrays, {"format": weights.FORMAT, "config": json.dumps(SMALL.to_dict())})
    length = int.from_bytes(payload[:8], "little")
    header = json.loads(payload[8 : 8 + length])
    for name in arrays:
        header[name]["dtype"] = "BF16"  # the same bytes, declared as bfloat16
    encoded = json.dumps(header).encode()
    payload = struct.pack("<Q", len(encoded)) + encoded + payload[8 + length :]
    path.write_bytes(payload)
    with pytest.raises(ValueError, match=r"weights\['tok_emb.weight'\] has dtype bfloat16, expected one of float32, float64$"):
        weights.load(path)


def test_a_config_without_vocab_size_is_refused_not_defaulted(tmp_path):
    import safetensors.numpy

    path = tmp_path / "no-vocab.safetensors"
    config = {key: value for key, value in SMALL.to_dict().items() if key != "vocab_size"}
    safetensors.numpy.save_file(init_weights(SMALL, 0), str(path), {"format": weights.FORMAT, "config": json.dumps(config)})
    with pytest.raises(ValueError, match=r"has an invalid config in its metadata: missing field\(s\) \['vocab_size'\]"):
        weights.load(path)


# --- outputs never overwrite inputs or each other ---------------------------------------------


def run_main(capsys, *flags):
    try:
        status = train_cli.main(names("train")[0], ["--quiet", "--epochs", "1", "--n-sequences", "32", *flags])
    except SystemExit as exit:
        status = exit.code
    return status, *capsys.readouterr()


@pytest.mark.parametrize(
    "case",
    [
        "--history is --load",
        "--save is --load",
        "--plot is --save's companion",
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
        "--plot is --save's companion": ["--save", str(tmp_path / "x.safetensors"), "--plot", str(tmp_path / "x.adam.safetensors.png")],
        "--history is a hard link to --load": ["--load", str(source), "--history", str(link)],
        "--history and --save": ["--save", str(tmp_path / "out.safetensors"), "--history", str(tmp_path / "out.safetensors")],
        "--save is --resume": ["--resume", str(source), "--save", str(source)],
    }[case]
    if case == "--plot is --save's companion":  # a .png companion cannot exist: collide the history instead
        argv = ["--save", str(tmp_path / "x.safetensors"), "--history", str(tmp_path / "x.adam.safetensors")]
    status, out, err = run_main(capsys, *argv)
    assert status == 2 and out == "", err
    assert re.search(r"(is the input .* it would be overwritten|are the same file)", err.splitlines()[-1]), err
    assert source.read_bytes() == before


def test_heads_and_compare_refuse_a_plot_over_their_input(tmp_path, capsys):
    source = tmp_path / "model.png"
    weights.save(source, init_weights(SMALL, 0), SMALL)
    assert mhsa(["heads", "--load", str(source), "--plot", str(source)]) == 1
    assert "is the input --load" in capsys.readouterr().err
    history = tmp_path / "h.png"
    History("numpy", SMALL, train_cli.TrainConfig(), [1.0], [1.0], 0.1).save(history)
    assert mhsa(["compare", str(history), str(history), "--plot", str(history)]) == 1
    assert "is the input A.json" in capsys.readouterr().err


# --- sizes and integer flags --------------------------------------------------------------------


def test_the_documented_ranges_are_the_ones_enforced():
    table = re.findall(r"^    ((?:parity )?--[a-z-]+)\s+\[(\d+), (\d+)\]", flags.__doc__, re.MULTILINE)
    assert {flag: (int(low), int(high)) for flag, low, high in table} == flags.RANGES


@pytest.mark.parametrize(
    "argv, pattern",
    [
        (["--seed", str(2**63)], r"argument --seed: expected an integer in \[0, 4294967295\], got 9223372036854775808"),
        (["--seed", "-1"], r"argument --seed: expected an integer in \[0, 4294967295\], got -1"),
        (["--d-model", "100000"], r"argument --d-model: expected an integer in \[1, 65536\], got 100000"),
        (["--n-sequences", "10000000000"], r"argument --n-sequences: expected an integer in \[1, 2147483647\], got 10000000000"),
        (
            ["--d-model", "65536", "--seq-len", "65536", "--n-heads", "1"],
            r"this run needs an estimated [\d.]+ GiB of memory \(parameters .* GiB, activations .* GiB, data .* GiB\), "
            r"more than the .* available; choose smaller sizes",
        ),
        (["--n-sequences", "2000000000"], r"this run needs an estimated [\d.]+ GiB of memory"),
    ],
    ids=["seed 2**63", "seed -1", "d-model 1e5", "n-sequences 1e10", "D=T=65536", "n-sequences 2e9"],
)
def test_sizes_out_of_range_or_too_big_to_fit_are_refused_before_allocation(capsys, argv, pattern):
    status, out, err = run_main(capsys, *argv)
    assert status == 2 and out == ""
    assert re.search(pattern, err.splitlines()[-1]), err


@pytest.mark.parametrize("name", names("train"))
def test_the_largest_seed_trains_in_every_backend(name):
    from mhsa import registry
    from shared.config import TrainConfig

    run = registry.get(name).train.train(SMALL, TrainConfig(epochs=1, n_sequences=32, seed=2**32 - 1))
    assert np.isfinite(run.losses).all()


def test_heads_refuses_a_token_id_beyond_int32_in_one_line(capsys, tmp_path):
    path = tmp_path / "model.safetensors"
    weights.save(path, init_weights(SMALL, 0), SMALL)
    with pytest.raises(SystemExit) as exit:
        mhsa(["heads", "--load", str(path), "--tokens", "99999999999999999999"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("expected token ids in [0, 2147483647], got 99999999999999999999")


def test_float64_weights_without_dtype_are_refused_before_the_banner_with_the_flag_to_add(capsys, tmp_path):
    path = tmp_path / "model.safetensors"
    weights.save(path, init_weights(SMALL, 0, "float64"), SMALL)
    status, out, err = run_main(capsys, "--load", str(path))
    assert status == 2 and out == ""
    assert err.splitlines()[-1].endswith(f"weights file {str(path)!r} is float64 and this run trains in float32; add --dtype float64")


# --- one dtype rule for the block, in every backend ---------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", ml_dtypes.bfloat16, "float64"], ids=["float16", "bfloat16", "float64"])
def test_an_input_in_another_dtype_than_the_block_is_refused_the_same_way_everywhere(backend, dtype):
    x = np.random.default_rng(0).standard_normal((3, 5, SMALL.d_model)).astype(dtype)
    message = (
        f"attention input has dtype {np.dtype(dtype).name}, expected float32 (the block's dtype); convert it first, nothing is converted silently"
    )
    with pytest.raises(TypeError, match="^" + re.escape(message) + "$"):
        backend.attention(x, init_weights(SMALL, 0, "float32"), SMALL)


def test_uint64_tokens_are_refused_the_same_way_everywhere(backend):
    with pytest.raises(TypeError, match=r"^tokens must be an integer array \(B, T\) of int32 or int64, got dtype uint64$"):
        backend.forward(np.zeros((3, 5), np.uint64), init_weights(SMALL, 0, "float32"), SMALL)


def test_an_id_equal_to_vocab_size_is_refused_by_loss_and_grads_in_every_backend(autodiff_backend):
    ids = np.zeros((3, 5), np.int64)
    ids[1, 2] = SMALL.vocab_size
    with pytest.raises(ValueError, match=r"^token id 11 is out of range: ids must lie in \[0, 11\) for vocab_size=11$"):
        autodiff_backend.loss_and_grads(ids, np.zeros((3, 5), np.int64), init_weights(SMALL, 0, "float32"), SMALL)


# --- histories that are not histories -----------------------------------------------------------


@pytest.mark.parametrize(
    "losses, pattern",
    [
        ([], r"losses is empty"),
        (None, r"losses must be a flat list of numbers"),
        ([[1.0], [2.0]], r"losses must be a flat list of numbers"),
        (["1.0"], r"losses must be a flat list of numbers"),
    ],
    ids=["empty", "null", "nested", "strings"],
)
def test_compare_refuses_a_history_whose_losses_are_not_numbers_in_one_line(capsys, tmp_path, losses, pattern):
    good = tmp_path / "good.json"
    History("numpy", SMALL, train_cli.TrainConfig(), [1.0], [1.0], 0.1).save(good)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(good.read_text()), "losses": losses}))
    assert mhsa(["compare", str(good), str(bad)]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and re.search(pattern, err), err


@pytest.mark.parametrize(
    "value, loads",
    [(None, True), (0.05, True), (-1.0, False), (0.2, False), ("2.0", False), (float("nan"), False), ([0.1], False)],
    ids=["null", "within", "negative", "over-seconds", "string", "nan", "list"],
)
def test_a_history_whose_compile_seconds_is_not_a_share_of_its_seconds_is_refused_in_one_line(tmp_path, value, loads):
    path = tmp_path / "h.json"
    History("torch", SMALL, train_cli.TrainConfig(), [1.0], [1.0], 0.1).save(path)
    path.write_text(json.dumps({**json.loads(path.read_text()), "compile_seconds": value}))
    if loads:
        assert History.load(path).compile_seconds == value
        return
    with pytest.raises(ValueError) as error:
        History.load(path)
    assert str(error.value).startswith(f"history file {str(path)!r}: compile_seconds must be null or a number in [0, seconds], got ")
    assert "\n" not in str(error.value)


def test_compare_names_every_differing_field_and_never_calls_different_inits_parity(capsys, tmp_path):
    from shared.config import TrainConfig

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    History("torch", SMALL, TrainConfig(), [2.0, 1.0], [1.5], 0.1, init="shared").save(a)
    History(
        "jax", SMALL.__class__(**{**SMALL.to_dict(), "attn_impl": "fused"}), TrainConfig(lr=0.02, seed=3), [2.0, 1.0], [1.5], 0.1, init="native"
    ).save(b)
    assert mhsa(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "model_config differs: attn_impl 'explicit' vs 'fused'" in out
    assert "train_config differs: lr 0.01 vs 0.02, seed 0 vs 3" in out
    assert "the runs' initial weights differ or are unknown (A: shared, B: native)" in out and "not a parity check" in out


# --- Ctrl-C in a real process ---------------------------------------------------------------------


def interrupted(argv, wait_for=None, delay=0.0, stream="stdout"):
    """Start argv, send SIGINT once `wait_for` appears on `stream` (or after `delay`), return
    (returncode, stdout, stderr lines other than -X importtime's)."""
    child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        seen = ""
        while wait_for is not None and wait_for not in seen:
            line = getattr(child, stream).readline()
            assert line, f"{wait_for!r} never appeared"
            seen += line
        time.sleep(delay)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    lines = [line for line in (seen if stream == "stderr" else "").splitlines() + err.splitlines() if not line.startswith("import time:")]
    return child.returncode, out, lines


def test_ctrl_c_while_python_m_impl_train_imports_its_command_line_prints_one_line_and_exits_130():
    # -X importtime reports each finished import on stderr: numpy's comes while the launcher
    # imports mhsa.train_cli, before any handler of train_cli exists (the interpreter's
    # own start-up, before the first line of the program, is beyond any program's reach)
    argv = [sys.executable, "-X", "importtime", "-m", f"{package(names('train')[0])}.train", "--quiet"]
    code, out, err = interrupted(argv, wait_for=" numpy\n", stream="stderr")
    assert code == 130 and err == ["interrupted"], err


@pytest.mark.parametrize("delay", [0.5, 1.5])
def test_ctrl_c_later_in_python_m_impl_train_prints_one_line_and_exits_130(delay):
    # a run long enough in every backend that the signal lands while it imports or trains
    argv = [sys.executable, "-m", f"{package(names('train')[0])}.train", "--quiet", "--epochs", "100000", "--n-sequences", "64"]
    code, out, err = interrupted(argv, delay=delay)
    assert code == 130 and err == ["interrupted"], err


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", [name for name in names("train") if not has_on_epoch(registry.get(name).train.train)])
def test_ctrl_c_during_training_with_save_says_nothing_was_saved_where_the_trainer_keeps_no_epoch(tmp_path, name):
    # a trainer without on_epoch hands over its model only at the end (mhsa/epoch_keeper.py); those
    # with it keep the last complete epoch: tests/tools/test_interrupt.py
    path = tmp_path / "w.safetensors"
    code, out, err = interrupted(
        [sys.executable, "-m", f"{package(name)}.train", "--epochs", "100000", "--n-sequences", "64", "--save", str(path)],
        wait_for="epoch 1/",
    )
    assert code == 130 and len(err) == 1, err
    assert re.fullmatch(r"interrupted in epoch \d+/100000: nothing was saved \(this trainer hands over its model only at the end\)", err[0]), err
    assert os.listdir(tmp_path) == []


# --- generate and the other readers of weights, on bad numbers -----------------------------------


def generated(capsys, *flags):
    assert mhsa(["generate", *flags]) == 0
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("generated: "))


@pytest.mark.parametrize("temperature", ["1e-308", "1e-300", "5e-324"])
def test_generate_at_a_tiny_temperature_is_greedy_not_id_0(capsys, tmp_path, temperature):
    path = tmp_path / "model.safetensors"
    weights.save(path, init_weights(SMALL, 3), SMALL)
    flags = ["--load", str(path), "--prompt", "4,4", "--max-new-tokens", "5"]
    greedy = generated(capsys, *flags)
    assert greedy != "generated: 0 0 0 0 0"  # the model has a choice other than id 0 to make
    assert generated(capsys, *flags, "--temperature", temperature) == greedy


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["NaN", "Inf"])
@pytest.mark.parametrize("command", ["train --load", "train --resume", "generate", "heads"])
def test_non_finite_weights_are_refused_alike_by_every_command_that_reads_them(capsys, tmp_path, command, bad):
    from shared import checkpoint
    from shared.adam_state import AdamState
    from shared.config import TrainConfig

    path = tmp_path / "bad.safetensors"
    arrays = init_weights(SMALL, 0)
    arrays["attn.out_proj.weight"][1, 2] = bad
    run = TrainConfig(epochs=1, n_sequences=64)
    moments = {name: np.zeros_like(value) for name, value in arrays.items()}
    checkpoint.save(path, arrays, AdamState(run.steps_per_epoch, 1, moments, moments, run), SMALL)
    argv = {
        "train --load": ["train", "--backend", names("train")[0], "--load", str(path)],
        "train --resume": ["train", "--backend", names("train")[0], "--resume", str(path), "--epochs", "2", "--n-sequences", "64"],
        "generate": ["generate", "--load", str(path), "--prompt", "1,1"],
        "heads": ["heads", "--load", str(path)],
    }[command]
    try:
        status = mhsa(argv)
    except SystemExit as exit:  # train refuses a file among its flags, through argparse
        status = exit.code
    out, err = capsys.readouterr()
    assert status == (2 if command.startswith("train") else 1) and out == ""
    message = f"weights file {str(path)!r} holds NaN or infinite values in ['attn.out_proj.weight']; refusing to use it"
    assert err.splitlines()[-1] == f"mhsa {command.split()[0]}: error: {message}"


def test_generate_refuses_weights_that_overflow_the_logits_in_one_line(capsys, tmp_path):
    path = tmp_path / "huge.safetensors"
    weights.save(path, {key: value * 1e30 if "qkv" in key else value for key, value in init_weights(SMALL, 10).items()}, SMALL)
    assert mhsa(["generate", "--load", str(path), "--prompt", "1,2", "--max-new-tokens", "2"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "mhsa generate: error: the logits of row(s) [0] hold NaN or infinite values (the weights overflow): no token can be chosen\n"
    )
