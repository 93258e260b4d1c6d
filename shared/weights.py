"""The exchange format: a flat {name: array} in PyTorch layout, stored as safetensors with the config.

Names are exactly the torch `TinyLM.state_dict()` keys. Linear weights are (out, in).
Nothing here imports a framework, and nothing is ever unpickled.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import safetensors.numpy

from shared.config import DTYPES, ModelConfig
from shared.files import write_atomically

FORMAT = "mhsa-exchange"
FORMAT_VERSION = "1"
# fields that decide the parameter shapes; attn_impl only picks a kernel
ARCHITECTURE_FIELDS = ("vocab_size", "d_model", "n_heads", "max_len", "bias")
MAX_HEADER = 100_000_000  # bytes; safetensors refuses a larger header


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
    expected = param_shapes(config)
    missing = [name for name in expected if name not in arrays]
    if missing:
        listed = ", ".join(f"'{name}' {expected[name]}" for name in missing)
        raise ValueError(f"weights are missing key(s) {listed} required by {_describe(config)}")
    extra = sorted(name for name in arrays if name not in expected)
    if extra:
        raise ValueError(f"weights have unexpected key(s) {extra}; {_describe(config)} expects exactly {list(expected)}")
    for name, shape in expected.items():
        value = arrays[name]
        if not isinstance(value, np.ndarray):
            raise TypeError(f"weights['{name}'] must be a NumPy array, got {type(value).__name__}")
        if value.shape != shape:
            hint = " (looks transposed: exchange weights are PyTorch (out, in))" if value.shape == shape[::-1] else ""
            raise ValueError(f"weights['{name}'] has shape {value.shape}, expected {shape}{hint}")
        if value.dtype.name not in DTYPES:
            raise ValueError(f"weights['{name}'] has dtype {value.dtype.name}, expected one of {', '.join(DTYPES)}")
    found = {arrays[name].dtype.name for name in expected}
    if len(found) > 1:
        by_dtype = {d: [n for n in expected if arrays[n].dtype.name == d] for d in sorted(found)}
        raise ValueError(f"weights mix dtypes {by_dtype}; expected one dtype for every array")
    common = found.pop()
    if dtype is not None and common != dtype:
        raise ValueError(f"weights are {common}, expected {dtype}")
    return common


def save(path, arrays: dict, config: ModelConfig) -> None:
    """Write `arrays` and `config` as safetensors, atomically: a temporary file in the same
    folder, then a rename, so an interrupted save never destroys the previous file."""
    validate(arrays, config)
    path = Path(path)
    metadata = {"format": FORMAT, "format_version": FORMAT_VERSION, "config": json.dumps(config.to_dict())}
    payload = safetensors.numpy.save({name: np.ascontiguousarray(value) for name, value in arrays.items()}, metadata)
    write_atomically(path, payload)


def load(path, expect: ModelConfig | None = None) -> tuple[dict[str, np.ndarray], ModelConfig]:
    """Read a file written by `save`: returns (arrays, config), both validated.

    With `expect`, a file whose architecture (sizes, bias) disagrees with it is refused.
    Anything that is not a safetensors file of this format raises ValueError naming the path.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"weights file {str(path)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"weights file {str(path)!r} is a directory, expected a .safetensors file")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise ValueError(f"weights file {str(path)!r} cannot be read: {error.strerror or error}") from None
    header = read_header(raw, path)
    try:
        arrays = safetensors.numpy.load(raw)
    except Exception as error:  # safetensors raises its own SafetensorError
        raise ValueError(f"weights file {str(path)!r} is not a valid safetensors file: {error}") from None
    metadata = header.get("__metadata__") or {}
    if metadata.get("format") != FORMAT or "config" not in metadata:
        raise ValueError(
            f"weights file {str(path)!r} is safetensors but not in the {FORMAT} format "
            f"(metadata {sorted(metadata)} lacks 'format': '{FORMAT}' and 'config')"
        )
    try:
        config = ModelConfig.from_dict(json.loads(metadata["config"]))
    except (ValueError, TypeError) as error:
        raise ValueError(f"weights file {str(path)!r} has an invalid config in its metadata: {error}") from None
    if expect is not None:
        check_same_architecture(config, expect, source=f"weights file {str(path)!r}")
    try:
        validate(arrays, config)
    except ValueError as error:  # name the file: the same message would fit any dict
        raise ValueError(f"weights file {str(path)!r}: {error}") from None
    return arrays, config


def check_same_architecture(found: ModelConfig, expected: ModelConfig, source: str = "weights") -> None:
    """Raise ValueError listing every shape-deciding field where `found` differs from `expected`."""
    differences = [
        f"{name}={getattr(found, name)!r} (expected {getattr(expected, name)!r})"
        for name in ARCHITECTURE_FIELDS
        if getattr(found, name) != getattr(expected, name)
    ]
    if differences:
        raise ValueError(f"{source} was saved with a different model config: {', '.join(differences)}")


def read_header(raw: bytes, path: Path) -> dict:
    """The JSON header of a safetensors file's bytes, after checking that it is one."""
    # safetensors: 8-byte little-endian header length, then a JSON object; anything else
    # (a pickle, a zip, an empty or truncated file) is refused before a parser sees it
    if not raw:
        raise ValueError(f"weights file {str(path)!r} is not a safetensors file: it is empty (0 bytes)")
    if len(raw) < 8:
        raise ValueError(f"weights file {str(path)!r} is not a safetensors file: only {len(raw)} bytes")
    (header_length,) = struct.unpack("<Q", raw[:8])
    cut_in_header = raw[8:9] in (b"{", b"") and 0 < header_length <= MAX_HEADER and header_length > len(raw) - 8
    if cut_in_header:
        raise ValueError(
            f"weights file {str(path)!r} is truncated: its header announces {header_length} bytes "
            f"but only {len(raw) - 8} follow"
        )
    if header_length > len(raw) - 8 or header_length == 0 or raw[8:9] != b"{":
        raise ValueError(
            f"weights file {str(path)!r} is not a safetensors file (no valid header; "
            f"a pickle or torch.save file is refused and never unpickled)"
        )
    try:
        header = json.loads(raw[8 : 8 + header_length])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"weights file {str(path)!r} is not a safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError(f"weights file {str(path)!r} is not a safetensors file: its header is not a JSON object")
    ends = []
    for key, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if key == "__metadata__":
            continue
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(end) is int for end in offsets)):
            raise ValueError(f"weights file {str(path)!r} is not a valid safetensors file: "
                             f"tensor {key!r} has no [begin, end] data_offsets in its header")
        ends.append(offsets[1])
    if ends and max(ends) > len(raw) - 8 - header_length:
        raise ValueError(f"weights file {str(path)!r} is truncated: its header describes more data than the file holds")
    return header


def _describe(config: ModelConfig) -> str:
    return f"ModelConfig({', '.join(f'{name}={getattr(config, name)}' for name in ARCHITECTURE_FIELDS)})"
