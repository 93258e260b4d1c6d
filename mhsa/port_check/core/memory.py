"""How much memory the machine can still give this process, for a run that would not fit: the
kernel's own estimate of what can be allocated without swapping (/proc/meminfo's MemAvailable),
and where the process runs in a container with a memory limit (cgroup v2's memory.max), what
is left under it. None where neither can be read (not Linux): then nothing is refused."""

from __future__ import annotations

from pathlib import Path

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")
SELF = Path("/proc/self/cgroup")  # this process's cgroup ("0::/path" under v2)


def available() -> int | None:
    """Bytes this process can still allocate, the smaller of the machine's and its cgroup's; None where unknown."""
    found = [value for value in (_meminfo(), _cgroup()) if value is not None]
    return min(found) if found else None


def _meminfo() -> int | None:
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup() -> int | None:
    """memory.max less memory.current of this process's cgroup (v2); None without a limit."""
    try:
        relative = next(line.partition("::")[2] for line in SELF.read_text().splitlines() if line.startswith("0::"))
        group = CGROUP / relative.lstrip("/")
        limit = (group / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((group / "memory.current").read_text().strip()))
    except (OSError, ValueError, StopIteration):
        return None


def size(nbytes: float) -> str:
    """'18.4 GiB', '312 MiB', '12 KiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} GiB" if unit == "GiB" else f"{nbytes / scale:.0f} MiB"
    return f"{nbytes / 1024:.0f} KiB"
