"""A checkpoint is one unit (shared/checkpoint.py): weights and their Adam companion bound by
the weights file's SHA-256, verified on every --resume; a save killed between its two files,
a full disk, a copied or tampered companion and inconsistent metadata are all refused;
stale temporaries of killed saves are removed by the next save; --resume continues the
saved optimizer settings unless a flag overrides them, and says so."""

import errno
import json
import os
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
from tests.backends import SMALL, names, package
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
    import shared.files as files
    from shared import checkpoint, weights
    from tests.contract.test_checkpoint import SMALL, state
    real, stop_after = files.commit, int(sys.argv[2])  # renames done before the parent kills us
    renames = []

    def commit(temporary, path):
        if len(renames) == stop_after:
            print("stopped after", stop_after, "renames", flush=True)
            time.sleep(60)  # the parent kills us here
        real(temporary, path)
        renames.append(path)

    files.commit = commit
    checkpoint.save(sys.argv[1], weights.init_weights(SMALL, 1), state(scale=3.0), SMALL)
""")


def killed_save(path, renames):
    """A save of new weights (seed 1, moments 3.0) to `path`, killed by SIGKILL after `renames` of its two renames."""
    child = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(path), str(renames)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().startswith("stopped after")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


def is_pair(path, seed, scale):
    """The checkpoint at `path` resumes, with the weights of `seed` and the moments of `scale`."""
    loaded, resumed = checkpoint.load(path)
    return np.array_equal(loaded.arrays["lm_head.weight"], weights.init_weights(SMALL, seed)["lm_head.weight"]) and bool(
        (resumed.exp_avg["lm_head.bias"] == scale).all()
    )


@pytest.mark.timeout(120)
def test_a_save_killed_between_its_two_renames_is_completed_by_the_next_resume(tmp_path):
    path = tmp_path / "run.safetensors"
    save(path, seed=0)
    killed_save(path, renames=1)
    new, _ = weights.load(path)  # the new weights are whole: --load works
    assert np.array_equal(new["lm_head.weight"], weights.init_weights(SMALL, 1)["lm_head.weight"])
    assert is_pair(path, seed=1, scale=3.0)  # the new pair, completed from the companion's temporary
    assert sorted(os.listdir(tmp_path)) == ["run.adam.safetensors", "run.safetensors"]


@pytest.mark.timeout(120)
def test_a_save_killed_before_its_renames_leaves_the_previous_pair_and_the_next_save_cleans_up(tmp_path):
    path = tmp_path / "run.safetensors"
    save(path, seed=0)
    killed_save(path, renames=0)
    assert is_pair(path, seed=0, scale=1.0) and len(os.listdir(tmp_path)) == 4  # both temporaries left by the kill
    save(path, seed=2, scale=5.0)
    assert is_pair(path, seed=2, scale=5.0) and sorted(os.listdir(tmp_path)) == ["run.adam.safetensors", "run.safetensors"]


def test_a_save_killed_between_its_renames_is_completed_by_the_next_save_not_cleaned_away(tmp_path, monkeypatch):
    # the next save fails on a full disk: the pair the killed save left must still be whole
    path = tmp_path / "run.safetensors"
    save(path, seed=0)
    killed_save(path, renames=1)
    monkeypatch.setattr(files, "os", FailingOs(fail_at=0))
    with pytest.raises(OSError, match="No space left on device"):
        save(path, seed=2, scale=5.0)
    monkeypatch.undo()
    assert is_pair(path, seed=1, scale=3.0)


class FailingOs:
    """The os module, as shared.files sees it, with its disk operations (a write through fdopen,
    fsync, replace) failing with ENOSPC from the `fail_at`-th one on (counted from 0)."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at, self.calls = fail_at, []

    def disk(self, name: str, operation):
        def counted(*args):
            self.calls.append(name)
            if len(self.calls) > self.fail_at:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return operation(*args)

        return counted

    def __getattr__(self, name):
        if name in ("fsync", "replace"):
            return self.disk(name, getattr(os, name))
        if name == "fdopen":
            return lambda fd, mode: FailingFile(os.fdopen(fd, mode), self.disk("write", lambda file, data: file.write(data)))
        return getattr(os, name)


class FailingFile:
    def __init__(self, file, write) -> None:
        self.file, self.counted_write = file, write

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def write(self, data):
        return self.counted_write(self.file, data)

    def __getattr__(self, name):
        return getattr(self.file, name)


SAVE_STEPS = ["write", "fsync", "write", "fsync", "replace", "replace"]  # weights, companion, then the two renames


@pytest.mark.parametrize("fail_at", range(len(SAVE_STEPS)), ids=lambda n: f"{SAVE_STEPS[n]} #{n}")
def test_a_full_disk_at_any_point_of_a_save_leaves_the_previous_pair_or_the_new_one_whole(tmp_path, monkeypatch, fail_at):
    path = tmp_path / "run.safetensors"
    save(path, seed=0)
    failing = FailingOs(fail_at)
    monkeypatch.setattr(files, "os", failing)
    with pytest.raises(OSError) as error:
        save(path, seed=1, scale=3.0)
    monkeypatch.undo()
    assert failing.calls == SAVE_STEPS[: fail_at + 1]
    message = str(error.value)
    assert message.startswith("[Errno 28] cannot write ") and "No space left on device" in message
    if fail_at < len(SAVE_STEPS) - 1:  # before the weights' rename went through: nothing replaced
        assert message.endswith("nothing was replaced: a checkpoint saved there before is whole")
        assert is_pair(path, seed=0, scale=1.0)
        assert sorted(os.listdir(tmp_path)) == ["run.adam.safetensors", "run.safetensors"]  # no temporary left
    else:  # the new weights are in place; their companion waits in its temporary and the next load completes the pair
        assert "the next --resume or save of" in message
        assert is_pair(path, seed=1, scale=3.0)


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


