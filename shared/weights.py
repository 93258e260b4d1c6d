"""The exchange format: a flat {name: array} in PyTorch layout, stored as safetensors with the config.

Names are exactly the torch `TinyLM.state_dict()` keys. Linear weights are (out, in).
Nothing here imports a framework, and nothing is ever unpickled.

Over 300 lines on purpose: the bounded safetensors reader and every check of a weights file
live together, so that no read of a weights file can skip one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy

from shared import checks, files
from shared.config import DTYPES, ModelConfig
from shared.files import PathArg, write_atomically
from shared.words import plural

FORMAT = "mhsa-exchange"
FORMAT_VERSION = "1"
# fields that decide the parameter shapes; attn_impl only picks a kernel
ARCHITECTURE_FIELDS = ("vocab_size", "d_model", "n_heads", "max_len", "bias")
MAX_HEADER = 1_000_000  # bytes; this project's headers are under 4 kB, safetensors' own cap is 100 MB
MAX_DEPTH = 3  # {"name": {"shape": [...]}}: three levels; metadata values are strings
OPENING, CLOSING = np.frombuffer(b"{[", dtype=np.uint8), np.frombuffer(b"}]", dtype=np.uint8)
# safetensors dtype code -> (the name this project reports, a NumPy dtype of that item size)
SAFETENSORS_DTYPES = {
    "F64": ("float64", "float64"),
    "F32": ("float32", "float32"),
    "F16": ("float16", "float16"),
    "BF16": ("bfloat16", "uint16"),
    "I64": ("int64", "int64"),
    "I32": ("int32", "int32"),
    "I16": ("int16", "int16"),
    "I8": ("int8", "int8"),
    "U64": ("uint64", "uint64"),
    "U32": ("uint32", "uint32"),
    "U16": ("uint16", "uint16"),
    "U8": ("uint8", "uint8"),
    "BOOL": ("bool", "bool"),
}


def param_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every exchange name with its shape, in state_dict order."""
    V, D, L = config.vocab_size, config.d_model, config.max_len
    shapes = {
        "tok_emb.weight": (V, D),
        "pos_emb.weight": (L, D),
        "attn.qkv_proj.weight": (3 * D, D),  # rows [0, D) = Q, [D, 2D) = K, [2D, 3D) = V
        "attn.qkv_proj.bias": (3 * D,),
        "attn.out_proj.weight": (D, D),
        "attn.out_proj.bias": (D,),
        "lm_head.weight": (V, D),
        "lm_head.bias": (V,),
    }
    if not config.bias:
        shapes = {name: shape for name, shape in shapes.items() if not name.endswith(".bias")}
    return shapes


