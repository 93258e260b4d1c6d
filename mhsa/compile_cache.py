"""JAX's persistent compilation cache for a command that compiles the same programs on every
run (`mhsa parity`, and the JAX trainer's command line): the second run reads the compiled
programs from disk instead of compiling them again. The cache is keyed by the program, the compile options, the JAX and jaxlib versions
and the device, so a hit is the executable a compilation would have produced: the numbers are
the same, only the compile time goes.

Where: $XDG_CACHE_HOME/mhsa/jax (~/.cache/mhsa/jax without it), unless JAX already has a cache
directory (JAX_COMPILATION_CACHE_DIR, or jax.config), which then wins, with its own settings.
How much: at most SIZE_LIMIT bytes; past it JAX deletes the entries read least recently (each
distinct model size or setting adds its own programs, so the folder would otherwise only grow).
"""

from __future__ import annotations

import os
from pathlib import Path

OFF = "JAX's compilation cache is off"  # how the note of a cache that cannot be used begins
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
        return f"JAX's compilation cache: {current} (JAX_COMPILATION_CACHE_DIR)"
    chosen = Path(directory or default_directory())
    try:  # checked here: JAX would only warn at every entry it cannot write
        chosen.mkdir(parents=True, exist_ok=True)
        if not os.access(chosen, os.W_OK | os.X_OK):
            raise PermissionError(f"not writable: {chosen}")
    except OSError as error:
        return f"{OFF}, {chosen} cannot be used ({error}): every program was compiled afresh"
    _complete_access_times(chosen)
    jax.config.update("jax_compilation_cache_dir", str(chosen))
    # JAX's defaults keep only programs that took over a second to compile; this report's
    # programs are many and small, and compiling them is most of its JAX time
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # no size limit, and JAX may not raise it
    jax.config.update("jax_compilation_cache_max_size", size_limit)  # least recently read entries go first
    return f"JAX's compiled programs are kept in {chosen} for the next run (--no-jax-cache: compile afresh)"


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
