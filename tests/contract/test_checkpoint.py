"""A checkpoint is one unit (shared/checkpoint.py, shared/adam_state.py): weights and their
Adam companion bound by the weights file's SHA-256, verified on every load; a save killed
between its two files, a full disk at any point, a copied or tampered companion and
inconsistent metadata are all refused or completed, never mixed; Ctrl-C during the renames is
held until the pair is whole."""

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

from shared import adam_state, checkpoint, files, weights
from shared.adam_state import AdamState, companion_path
from shared.config import TrainConfig
from tests.backends import SMALL
from tests.failing_disk import FailingOs
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


def unbound(path):
    """A pair whose companion records no weights digest: the format before the binding."""
    weights.save(path, weights.init_weights(SMALL, 0), SMALL)
    adam_state.save(companion_path(path), state(), SMALL)


def test_a_companion_from_before_the_binding_is_refused_naming_mhsa_bind(tmp_path):
    path = tmp_path / "run.safetensors"
    unbound(path)
    with pytest.raises(
        ValueError,
        match=r"does not record which weights file it belongs to .* "
        r"`mhsa bind WEIGHTS.safetensors`",
    ):
        checkpoint.load(path)


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


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_save_killed_between_its_two_renames_is_completed_by_the_next_resume(tmp_path):
    path = tmp_path / "run.safetensors"
    save(path, seed=0)
    killed_save(path, renames=1)
    new, _ = weights.load(path)  # the new weights are whole: --load works
    assert np.array_equal(new["lm_head.weight"], weights.init_weights(SMALL, 1)["lm_head.weight"])
    assert is_pair(path, seed=1, scale=3.0)  # the new pair, completed from the companion's temporary
    assert sorted(os.listdir(tmp_path)) == ["run.adam.safetensors", "run.safetensors"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_save_killed_before_its_renames_leaves_the_previous_pair_and_the_next_save_cleans_up(tmp_path):
    path = tmp_path / "run.safetensors"
    save(path, seed=0)
    killed_save(path, renames=0)
    assert is_pair(path, seed=0, scale=1.0) and len(os.listdir(tmp_path)) == 4  # both temporaries left by the kill
    save(path, seed=2, scale=5.0)
    assert is_pair(path, seed=2, scale=5.0) and sorted(os.listdir(tmp_path)) == ["run.adam.safetensors", "run.safetensors"]


@pytest.mark.slow
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


def pages(size: int) -> int:
    """The 4 KiB pages a tmpfs counts for a file of `size` bytes."""
    return -(-size // 4096)


@pytest.mark.slow
@pytest.mark.parametrize("room", ["for-neither-temporary", "for-the-weights-temporary-only"])
def test_a_full_disk_keeps_the_previous_pair_on_a_real_small_tmpfs(tmp_path, room):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    disk = tmp_path / "disk"
    disk.mkdir()
    weights_pages = pages(len(weights.payload(weights.init_weights(SMALL, 0), SMALL)))
    adam_pages = pages(len(adam_state.payload(state(), SMALL, "0" * 64)))
    assert adam_pages > weights_pages + 1  # so the second case fills the disk at the companion even after a rename freed the old weights
    # one pair and 1 page more (the new weights' temporary does not fit), or one pair, the new
    # weights' temporary and 1 page more (the disk fills at the companion's temporary: written
    # before any rename, nothing is replaced; had the weights been renamed first, they would be
    # the new ones beside the old companion)
    room_pages = weights_pages + adam_pages + 1 + (weights_pages if room == "for-the-weights-temporary-only" else 0)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={room_pages * 4096}", "tmpfs", str(disk)], capture_output=True)
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


def test_a_sigterm_the_program_handles_is_held_until_the_block_ends_and_then_reaches_its_handler():
    heard = []

    def handler(signum, frame):
        heard.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(checkpoint.SavedThenInterrupted):
            with checkpoint.deferred_interrupt(checkpoint.SavedThenInterrupted(Path("x.adam.safetensors"))):
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):  # the handler would run at any of these bytecodes
                    pass
                held = list(heard)
        assert held == [] and heard == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)
