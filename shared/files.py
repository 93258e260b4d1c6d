"""Writing files so that an interrupted write never destroys the previous file."""

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, payload: bytes) -> None:
    """Write bytes to `path` through a temporary file in the same folder and a rename.

    The file gets the mode a plain open() would give it (or keeps the mode of the file it
    replaces), not the private 0600 of a temporary file.
    """
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(temporary, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
        with os.fdopen(handle, "wb") as file:
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def _umask() -> int:
    # the process umask can only be read by setting it; set it straight back
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
