"""A checkpoint is one unit (shared/checkpoint.py): weights and their Adam companion bound by
the weights file's SHA-256, verified on every --resume; a save killed between its two files,
a full disk, a copied or tampered companion and inconsistent metadata are all refused;
stale temporaries of killed saves are removed by the next save; --resume continues the
saved optimizer settings unless a flag overrides them, and says so."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mhsa import train_cli
from shared import adam_state, checkpoint, files, weights
from shared.adam_state import AdamState, companion_path
from shared.config import TrainConfig
from tests.backends import SMALL, names
from tests.paths import ROOT

RUN = TrainConfig(epochs=2, batch_size=16, n_sequences=48)  # 3 steps per epoch


def state(config=SMALL, train_config=RUN, epochs_done=2, scale=1.0):
    moments = {name: np.full(shape, scale, np.float32) for name, shape in weights.param_shapes(config).items()}
    return AdamState(
        epochs_done * train_config.steps_per_epoch, epochs_done, moments, {name: value * 2 for name, value in moments.items()}, train_config
    )


def save(path, seed=0, **options):
    return checkpoint.save(path, weights.init_weights(SMALL, seed), state(**options), SMALL)


def test_a_saved_pair_loads_bound_to_its_weights(tmp_path):
    path = tmp_path / "run.safetensors"
    companion = save(path)
    assert companion == tmp_path / "run.adam.safetensors" and sorted(os.listdir(tmp_path)) == ["run.adam.safetensors", "run.safetensors"]
    loaded, resumed = checkpoint.load(path)
    assert resumed.step == 6 and resumed.epochs_done == 2 and loaded.config == SMALL
    header = json.loads(companion.read_bytes()[8 : 8 + int.from_bytes(companion.read_bytes()[:8], "little")])
    assert header["__metadata__"]["weights_sha256"] == loaded.digest


def test_a_companion_copied_from_another_run_is_refused(tmp_path):
    save(tmp_path / "a.safetensors", seed=0)
    save(tmp_path / "b.safetensors", seed=1)
    shutil.copy(tmp_path / "b.adam.safetensors", tmp_path / "a.adam.safetensors")
    with pytest.raises(ValueError, match=r"belongs to other weights than the file beside it .* refusing to resume"):
        checkpoint.load(tmp_path / "a.safetensors")


def test_tampered_weights_are_refused(tmp_path):
    path = tmp_path / "run.safetensors"
    save(path)
    arrays, _ = weights.load(path)
    arrays["lm_head.bias"][0] += 1
    weights.save(path, arrays, SMALL)  # the weights alone, as a --load-only tool would
    with pytest.raises(ValueError, match=r"belongs to other weights"):
        checkpoint.load(path)


def test_a_companion_from_before_the_binding_is_refused_and_bind_converts_it(tmp_path):
    path = tmp_path / "run.safetensors"
    weights.save(path, weights.init_weights(SMALL, 0), SMALL)
    adam_state.save(companion_path(path), state(), SMALL)  # no digest: the format before the binding
    with pytest.raises(
        ValueError,
        match=r"does not record which weights file it belongs to .* "
        r"`mhsa bind WEIGHTS.safetensors`",
    ):
        checkpoint.load(path)
    done = subprocess.run([sys.executable, "-m", "mhsa.cli", "bind", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert checkpoint.load(path)[1].step == 6


BAD_METADATA = {
    "epochs_done -1": ({"epochs_done": "-1"}, r"epochs_done='-1' is not a non-negative integer"),
    "step not a number": ({"step": "six"}, r"step='six' is not a non-negative integer"),
    "step far from epochs": ({"step": "500"}, r"step=500 does not match epochs_done=2 x 3 steps per epoch = 6"),
    "epochs_done past the run": ({"epochs_done": "3", "step": "9"}, r"epochs_done=3 is more than the run's epochs=2"),
    "no vocab_size": (
        {"config": json.dumps({k: v for k, v in SMALL.to_dict().items() if k != "vocab_size"})},
        r"invalid config in its metadata: missing field\(s\) \['vocab_size'\]",
    ),
}


@pytest.mark.parametrize("case", BAD_METADATA, ids=str)
def test_companion_metadata_is_type_and_range_checked(tmp_path, case):
    import safetensors.numpy

    changes, pattern = BAD_METADATA[case]
    path = tmp_path / "run.safetensors"
    companion = save(path)
    header_length = int.from_bytes(companion.read_bytes()[:8], "little")
    metadata = json.loads(companion.read_bytes()[8 : 8 + header_length])["__metadata__"]
    arrays = safetensors.numpy.load(companion.read_bytes())
    safetensors.numpy.save_file(arrays, str(companion), {**metadata, **changes})
    with pytest.raises(ValueError, match=pattern):
        checkpoint.load(path)


KILLED_SAVE = textwrap.dedent("""
    import sys, time
    import numpy as np
    import shared.checkpoint as checkpoint, shared.files as files
    from shared import weights
    from tests.contract.test_checkpoint import SMALL, state
    real, calls = files.write_atomically, []

    def slow(path, payload):
        real(path, payload)
        calls.append(path)
        print("written", path, flush=True)
        time.sleep(60)  # the parent kills us here: between the two halves of the checkpoint

    checkpoint.write_atomically = slow
    checkpoint.save(sys.argv[1], weights.init_weights(SMALL, 1), state(scale=3.0), SMALL)
