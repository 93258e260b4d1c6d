"""The files `mhsa port-check` reads and writes: --map and --inputs (read as every file here is
read: regular files only, bounded in size, never unpickled) and --write-map (written atomically,
never over an input, never into anything but a regular file).

--inputs: a .npy file is one positional argument. In a .npz archive, members `arr_0`, `arr_1`, ...
(np.savez's names for unnamed arrays) are the positional arguments in that order, and every other
member a keyword argument of its name (np.savez(f, x, attention_mask=m) gives model(x,
attention_mask=m)). Each array's declared size (its header's shape times its dtype's size), and the
sum of a .npz's, is checked against the bound before anything is allocated: a 192-byte file whose
header declares 4 TiB is refused in one line, and so is a zip bomb.
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
import zipfile
from pathlib import Path

import numpy as np

from mhsa.port_check.core.structure import Inputs
from mhsa.port_check.forward.pairing import check_map
from shared.files import read_regular, same_file, write_atomically

MAP_BYTES = 1 << 20  # a name map is a few lines of JSON
INPUT_BYTES = 1 << 30  # one batch of inputs, declared and on disk
MEMBERS = 1024  # arrays in one .npz: arguments of one call
NUMERIC = "biuf"  # the dtype kinds a model's inputs come in: bool, int, unsigned, float


def read_map(path: str) -> dict:
    """--map: a JSON object {reference name or prefix: port name or prefix, or a list of them}
    (docs/port-check.md, "Name maps"), each entry checked (pairing.check_map) before any model is built."""
    raw = read_regular(path, "--map file", MAP_BYTES)
    try:
        name_map = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
        raise ValueError(f"--map file {path!r} is not a JSON object of names to names") from None
    if not isinstance(name_map, dict):
        raise ValueError(f"--map file {path!r} must hold a JSON object of names to names")
    try:
        check_map(name_map)
    except ValueError as error:
        raise ValueError(f"--map file {path!r}: {error}") from None
    return name_map


def _bytes(count: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.2f} {unit}"
    return f"{count} bytes"


def _header(stream, where: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, declared data bytes) from a .npy header, before any data is read."""
    try:
        version = np.lib.format.read_magic(stream)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = reader(stream)
    except (ValueError, OSError, EOFError, SyntaxError) as error:
        raise ValueError(f"{where} is not a .npy array: {error}") from None
    if dtype.kind not in NUMERIC or dtype.fields is not None:
        why = "Python objects are never unpickled" if dtype.kind == "O" else "a bfloat16 array saved by NumPy loses its type: save it as float32"
        raise ValueError(f"{where} is not a .npy or .npz file of arrays of numbers: it holds dtype {dtype.str} ({why})")
    declared = math.prod(shape) * dtype.itemsize
    if declared > INPUT_BYTES:
        raise ValueError(f"{where} declares shape {shape} {dtype}: {_bytes(declared)}, more than the {_bytes(INPUT_BYTES)} bound on inputs")
    return shape, dtype, declared


def read_input_file(path: str) -> Inputs:
    """--inputs: the arguments of one call from a .npy or .npz file (see the module's docstring)."""
    raw = read_regular(path, "--inputs file", INPUT_BYTES)
    where = f"--inputs file {path!r}"
    if raw.startswith(b"PK"):
        return _archive(raw, where)
    stream = io.BytesIO(raw)
    _, _, declared = _header(stream, where)
    if len(raw) - stream.tell() < declared:
        raise ValueError(f"{where} is truncated: its header declares {declared} bytes of data, it holds {len(raw) - stream.tell()}")
    try:
        return Inputs((np.load(io.BytesIO(raw), allow_pickle=False),), {})
    except (ValueError, OSError, EOFError) as error:
        raise ValueError(f"{where} is not a .npy or .npz file of arrays: {error}") from None


def _archive(raw: bytes, where: str) -> Inputs:
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw))
        members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
        raise ValueError(f"{where} is not a .npy or .npz file of arrays: {error}") from None
    if len(members) > MEMBERS:
        raise ValueError(f"{where} holds {len(members)} arrays, more than the {MEMBERS} arguments one call takes")
    total = sum(member.file_size for member in members)
    if total > INPUT_BYTES:
        raise ValueError(f"{where} declares {_bytes(total)} once unpacked, more than the {_bytes(INPUT_BYTES)} bound on inputs")
    arrays = {}
    try:
        with archive:
            for member in members:
                name = member.filename.removesuffix(".npy")
                with archive.open(member) as stream:
                    _, _, declared = _header(stream, f"{where} member {member.filename!r}")
                    if declared > member.file_size - stream.tell():
                        raise ValueError(f"{where} member {member.filename!r} is truncated: its header declares {declared} bytes of data")
                with archive.open(member) as stream:  # read from its start again, its header checked against the bound
                    try:
                        arrays[name] = np.lib.format.read_array(stream, allow_pickle=False)
                    except ValueError as error:
                        raise ValueError(f"{where} member {member.filename!r} is not an array of numbers: {error}") from None
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError) as error:
        raise ValueError(f"{where} is not a .npy or .npz file of arrays: {error}") from None
    return _arguments(arrays, where)


def _arguments(arrays: dict[str, np.ndarray], where: str) -> Inputs:
    """arr_0, arr_1, ... positional in that order; every other name a keyword."""
    positional = sorted((int(name[4:]), name) for name in arrays if name.startswith("arr_") and name[4:].isdigit())
    if [index for index, _ in positional] != list(range(len(positional))):
        raise ValueError(f"{where}: positional members must be arr_0, arr_1, ... without gaps; got {', '.join(name for _, name in positional)}")
    keywords = {name: value for name, value in arrays.items() if not (name.startswith("arr_") and name[4:].isdigit())}
    bad = [name for name in keywords if not name.isidentifier()]
    if bad:
        raise ValueError(f"{where}: member {bad[0]!r} is neither arr_N nor a keyword argument's name")
    return Inputs(tuple(arrays[name] for _, name in positional), keywords)


def check_writable(path: str, inputs: list[str]) -> None:
    """--write-map: refuse before any work a path that is not a regular file (a FIFO, a device, a
    folder, a symbolic link), is one of the command's inputs, or sits in a folder that does not exist."""
    target = Path(path)
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise ValueError(f"--write-map {path!r} is {kind}; give a regular file's path")
    if not target.parent.resolve().is_dir():
        raise ValueError(f"--write-map {path!r}: folder {str(target.parent)!r} does not exist")
    for other in inputs:
        if other and Path(other).exists() and same_file(target, other):
            raise ValueError(f"--write-map {path!r} is the input {other!r}: refusing to overwrite it")


def write_map(path: str, name_map: dict[str, str]) -> None:
    """The map as JSON, written through a temporary file and a rename."""
    write_atomically(Path(path), (json.dumps(name_map, indent=2) + "\n").encode())
