"""JAX's persistent compilation cache for a command that compiles the same programs on every
run (`mhsa parity`, and the JAX trainer's command line): the second run reads the compiled
programs from disk instead of compiling them again. The cache is keyed by the program, the compile options, the JAX and jaxlib versions
and the device, so a hit is the executable a compilation would have produced: the numbers are
the same, only the compile time goes.

Where: $XDG_CACHE_HOME/mhsa/jax (~/.cache/mhsa/jax without it), unless JAX already has a cache
directory (JAX_COMPILATION_CACHE_DIR, or jax.config), which then wins, with its own settings.
How much: at most SIZE_LIMIT bytes; past it JAX deletes the entries read least recently (each
distinct model size or setting adds its own programs, so the folder would otherwise only grow).

What JAX opens there, it opens as regular files, blocking: `KEY-cache` (the program), `KEY-atime`
(when it was last read) and `.lockfile`. A FIFO under one of those names would hang the run
inside JAX, a folder or a device would fail it at every write; so any entry under those names
that is not a regular file (a symbolic link included) keeps the cache off for the run, said once
(unusable_entry), as does a cache path that is itself a file or a FIFO (_not_a_folder). JAX
writes an entry in place, then its access time: a kill halfway through the entry leaves it cut
short without an access time, which JAX would fail to read, warn of and never write again; such
an entry is removed before JAX starts (_remove_cut_short), under JAX's own lock.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from shared import files

OFF = "JAX's compilation cache is off"  # how the note of a cache that cannot be used begins
LOCK, LOCK_TIMEOUT = ".lockfile", 10  # JAX's lock file in the folder, and how long JAX waits for it (seconds)
SIZE_LIMIT = 256 * 2**20  # bytes; the default report's programs take under 1 MiB, a default training run's about 0.1


def default_directory() -> Path:
    """$XDG_CACHE_HOME/mhsa/jax, or ~/.cache/mhsa/jax."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mhsa" / "jax"


def enable_jax_cache(directory: str | Path | None = None, size_limit: int = SIZE_LIMIT) -> str:
    """Turn JAX's persistent compilation cache on in `directory` (default_directory() if None)
    for every program, however small or quick to compile; returns a note saying where it is, or
    why it stays off (a folder that cannot be created or written: the run compiles afresh).
    size_limit: the bytes the folder may hold; past them JAX deletes the least recently read
    entries (it keeps one access-time file and one lock beside them for that).

    Call it before the process's first compilation: JAX decides once, at its first compilation,
    whether it uses a cache, and a later call changes nothing."""
    import jax

    current = getattr(jax.config, "jax_compilation_cache_dir")  # noqa: B009 - the stubs lack the flags
    if current:  # the user's own cache, with the user's own thresholds
        bad = _not_a_folder(Path(current)) or unusable_entry(Path(current))
        if bad is not None:
            jax.config.update("jax_enable_compilation_cache", False)
            return f"{OFF}, {current} (JAX_COMPILATION_CACHE_DIR) cannot be used ({bad}): every program is compiled afresh"
        return f"JAX's compilation cache: {current} (JAX_COMPILATION_CACHE_DIR)"
    chosen = Path(directory or default_directory())
    not_a_folder = _not_a_folder(chosen)
    if not_a_folder is not None:
        return f"{OFF}, {chosen} cannot be used ({not_a_folder}): every program is compiled afresh"
    try:  # checked here: JAX would only warn at every entry it cannot write
        chosen.mkdir(parents=True, exist_ok=True)
        if not os.access(chosen, os.W_OK | os.X_OK):
            raise PermissionError(f"not writable: {chosen}")
    except OSError as error:
        return f"{OFF}, {chosen} cannot be used ({error}): every program is compiled afresh"
    bad = unusable_entry(chosen)
    if bad is not None:
        return f"{OFF}, {chosen} cannot be used ({bad}): every program is compiled afresh"
    _with_jax_lock(chosen, _remove_cut_short, _complete_access_times)
    jax.config.update("jax_compilation_cache_dir", str(chosen))
    # JAX's defaults keep only programs that took over a second to compile; this report's
    # programs are many and small, and compiling them is most of its JAX time
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # no size limit, and JAX may not raise it
    jax.config.update("jax_compilation_cache_max_size", size_limit)  # least recently read entries go first
    return f"JAX's compiled programs are kept in {chosen} for the next run (--no-jax-cache: compile afresh)"