def test_an_interrupt_during_the_renames_is_held_until_both_are_done_and_says_so(tmp_path, monkeypatch):
    real, renamed = files.commit, []

    def rename_then_interrupt(temporary, path):
        real(temporary, path)
        renamed.append(Path(path).name)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C right after the first rename

    path = tmp_path / "run.safetensors"
    save(path, seed=0)
    monkeypatch.setattr(files, "commit", rename_then_interrupt)
    with pytest.raises(KeyboardInterrupt) as interrupt:
        save(path, seed=1, scale=3.0)
    assert renamed == ["run.safetensors", "run.adam.safetensors"]
    assert isinstance(interrupt.value, checkpoint.SavedThenInterrupted) and interrupt.value.companion == companion_path(path)
    monkeypatch.undo()
    assert is_pair(path, seed=1, scale=3.0)


def test_an_interrupt_while_the_temporaries_are_written_leaves_the_previous_pair_and_no_temporary(tmp_path, monkeypatch):
    real = files.write_temporary

    def write_then_interrupt(path, payload):
        temporary = real(path, payload)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C once the weights' temporary is written
        return temporary

    path = tmp_path / "run.safetensors"
    save(path, seed=0)
    monkeypatch.setattr(files, "write_temporary", write_then_interrupt)
    with pytest.raises(KeyboardInterrupt) as interrupt:
        save(path, seed=1, scale=3.0)
    assert not isinstance(interrupt.value, checkpoint.SavedThenInterrupted)
    monkeypatch.undo()
    assert is_pair(path, seed=0, scale=1.0) and sorted(os.listdir(tmp_path)) == ["run.adam.safetensors", "run.safetensors"]


def test_a_full_disk_keeps_the_previous_pair_on_a_real_small_tmpfs(tmp_path):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    disk = tmp_path / "disk"
    disk.mkdir()
    pair = len(weights.payload(weights.init_weights(SMALL, 0), SMALL)) + len(adam_state.payload(state(), SMALL, "0" * 64))
    pages = -(-pair // 4096) + 2  # room for one pair (tmpfs counts whole pages), not for a second beside it
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={pages * 4096}", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not allowed here: {mounted.stderr.decode().strip()}")
    try:
        path = disk / "run.safetensors"
        save(path, seed=0)
        with pytest.raises(OSError, match=r"cannot write '.*': No space left on device; nothing was replaced"):
            save(path, seed=1, scale=3.0)
        assert sorted(os.listdir(disk)) == ["run.adam.safetensors", "run.safetensors"]  # no temporary left
        assert is_pair(path, seed=0, scale=1.0)  # and the previous pair still resumes
    finally:
        subprocess.run(["umount", str(disk)], check=True)


# --- mhsa bind ------------------------------------------------------------------------------------


def bind(*argv):
    return subprocess.run([sys.executable, "-m", "mhsa.cli", "bind", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_bind_refuses_a_companion_bound_to_other_weights_unless_forced_and_says_what_it_overrode(tmp_path):
    save(tmp_path / "r1.safetensors", seed=0)
    save(tmp_path / "r2.safetensors", seed=1, scale=3.0)
    path = tmp_path / "m.safetensors"
    shutil.copy(tmp_path / "r2.safetensors", path)
    shutil.copy(tmp_path / "r1.adam.safetensors", companion_path(path))  # the 1st run's moments beside the 2nd run's weights
    before = companion_path(path).read_bytes()
    refused = bind(str(path))
    assert refused.returncode == 1 and companion_path(path).read_bytes() == before
    r1, r2 = weights.read(tmp_path / "r1.safetensors").digest, weights.read(path).digest
    assert refused.stderr == (
        f"mhsa bind: error: {str(companion_path(path))!r} is already bound to other weights (sha256 {r1[:12]}..., the file beside it: "
        f"{r2[:12]}...): it belongs to another run or to a save that was interrupted; refusing to rebind it "
        "(--force rebinds it anyway, and --resume would then continue these weights with its moments)\n"
    )
    with pytest.raises(ValueError, match="belongs to other weights"):
        checkpoint.load(path)
    forced = bind(str(path), "--force")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout == (
        f"bound {companion_path(path)} to {path} (--force: it was bound to other weights, sha256 {r1[:12]}...; now {r2[:12]}...)\n"
    )
    assert checkpoint.load(path)[1].weights_sha256 == r2
    again = bind(str(path))
    assert again.returncode == 0 and again.stdout == f"{companion_path(path)} is already bound to {path}: nothing to do\n"


# --- --resume continues the saved optimizer settings --------------------------------------------

SMALL_FLAGS = ["--n-sequences", "48", "--batch-size", "16"]  # not --quiet: the tests read the banner
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


def test_a_full_disk_during_the_commands_save_says_what_is_on_disk(capsys, tmp_path, monkeypatch):
    path = tmp_path / "run.safetensors"
    save(path, seed=0)
    failing = FailingOs(fail_at=3)  # the figure's write, fsync and rename go through; the weights' temporary does not
    monkeypatch.setattr(files, "os", failing)
    status, out, err = run_cli(capsys, names("train")[0], *MODEL, "--quiet", "--epochs", "1", "--save", str(path), "--plot", str(tmp_path / "p.png"))
    monkeypatch.undo()
    assert status == 1 and failing.calls == ["write", "fsync", "replace", "write"]
    assert err == (
        f"python -m {package(names('train')[0])}.train: error: [Errno 28] cannot write {str(path)!r}: No space left on device; "
        f"nothing was replaced: a checkpoint saved there before is whole; written before it: {tmp_path / 'p.png'}\n"
    )
    assert is_pair(path, seed=0, scale=1.0)
