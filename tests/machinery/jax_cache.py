"""The test sessions' JAX compilation cache on disk: kept between sessions that ended
normally, so a second `make test` does not compile again what the first one compiled.

Each pytest-xdist worker writes its own subfolder (JAX writes entries without a lock), and which
worker runs a module changes from one session to the next; so a session that ends normally links
every entry into every subfolder and the folder itself, and the next session finds each program
whichever worker asks for it (conftest keeps the folder's path out of JAX's cache keys). An entry
is written once and never changed, so a hard link is safe.

JAX's cache key is the program itself (its HLO, the compile options, the jax and jaxlib
versions, the flags), so an entry is never the wrong program for a changed test; what can go
wrong is an entry cut short by a kill in the middle of its write (JAX writes in place, and then
warns about it and recompiles in every later session). So a session marks the folder clean only
when it ends normally; a folder without that mark, or grown past the size limit, is emptied
before the next session starts.

Two sessions at once in one checkout (the suite in one terminal, a file in another) would empty
and fill each other's folder: a session first takes an exclusive lock (flock, released by the
system when the process ends, however it ends), and one that finds it taken works in a temporary
folder instead.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import IO

CLEAN_MARK = "ended-normally"  # written by the session that last used the folder, as it ends
SIZE_LIMIT = 512 * 2**20  # bytes; a whole session writes tens of MiB, a little more after each change of the code


def lock(folder: Path) -> IO | None:
    """An exclusive lock on `folder` for this session (FOLDER.lock beside it, held until the
    returned file is closed or this process ends), or None when another session holds it."""
    handle = open(folder.parent / f"{folder.name}.lock", "a")  # noqa: SIM115 - held for the whole session
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def folder_size(folder: Path) -> int:
    """Bytes in the regular files under folder, each file once however many links it has (links
    to folders are not followed)."""
    seen = {}
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            status = path.lstat()
            seen[status.st_dev, status.st_ino] = status.st_size
    return sum(seen.values())


def open_for_session(folder: Path, size_limit: int = SIZE_LIMIT) -> str:
    """Make `folder` ready for a session and say what was done: "new", "kept" (the last session
    ended normally and the folder is within size_limit), or "emptied (why)". The clean mark is
    taken away, so a session killed before close_after_session leaves the folder to be emptied.
    A link to a folder is used as that folder. Raises ValueError when folder is not a folder."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"JAX test cache {folder}: expected a folder, found a file")
    if not folder.exists():
        folder.mkdir(parents=True)
        return "new"
    reason = None
    if not (folder / CLEAN_MARK).is_file():
        reason = "the session that last used it did not end normally"
    elif (size := folder_size(folder)) > size_limit:
        reason = f"{size / 2**20:.0f} MiB, over the limit of {size_limit / 2**20:.0f} MiB"
    if reason:
        for entry in folder.iterdir():  # the contents, not the folder: it may be a link's target
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    (folder / CLEAN_MARK).unlink(missing_ok=True)
    return f"emptied ({reason})" if reason else "kept"


def close_after_session(folder: Path) -> None:
    """Share every entry among the folder and its subfolders (hard links, or copies where the
    file system has none), then mark the folder clean: every write into it has finished."""
    if not folder.is_dir():
        return
    places = [folder, *(path for path in folder.iterdir() if path.is_dir() and not path.is_symlink())]
    entries: dict[str, Path] = {}
    for place in places:
        for path in place.iterdir():
            if path.is_file() and not path.is_symlink() and path.name != CLEAN_MARK:
                entries.setdefault(path.name, path)
    for place in places:
        for name, source in entries.items():
            target = place / name
            if not target.exists():
                try:
                    os.link(source, target)
                except OSError:
                    shutil.copyfile(source, target)
    (folder / CLEAN_MARK).write_text("the last test session that used this folder ended normally\n")