""")


def test_a_save_killed_between_its_two_files_is_refused_on_resume(tmp_path):
    path = tmp_path / "run.safetensors"
    save(path, seed=0)
    child = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().startswith("written")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    new, _ = weights.load(path)  # the weights are whole: --load works
    assert np.array_equal(new["lm_head.weight"], weights.init_weights(SMALL, 1)["lm_head.weight"])
    with pytest.raises(ValueError, match=r"belongs to other weights .* a save was interrupted between its two files"):
        checkpoint.load(path)


STALE_WRITER = textwrap.dedent("""
    import os, sys, time
    import shared.files as files
    real = os.replace

    def never(*args):
        print("temporary written", flush=True)
        time.sleep(60)  # killed before the rename

    files.os.replace = never
    files.write_atomically(__import__("pathlib").Path(sys.argv[1]), b"new")
""")


def test_a_killed_saves_temporary_is_removed_by_the_next_save_but_a_live_ones_is_kept(tmp_path):
    path = tmp_path / "run.safetensors"
    killed = subprocess.Popen([sys.executable, "-c", STALE_WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    live = subprocess.Popen([sys.executable, "-c", STALE_WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        for child in (killed, live):
            assert child.stdout.readline().startswith("temporary written")
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        temporaries = {pid: temporary for temporary, pid in files.temporaries(path)}
        assert set(temporaries) == {killed.pid, live.pid}
        save(path)
        left = [temporary.name for temporary, _ in files.temporaries(path)]
        assert left == [temporaries[live.pid].name]  # the killed writer's is gone, the live one's kept
    finally:
        live.kill()
        live.wait(timeout=30)


def test_an_interrupt_during_a_save_is_held_until_both_files_are_written(tmp_path, monkeypatch):
    real, written = files.write_atomically, []

    def write_then_interrupt(path, payload):
        real(path, payload)
        written.append(Path(path).name)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C right after the first half

    monkeypatch.setattr(checkpoint, "write_atomically", write_then_interrupt)
    path = tmp_path / "run.safetensors"
    with pytest.raises(KeyboardInterrupt):
        save(path)
    assert written == ["run.safetensors", "run.adam.safetensors"]
    monkeypatch.undo()
    assert checkpoint.load(path)[1].step == 6


def test_a_full_disk_names_the_file_and_leaves_no_temporary(tmp_path):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    disk = tmp_path / "disk"
    disk.mkdir()
    size = len(weights.payload(weights.init_weights(SMALL, 0), SMALL))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size + 8192}", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not allowed here: {mounted.stderr.decode().strip()}")
    try:
        path = disk / "run.safetensors"
        with pytest.raises(OSError, match=rf"cannot write '{re.escape(str(companion_path(path)))}': No space left on device"):
            save(path)
        assert os.listdir(disk) == ["run.safetensors"]  # the weights are whole, no temporary left
        with pytest.raises(FileNotFoundError, match=r"Adam state file .* does not exist"):
            checkpoint.load(path)  # and the half pair cannot be resumed
    finally:
        subprocess.run(["umount", str(disk)], check=True)


# --- --resume continues the saved optimizer settings --------------------------------------------

SMALL_FLAGS = ["--quiet", "--n-sequences", "48", "--batch-size", "16"]
MODEL = ["--seq-len", "5", "--vocab-size", "11", "--d-model", "24"]


def run_cli(capsys, backend, *flags):
    try:
        status = train_cli.main(backend, [*SMALL_FLAGS, *flags])
    except SystemExit as exit:
        status = exit.code
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("backend", names("train"))
def test_resume_keeps_the_saved_lr_unless_a_flag_overrides_it_and_says_so(capsys, tmp_path, backend):
    path = tmp_path / "run.safetensors"
    status, out, err = run_cli(capsys, backend, *MODEL, "--epochs", "1", "--lr", "0.02", "--save", str(path))
    assert status == 0, err
    status, out, err = run_cli(capsys, backend, "--epochs", "2", "--resume", str(path))
    assert status == 0, err
    assert "lr=0.02 " in out and "overridden" not in out
    status, out, err = run_cli(capsys, backend, "--epochs", "2", "--resume", str(path), "--lr", "0.005")
    assert status == 0, err
    assert "lr=0.005 " in out and "overridden from the saved run: lr=0.005 (saved run: 0.02)" in out


def test_resume_reads_each_file_once(capsys, tmp_path, monkeypatch):
    path = tmp_path / "run.safetensors"
    save(path, train_config=TrainConfig(epochs=1, batch_size=16, n_sequences=48), epochs_done=1)
    opened = []
    real = files.open_regular
    monkeypatch.setattr(files, "open_regular", lambda name, what: opened.append(Path(name).name) or real(name, what))
    status, out, err = run_cli(capsys, names("train")[0], "--epochs", "2", "--resume", str(path), "--history", str(tmp_path / "h.json"))
    assert status == 0, err
    assert sorted(opened) == ["run.adam.safetensors", "run.safetensors"]
    history = json.loads((tmp_path / "h.json").read_text())
    assert history["init"] == "file" and history["source"] == str(path)
    assert history["source_sha256"] == weights.read(path).digest