def _not_a_folder(path: Path) -> str | None:
    """The cache's own path, or the first of its parents, that exists and is not a folder (a regular
    file, a FIFO: nothing can be made in it), in words as unusable_entry's; None otherwise."""
    for candidate in (path, *path.parents):
        try:
            mode = candidate.stat().st_mode  # a link to a folder is a folder here
        except (FileNotFoundError, NotADirectoryError):
            continue  # made by mkdir, or below a parent that is not a folder
        except OSError:  # unreadable: the mkdir below says why
            return None
        if stat.S_ISDIR(mode):
            return None
        where = "it" if candidate == path else str(candidate)
        return f"{where} is {files.kind_of(mode)}, not a folder; remove it to use the cache again"
    return None


def unusable_entry(folder: Path) -> str | None:
    """The first entry of `folder` that JAX would open (KEY-cache, KEY-atime, .lockfile) and that is
    not a regular file, in words ("KEY-atime is a FIFO; remove it to use the cache again"); None
    when there is none. Symbolic links are refused whatever they point to: JAX would follow them."""
    from jax._src.lru_cache import _ATIME_SUFFIX, _CACHE_SUFFIX  # JAX's own names (jaxlib pinned in constraints.txt)

    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.endswith((_CACHE_SUFFIX, _ATIME_SUFFIX)) or entry.name == LOCK:
                    mode = entry.stat(follow_symlinks=False).st_mode
                    if not stat.S_ISREG(mode):
                        return f"{entry.name} in it is {files.kind_of(mode)}, not a regular file; remove it to use the cache again"
    except FileNotFoundError:  # not made yet: JAX makes it, empty
        return None
    except OSError as error:
        return f"its entries cannot be listed: {error.strerror or error}"
    return None


def _with_jax_lock(folder: Path, *work: Callable[[Path], None]) -> None:
    """Each of work(folder), holding the lock JAX takes around every read and write of the folder (the size limit
    turns it on), so that no entry another process is writing is seen half-written; skipped when
    the lock cannot be had within JAX's own timeout."""
    import filelock

    try:
        with filelock.FileLock(folder / LOCK, timeout=LOCK_TIMEOUT):
            for step in work:
                step(folder)
    except (filelock.Timeout, OSError):  # busy for long, or a folder turned read-only: JAX copes with what it finds
        return


def _remove_cut_short(folder: Path) -> None:
    """Remove every entry that lacks its access-time file and cannot be decompressed: a write a kill
    stopped halfway (JAX writes the entry in place, then the access time). JAX would fail to read it,
    warn of it at every run and never write it again (it writes no entry whose name exists)."""
    from jax._src.compilation_cache import decompress_executable
    from jax._src.lru_cache import _ATIME_SUFFIX, _CACHE_SUFFIX

    for entry in folder.glob(f"*{_CACHE_SUFFIX}"):
        if (folder / (entry.name.removesuffix(_CACHE_SUFFIX) + _ATIME_SUFFIX)).exists():
            continue  # written after the entry: the entry is whole
        try:
            decompress_executable(entry.read_bytes())  # a regular file (unusable_entry): reading cannot block
        except OSError:
            continue  # gone meanwhile
        except Exception:  # noqa: BLE001 - zlib or zstd's own error: cut short
            entry.unlink(missing_ok=True)


def _complete_access_times(folder: Path) -> None:
    """Give every entry of `folder` that lacks one the access-time file of JAX's size limit, dated
    when the entry was written. JAX writes an entry and then its access time; an entry without one
    (a kill between the two writes, or a folder kept before the limit was set) makes its eviction
    scan fail at every later write, so nothing new would be kept and every write would warn."""
    from jax._src.lru_cache import _ATIME_SUFFIX, _CACHE_SUFFIX  # JAX's own names (jaxlib pinned in constraints.txt)

    for entry in folder.glob(f"*{_CACHE_SUFFIX}"):
        access_time = folder / (entry.name.removesuffix(_CACHE_SUFFIX) + _ATIME_SUFFIX)
        if not access_time.exists():
            try:
                access_time.write_bytes(entry.stat().st_mtime_ns.to_bytes(8, "little"))  # JAX's format: ns, little-endian
            except OSError:  # the entry went meanwhile (another run evicted it), or the folder turned read-only
                continue