def init_weights(config: ModelConfig, seed: int, dtype: str = "float32") -> dict[str, np.ndarray]:
    """Initial weights every backend can load: linear layers uniform in +-1/sqrt(fan_in) like
    torch's nn.Linear, embeddings N(0, 1) like nn.Embedding. Deterministic in (config, seed)."""
    if dtype not in DTYPES:
        raise ValueError(f"init_weights: dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in param_shapes(config).items():
        if name.endswith("emb.weight"):
            value = rng.standard_normal(shape)
        else:
            fan_in = config.d_model  # every linear layer here reads D features
            bound = 1.0 / np.sqrt(fan_in)
            value = rng.uniform(-bound, bound, size=shape)
        arrays[name] = value.astype(dtype)
    return arrays


def validate(arrays: dict, config: ModelConfig, dtype: str | None = None) -> str:
    """Check names, shapes and dtypes against `config`; return the common dtype name.

    Raises ValueError naming the key, what was expected and what was found, for a missing
    key, an extra key, a wrong shape or dtype, or mixed dtypes; TypeError for a non-array.
    """
    if not isinstance(arrays, dict):
        raise TypeError(f"weights must be a dict of NumPy arrays, got {type(arrays).__name__}")
    for name in param_shapes(config):
        if name in arrays and not isinstance(arrays[name], np.ndarray):
            raise TypeError(f"weights['{name}'] must be a NumPy array, got {type(arrays[name]).__name__}")
    return check_layout(
        {name: (value.shape, value.dtype.name) for name, value in arrays.items() if isinstance(value, np.ndarray)}
        | {name: None for name, value in arrays.items() if not isinstance(value, np.ndarray)},
        config,
        dtype,
    )


def check_layout(layout: dict, config: ModelConfig, dtype: str | None = None) -> str:
    """`validate` on {name: (shape, dtype name)}: what a file's header declares, checked
    before its body is read. Returns the common dtype name."""
    expected = param_shapes(config)
    missing = [name for name in expected if name not in layout]
    if missing:
        listed = ", ".join(f"'{name}' {expected[name]}" for name in missing)
        raise ValueError(f"weights are missing key(s) {listed} required by {_describe(config)}")
    extra = sorted(name for name in layout if name not in expected)
    if extra:
        raise ValueError(f"weights have unexpected key(s) {extra}; {_describe(config)} expects exactly {list(expected)}")
    for name, shape in expected.items():
        found_shape, found_dtype = layout[name]
        if tuple(found_shape) != shape:
            hint = " (looks transposed: exchange weights are PyTorch (out, in))" if tuple(found_shape) == shape[::-1] else ""
            raise ValueError(f"weights['{name}'] has shape {tuple(found_shape)}, expected {shape}{hint}")
        if found_dtype not in DTYPES:
            raise ValueError(f"weights['{name}'] has dtype {found_dtype}, expected one of {', '.join(DTYPES)}")
    found = {layout[name][1] for name in expected}
    if len(found) > 1:
        by_dtype = {d: [n for n in expected if layout[n][1] == d] for d in sorted(found)}
        raise ValueError(f"weights mix dtypes {by_dtype}; expected one dtype for every array")
    common = found.pop()
    if dtype is not None and common != dtype:
        raise ValueError(f"weights are {common}, expected {dtype}")
    return common


def save(path: PathArg, arrays: dict[str, np.ndarray], config: ModelConfig) -> None:
    """Write `arrays` and `config` as safetensors, atomically: a temporary file in the same
    folder, then a rename, so an interrupted save never destroys the previous file."""
    write_atomically(Path(path), payload(arrays, config))


def payload(arrays: dict, config: ModelConfig) -> bytes:
    """The bytes of a weights file, after validating `arrays` against `config`."""
    validate(arrays, config)
    metadata = {"format": FORMAT, "format_version": FORMAT_VERSION, "config": json.dumps(config.to_dict())}
    return safetensors.numpy.save({name: np.ascontiguousarray(value) for name, value in arrays.items()}, metadata)


@dataclass(frozen=True)
class Loaded:
    """A weights file read once: its arrays and config, its dtype, and the SHA-256 of its bytes
    (what an Adam companion file records to bind itself to these weights)."""

    path: Path
    arrays: dict
    config: ModelConfig
    dtype: str
    digest: str


def read(path: PathArg, expect: ModelConfig | None = None) -> Loaded:
    """Read and validate a file written by `save`, once, with bounded reads: the header's
    config, names, shapes and dtypes are checked before the body is read. The values are not
    (a trainer stops at the first non-finite loss); the commands refuse NaN and infinities with
    check_finite."""
    path = Path(path)
    what = f"weights file {str(path)!r}"
    found: dict[str, Any] = {}

    def check(header: dict) -> None:
        metadata = header.get("__metadata__") or {}
        if metadata.get("format") != FORMAT or "config" not in metadata:
            raise ValueError(
                f"{what} is safetensors but not in the {FORMAT} format (metadata {sorted(metadata)} lacks 'format': '{FORMAT}' and 'config')"
            )
        found["config"] = config = config_from_metadata(metadata, what)
        if expect is not None:
            check_same_architecture(config, expect, source=what)
        try:
            found["dtype"] = check_layout(tensor_layout(header), config)
        except ValueError as error:  # name the file: the same message would fit any dict
            raise ValueError(f"{what}: {error}") from None

    raw, _ = read_safetensors(path, "weights file", check)
    arrays = decode(raw, what)
    return Loaded(path, arrays, found["config"], found["dtype"], hashlib.sha256(raw).hexdigest())


def check_finite(arrays: dict[str, np.ndarray], what: str) -> None:
    """Refuse arrays holding NaN or infinite values (a run that diverged, or a damaged file), with
    one message for every command that reads them (train --load and --resume, generate, heads):
    nothing trains, generates or draws from them. what: "weights file 'NAME'", say."""
    bad = [name for name, value in arrays.items() if not np.isfinite(value).all()]
    if bad:
        raise ValueError(f"{what} holds NaN or infinite values in {bad}; refusing to use it")


def load(path: PathArg, expect: ModelConfig | None = None) -> tuple[dict[str, np.ndarray], ModelConfig]:
    """Read a file written by `save`: returns (arrays, config), both validated.

    With `expect`, a file whose architecture (sizes, bias) disagrees with it is refused.
    Anything that is not a safetensors file of this format raises ValueError naming the path;
    a FIFO, a device or a folder is refused before a byte is read.
    """
    loaded = read(path, expect)
    return loaded.arrays, loaded.config


def config_from_metadata(metadata: dict, what: str, key: str = "config") -> ModelConfig:
    """The ModelConfig a file's metadata records; every shape-deciding field must be there."""
    try:
        data = json.loads(metadata[key])
        missing = [name for name in ARCHITECTURE_FIELDS if not isinstance(data, dict) or name not in data]
        if missing:
            raise ValueError(f"missing field(s) {missing}")
        return ModelConfig.from_dict(data)
    except (KeyError, ValueError, TypeError) as error:
        raise ValueError(f"{what} has an invalid config in its metadata: {error}") from None


def decode(raw: bytes, what: str) -> dict[str, np.ndarray]:
    try:
        return safetensors.numpy.load(raw)
    except Exception as error:  # safetensors raises its own SafetensorError
        raise ValueError(f"{what} is not a valid safetensors file: {error}") from None


def check_same_architecture(found: ModelConfig, expected: ModelConfig, source: str = "weights") -> None:
    """Raise ValueError listing every shape-deciding field where `found` differs from `expected`."""
    differences = [
        f"{name}={getattr(found, name)!r} (expected {getattr(expected, name)!r})"
        for name in ARCHITECTURE_FIELDS
        if getattr(found, name) != getattr(expected, name)
    ]
    if differences:
        raise ValueError(f"{source} was saved with a different model config: {', '.join(differences)}")


def read_safetensors(path: Path, what: str, check: Callable[[dict], None]) -> tuple[bytes, dict]:
    """The bytes and header of a safetensors file, read with bounds: a regular file only, a
    header of at most MAX_HEADER bytes nested at most MAX_DEPTH deep, tensors that tile the
    body exactly, the file size equal to what the header declares, `check(header)` passed
    and the body within available memory, all before the body is read."""
    # safetensors: 8-byte little-endian header length, then a JSON object; anything else
    # (a pickle, a zip, an empty or truncated file) is refused before a parser sees it
    name = f"{what} {str(path)!r}"
    fd, info = files.open_regular(path, what)
    try:
        size = info.st_size
        if size == 0:
            raise ValueError(f"{name} is not a safetensors file: it is empty (0 bytes)")
        if size < 8:
            raise ValueError(f"{name} is not a safetensors file: only {plural(size, 'byte')}")
        prefix = files.read_exactly(fd, 9 if size > 8 else 8, what, path)
        (header_length,) = struct.unpack("<Q", prefix[:8])
        peek = prefix[8:9]
        if peek in (b"{", b"") and 0 < header_length <= MAX_HEADER and header_length > size - 8:
            raise ValueError(f"{name} is truncated: its header announces {header_length} bytes but only {size - 8} follow")
        if peek == b"{" and header_length > MAX_HEADER:
            raise ValueError(
                f"{name} is not a valid safetensors file: its header announces {header_length} bytes, more than the {MAX_HEADER}-byte limit"
            )
        if header_length > size - 8 or header_length == 0 or peek != b"{":
            raise ValueError(f"{name} is not a safetensors file (no valid header; a pickle or torch.save file is refused and never unpickled)")
        header_bytes = peek + files.read_exactly(fd, header_length - 1, what, path)
        header = parse_header(header_bytes, name)
        body = body_size(header, name)
        if body > size - 8 - header_length:
            raise ValueError(f"{name} is truncated: its header describes more data than the file holds")
        if body < size - 8 - header_length:
            raise ValueError(f"{name} is not a valid safetensors file: {size - 8 - header_length - body} bytes follow the data its header describes")
        check(header)
        checks.check_memory(body, f"reading {name}")
        data = files.read_exactly(fd, body, what, path)
    finally:
        os.close(fd)
    return prefix[:8] + header_bytes + data, header


def parse_header(header_bytes: bytes, name: str) -> dict:
    depth = json_depth(header_bytes)
    if depth > MAX_DEPTH:
        raise ValueError(
            f"{name} is not a valid safetensors file: its header nests {depth} levels deep, more than the {MAX_DEPTH} a safetensors header has"
        )
    try:
        header = json.loads(header_bytes)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ValueError(f"{name} is not a safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError(f"{name} is not a safetensors file: its header is not a JSON object")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(value, str) for value in metadata.values()):
        raise ValueError(f"{name} is not a valid safetensors file: its __metadata__ is not a map of strings")
    return header


def json_depth(text: bytes) -> int:
    """How deep brackets nest in a JSON text, strings skipped: bounded before json.loads
    (which would recurse once per level)."""
    without_strings = re.sub(rb'"(?:[^"\\]|\\.)*"', b'""', text)
    steps = np.frombuffer(without_strings, dtype=np.uint8)
    change = np.isin(steps, OPENING).astype(np.int64) - np.isin(steps, CLOSING).astype(np.int64)
    return int(np.cumsum(change).max(initial=0))


def body_size(header: dict, name: str) -> int:
    """Bytes of tensor data the header declares, after checking that its tensors tile
    [0, size) exactly: known dtypes, shapes of non-negative ints, no overlap, no gap."""
    spans = []
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(end) is int for end in offsets)):
            raise ValueError(f"{name} is not a valid safetensors file: tensor {key!r} has no [begin, end] data_offsets in its header")
        dtype, shape = entry.get("dtype"), entry.get("shape")
        if dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"{name} is not a valid safetensors file: tensor {key!r} has unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
            raise ValueError(f"{name} is not a valid safetensors file: tensor {key!r} has shape {shape!r}")
        nbytes = math.prod(shape) * np.dtype(SAFETENSORS_DTYPES[dtype][1]).itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise ValueError(
                f"{name} is not a valid safetensors file: tensor {key!r} ({dtype} {shape}) needs "
                f"{nbytes} bytes, its data_offsets {offsets} give {offsets[1] - offsets[0]}"
            )
        spans.append((offsets[0], offsets[1], key))
    spans.sort()
    end = 0
    for begin, finish, key in spans:
        if begin != end:
            raise ValueError(
                f"{name} is not a valid safetensors file: tensor {key!r} starts at byte {begin}, expected {end} (tensors overlap or leave a gap)"
            )
        end = finish
    return end


def tensor_layout(header: dict) -> dict:
    """{name: (shape, NumPy dtype name)} of the tensors a (checked) header declares."""
    return {key: (tuple(entry["shape"]), SAFETENSORS_DTYPES[entry["dtype"]][0]) for key, entry in header.items() if key != "__metadata__"}


def _describe(config: ModelConfig) -> str:
    return f"ModelConfig({', '.join(f'{name}={getattr(config, name)}' for name in ARCHITECTURE_FIELDS)})"
