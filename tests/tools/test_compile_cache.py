"""JAX's compilation cache folder on hostile ground (mhsa/compile_cache.py): an entry JAX would
open that is not a regular file (a FIFO would hang the run inside JAX's reader) keeps the cache
off for the run, said once; an entry a kill cut short is removed before JAX reads it, so the
next run neither hangs, crashes nor warns, and writes it again."""

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from mhsa import compile_cache
from tests.paths import ROOT


def environment(**extra):
    """This environment without the tests' own JAX cache folder, with `extra`."""
    return {**{key: value for key, value in os.environ.items() if key != "JAX_COMPILATION_CACHE_DIR"}, **extra}


def make(folder, name, kind):
    path = folder / name
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    elif kind == "directory":
        path.mkdir()
    elif kind == "link to a FIFO":
        os.mkfifo(folder / "elsewhere")
        path.symlink_to(folder / "elsewhere")
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    return path


@pytest.mark.parametrize(
    "name, kind, word",
    [
        ("k-cache", "FIFO", "a FIFO"),
        ("k-atime", "FIFO", "a FIFO"),
        (".lockfile", "FIFO", "a FIFO"),
        ("k-cache", "socket", "a socket"),
        ("k-cache", "directory", "a directory"),
        ("k-atime", "link to a FIFO", "a symbolic link"),
        ("k-cache", "link to /dev/zero", "a symbolic link"),
    ],
)
def test_an_entry_jax_would_open_that_is_not_a_regular_file_makes_the_folder_unusable(tmp_path, name, kind, word):
    (tmp_path / "j-cache").write_bytes(b"whole")
    make(tmp_path, name, kind)
    assert compile_cache.unusable_entry(tmp_path) == f"{name} in it is {word}, not a regular file; remove it to use the cache again"


def test_entries_jax_never_opens_and_a_folder_not_made_yet_are_no_concern(tmp_path):
    make(tmp_path, "notes", "FIFO")
    (tmp_path / "k-cache").write_bytes(b"whole")
    assert compile_cache.unusable_entry(tmp_path) is None
    assert compile_cache.unusable_entry(tmp_path / "not yet") is None


TRAIN = [sys.executable, "-m", "jax_impl.train", "--quiet", "--epochs", "1", "--n-sequences", "16", "--batch-size", "8", "--seq-len", "3"]
TRAIN += ["--d-model", "8", "--n-heads", "2", "--vocab-size", "5"]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("where", ["the command's folder", "JAX_COMPILATION_CACHE_DIR"])
def test_a_fifo_in_the_cache_folder_never_reaches_jax_the_run_compiles_afresh_and_says_so_once(tmp_path, where):
    folder = tmp_path / "xdg" / "mhsa" / "jax" if where == "the command's folder" else tmp_path / "own"
    folder.mkdir(parents=True)
    (folder / "k-cache").write_bytes(b"an entry")
    make(folder, "k-atime", "FIFO")  # JAX reads every entry's access time before it writes one: it would block here
    env = environment(XDG_CACHE_HOME=str(tmp_path / "xdg"), **({"JAX_COMPILATION_CACHE_DIR": str(folder)} if where != "the command's folder" else {}))
    done = subprocess.run(TRAIN, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # a hang fails here
    assert done.returncode == 0, done.stderr
    own = " (JAX_COMPILATION_CACHE_DIR)" if where != "the command's folder" else ""
    assert done.stderr == (
        f"note: JAX's compilation cache is off, {folder}{own} cannot be used (k-atime in it is a FIFO, not a regular file; "
        "remove it to use the cache again): every program is compiled afresh\n"
    )
    assert done.stdout.startswith("final loss ") and sorted(os.listdir(folder)) == ["k-atime", "k-cache"]  # nothing written there


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["regular file", "FIFO", "regular file as a parent"])
def test_a_cache_path_that_is_not_a_folder_gets_the_one_line_note_and_the_run_compiles_afresh(tmp_path, kind):
    base = tmp_path / "xdg" / "mhsa"
    base.mkdir(parents=True)
    folder = base / "jax"
    if kind == "FIFO":
        os.mkfifo(folder)
    elif kind == "regular file":
        folder.write_bytes(b"")
    else:
        base.rmdir()
        base.write_bytes(b"")
    done = subprocess.run(TRAIN, cwd=ROOT, env=environment(XDG_CACHE_HOME=str(tmp_path / "xdg")), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    where, word = ("it", f"a {kind}") if kind != "regular file as a parent" else (str(base), "a regular file")
    assert done.stderr == (
        f"note: JAX's compilation cache is off, {folder} cannot be used ({where} is {word}, not a folder; "
        "remove it to use the cache again): every program is compiled afresh\n"
    )
    assert done.stdout.startswith("final loss ")


KILLED_WRITE = textwrap.dedent("""
    import time
    from jax._src import path
    from mhsa.compile_cache import enable_jax_cache
    print(enable_jax_cache(), flush=True)
    kind = type(path.Path("/"))  # JAX's own path class: pathlib's, or etils' where installed
    real = kind.write_bytes

    def halfway(self, data):  # how JAX writes an entry: in place, then its access time
        if self.name.endswith("-cache"):
            with open(str(self), "wb") as file:
                file.write(data[: len(data) // 2])
            print("halfway", flush=True)
            time.sleep(60)  # killed here
        return real(self, data)

    kind.write_bytes = halfway
    import jax, jax.numpy as jnp
    jax.jit(lambda x: x * 3 + 1)(jnp.ones(3)).block_until_ready()
""")
PROGRAM = (
    "from mhsa.compile_cache import enable_jax_cache; enable_jax_cache(); "
    "import jax, jax.numpy as jnp; print(jax.jit(lambda x: x * 3 + 1)(jnp.ones(3)).tolist())"
)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_entry_a_kill_cut_short_is_written_again_by_the_next_run_without_a_warning(tmp_path):
    from jax._src.compilation_cache import decompress_executable

    env = environment(XDG_CACHE_HOME=str(tmp_path))
    folder = tmp_path / "mhsa" / "jax"
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITE], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().startswith("JAX's compiled programs are kept in")
        assert child.stdout.readline() == "halfway\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    entries = sorted(folder.glob("*-cache"))
    assert len(entries) == 1 and not list(folder.glob("*-atime"))  # cut short, without its access time
    with pytest.raises(Exception):  # noqa: B017 - zlib's or zstd's own error
        decompress_executable(entries[0].read_bytes())
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and done.stdout == "[4.0, 4.0, 4.0]\n", done.stderr
    assert done.stderr == ""  # JAX found no entry it could not read, so it warned of none
    assert decompress_executable(entries[0].read_bytes())  # written again, whole
    assert list(folder.glob("*-atime"))
