"""Reading and writing files (shared/files.py): a reader opens regular files only (a FIFO, a
device or a folder is refused at once, never read) and reads at most its limit; every writer
writes a temporary and renames it into place, so a full disk, a failed rename or Ctrl-C at any
moment leaves the previous file whole and no temporary behind; the file gets the mode a plain
open() would give it; the temporaries of killed writers are removed by the next save, never a
live writer's."""

import errno
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from mhsa.plots import heads_figure, save_figure
from shared import files, history, weights
from shared.config import TrainConfig
from shared.history import History
from shared.weights import init_weights
from tests.backends import SMALL
from tests.failing_disk import FailingOs
from tests.paths import ROOT
from tests.samples import causal_weights


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


# --- reading --------------------------------------------------------------------------------------


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


def test_a_file_over_the_readers_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "h.json"
    with open(path, "wb") as file:  # sparse: a byte over the limit, nothing to read
        file.truncate(history.MAX_BYTES + 1)
    monkeypatch.setattr(files, "read_exactly", lambda *args: pytest.fail("a byte was read"))
    with pytest.raises(
        ValueError, match=rf"^history file '{re.escape(str(path))}' is {history.MAX_BYTES + 1} bytes, more than the {history.MAX_BYTES}-byte limit$"
    ):
        History.load(path)


# --- writing --------------------------------------------------------------------------------------

# every writer of the project's files: (file name, write version v of the file, what the file holds)
WRITERS = {
    "weights.save": (
        "model.safetensors",
        lambda path, v: weights.save(path, init_weights(SMALL, v), SMALL),
        lambda path: weights.load(path)[0]["lm_head.weight"].tobytes(),
    ),
    "History.save": (
        "history.json",
        lambda path, v: History("torch", SMALL, TrainConfig(), [4.0 + v, 3.0], [3.5], 1.0).save(path),
        lambda path: History.load(path).losses,
    ),
    "save_figure": (
        "heads.png",
        lambda path, v: save_figure(heads_figure(causal_weights(2, 5, seed=v)), path),
        lambda path: path.read_bytes(),
    ),
}
# where the write fails: (the failing disk operation, counted from 0: write, fsync, rename; its error)
FAILURES = {
    "a full disk halfway through the write": (0, None),
    "Ctrl-C in the write": (0, KeyboardInterrupt()),
    "a full disk at the fsync": (1, None),
    "a rename that fails": (2, OSError(errno.EXDEV, "Invalid cross-device link")),
    "Ctrl-C at the rename": (2, KeyboardInterrupt()),
}


# every writer at every failure point; a figure takes half a second to draw (twice a case), and its
# write is the same write_atomically as the others', so its first failure is enough for the fast tier
CASES = [
    pytest.param(writer, failure, id=f"{writer}-{failure}", marks=[pytest.mark.slow] if writer == "save_figure" and n > 0 else [])
    for writer in WRITERS
    for n, failure in enumerate(FAILURES)
]


@pytest.mark.parametrize(("writer", "failure"), CASES)
def test_a_write_that_fails_at_any_point_keeps_the_previous_file_whole_and_no_temporary(tmp_path, monkeypatch, writer, failure):
    name, write, content = WRITERS[writer]
    fail_at, error = FAILURES[failure]
    path = tmp_path / name
    write(path, 0)
    before, held = path.read_bytes(), content(path)
    failing = FailingOs(fail_at, error)
    monkeypatch.setattr(files, "os", failing)
    with pytest.raises(OSError if error is None else type(error)) as raised:
        write(path, 1)
    monkeypatch.undo()
    assert failing.calls == ["write", "fsync", "replace"][: fail_at + 1]
    if error is None:  # a full disk names the file it was writing
        assert str(raised.value) == f"[Errno 28] cannot write {str(path)!r}: No space left on device"
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == [name]  # no temporary left behind
    assert content(path) == held


def test_a_written_file_gets_the_mode_of_a_plain_open_or_keeps_its_own(tmp_path):
    mask = os.umask(0o022)
    try:
        path = tmp_path / "new.bin"
        files.write_atomically(path, b"new")
        assert path.stat().st_mode & 0o777 == 0o644  # not the temporary's private 0600
        path.chmod(0o640)
        files.write_atomically(path, b"again")
        assert path.stat().st_mode & 0o777 == 0o640 and path.read_bytes() == b"again"
    finally:
        os.umask(mask)


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


@pytest.mark.slow
def test_a_killed_writers_temporary_is_removed_by_the_next_save_but_a_live_ones_is_kept(tmp_path):
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
        weights.save(path, init_weights(SMALL, 0), SMALL)
        left = [temporary.name for temporary, _ in files.temporaries(path)]
        assert left == [temporaries[live.pid].name]  # the killed writer's is gone, the live one's kept
    finally:
        live.kill()
        live.wait(timeout=30)
        for child in (killed, live):
            child.stdout.close()
