"""Reading and writing files so that a bad input never hangs or floods memory, and an
interrupted write never destroys the previous file.

What is guaranteed (docs/DESIGN.md, "Errors"; docs/training.md, "What is refused"):
- `read_regular` opens with O_NONBLOCK and checks fstat before reading a byte: a FIFO, a
  device (a symlink to /dev/zero included), a socket or a folder is refused at once with a
  ValueError naming the path; a file larger than the caller's limit is refused before it is
  read.
- `write_atomically` writes a temporary `.NAME.<pid>.<random>.tmp` in the target's folder
  (`write_temporary`), fsyncs it and renames it over the target (`commit`): after any failure
  or interrupt the target holds either the old or the new content, never a mix. A process
  killed with SIGKILL cannot remove its temporary; the next save of the same target removes
  every temporary of that target whose writer pid no longer runs (never one of a live process).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from pathlib import Path

from shared.words import plural

PathArg = str | os.PathLike[str]  # what the file functions accept as a path


def open_regular(path: PathArg, what: str) -> tuple[int, os.stat_result]:
    """An fd open for reading on a regular file, and its stat; ValueError for anything else.

    O_NONBLOCK: opening a FIFO without a writer would otherwise block forever."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"{what} {str(path)!r} is a directory, expected a regular file") from None
    except OSError as error:
        raise ValueError(f"{what} {str(path)!r} cannot be read: {error.strerror or error}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ValueError(f"{what} {str(path)!r} is {kind_of(info.st_mode)}, expected a regular file")
    return fd, info


def kind_of(mode: int) -> str:
    """What a file of this st_mode is, in words: "a regular file", "a FIFO", "a directory", ..."""
    kinds = [
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ]
    return next((word for test, word in kinds if test(mode)), "not a regular file")


def read_exactly(fd: int, size: int, what: str, path: PathArg) -> bytes:
    """`size` bytes from the fd's current position; ValueError when the file ends first."""
    chunks, left = [], size
    while left > 0:
        try:
            chunk = os.read(fd, min(left, 1 << 24))
        except OSError as error:
            raise ValueError(f"{what} {str(path)!r} cannot be read: {error.strerror or error}") from None
        if not chunk:
            raise ValueError(f"{what} {str(path)!r} is truncated: it ended {plural(left, 'byte')} early")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_regular(path: PathArg, what: str, limit: int) -> bytes:
    """The whole content of a regular file of at most `limit` bytes (ValueError otherwise)."""
    fd, info = open_regular(path, what)
    try:
        if info.st_size > limit:
            raise ValueError(f"{what} {str(path)!r} is {info.st_size} bytes, more than the {limit}-byte limit")
        return read_exactly(fd, info.st_size, what, path)
    finally:
        os.close(fd)


def same_file(a: PathArg, b: PathArg) -> bool:
    """True when two paths name one file: equal once resolved, or the same (device, inode)."""
    a, b = Path(a), Path(b)
    if a.resolve() == b.resolve():
        return True
    try:
        first, second = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def write_atomically(path: Path, payload: bytes) -> None:
    """Write bytes to `path` through a temporary file in the same folder and a rename.

    The file gets the mode a plain open() would give it (or keeps the mode of the file it
    replaces), not the private 0600 of a temporary file. An OSError (a full disk) names the
    file it was writing.
    """
    path = Path(path)
    remove_stale_temporaries(path)
    temporary = write_temporary(path, payload)
    try:
        commit(temporary, path)
    except BaseException:
        _unlink_quietly(temporary)
        raise


def write_temporary(path: Path, payload: bytes) -> Path:
    """Write `payload` to a new temporary `.NAME.<pid>.<random>.tmp` beside `path`, synced to the
    disk, and return its path; `path` itself is not touched. On any failure or interrupt the
    temporary is removed; an OSError (a full disk) names `path`."""
    path = Path(path)
    try:
        handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    except OSError as error:
        raise _naming(error, path) from None
    temporary = Path(name)
    try:
        os.chmod(temporary, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
        with os.fdopen(handle, "wb") as file:
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
    except OSError as error:
        _unlink_quietly(temporary)
        raise _naming(error, path) from None
    except BaseException:
        _unlink_quietly(temporary)
        raise
    return temporary


def commit(temporary: Path, path: Path) -> None:
    """Rename a temporary of write_temporary over `path` (atomic: `path` holds the old content or
    the new, never a mix); an OSError names `path`, and the temporary is left as it was."""
    try:
        os.replace(temporary, path)
    except OSError as error:
        raise _naming(error, Path(path)) from None


def _naming(error: OSError, path: Path) -> OSError:
    """The same kind of error (a PermissionError stays one), its message naming the file."""
    message = f"cannot write {str(path)!r}: {error.strerror or error}"
    return type(error)(error.errno, message) if error.errno is not None else type(error)(message)


def temporaries(path: Path) -> list[tuple[Path, int]]:
    """The temporaries `.NAME.<pid>.<random>.tmp` of `path` in its folder, with their pids."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(\d+)\.[^.]+\.tmp")
    try:
        entries = os.listdir(path.parent)
    except OSError:
        return []
    return [(path.parent / name, int(match.group(1))) for name in entries if (match := pattern.fullmatch(name))]


def abandoned_temporaries(path: Path) -> list[Path]:
    """The temporaries of `path` no other live process is writing (their writer is gone, or is
    this process), newest first: what a save that stopped between its renames left."""
    found = []
    for temporary, pid in temporaries(path):
        if pid == os.getpid() or not _running(pid):
            try:
                found.append((os.stat(temporary).st_mtime_ns, temporary))
            except OSError:  # removed meanwhile
                continue
    return [temporary for _, temporary in sorted(found, reverse=True)]


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporaries of `path` whose writer process is gone; return them."""
    removed = []
    for temporary, pid in temporaries(path):
        if pid != os.getpid() and not _running(pid):
            _unlink_quietly(temporary)
            removed.append(temporary)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a live process of another user
        return True
    except (OverflowError, OSError) as error:
        return getattr(error, "errno", None) != errno.ESRCH and not isinstance(error, OverflowError)
    return True


def _unlink_quietly(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _umask() -> int:
    # the process umask can only be read by setting it; set it straight back
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
