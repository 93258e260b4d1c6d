"""Input checks shared by every backend, over shapes and dtype names, so that the same bad
input raises the same exception with the same message in NumPy, PyTorch and JAX. They run once
per call, where it enters: each public function calls its model's check first (docs/DESIGN.md,
"Errors")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

# the index dtypes every backend embeds: torch's nn.Embedding refuses any other
TOKEN_DTYPES = ("int32", "int64")
# the dtypes a block computes in (shared.config.DTYPES); an input in any other is refused
BLOCK_DTYPES = ("float32", "float64")
# the seed range every backend accepts: NumPy's default_rng, torch.manual_seed and
# jax.random.key all take it (JAX overflows at 2**63, torch refuses 2**64)
SEED_RANGE = (0, 2**32 - 1)


# --- the checks ---------------------------------------------------------------------------


def check_block(d_model: int, n_heads: int, max_len: int | None) -> None:
    """Sizes of one attention block: positive integers with d_model % n_heads == 0.

    max_len None: no context limit (numpy_ref's pure attention function)."""
    sizes = (("d_model", d_model), ("n_heads", n_heads)) + ((("max_len", max_len),) if max_len is not None else ())
    for name, value in sizes:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        if value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value}")
    if d_model % n_heads != 0:
        raise ValueError(
            f"d_model={d_model} is not divisible by n_heads={n_heads}; d_model must be a multiple of n_heads (d_head = d_model // n_heads)"
        )


def dtype_kind(name: str) -> str:
    """'float', 'int', 'bool' or 'other' for a dtype name such as 'float32' or 'torch.int64'."""
    name = _neutral(name)
    if name == "bool":
        return "bool"
    if name.startswith(("float", "bfloat")):
        return "float"
    if name.startswith(("int", "uint")):
        return "int"
    return "other"


def _neutral(name: str) -> str:
    # 'torch.float32' -> 'float32': the same message in every backend
    return str(name).removeprefix("torch.")


def check_input(shape: tuple, dtype_name: str, d_model: int, max_len: int | None, block_dtype: str | None = None) -> None:
    """x must be a float (B, T, D) with D == d_model and 1 <= T <= max_len (no limit if None).

    The dtype rule, the same in every backend: x must be float32 or float64 and, when the
    block's own dtype is given, exactly that one. Nothing is converted silently: a float16,
    bfloat16 or float64 input to a float32 block raises TypeError (convert it first)."""
    if dtype_kind(dtype_name) != "float":
        raise TypeError(f"attention input must be a floating-point array (B, T, D), got dtype {_neutral(dtype_name)}")
    found = _neutral(dtype_name)
    if found not in BLOCK_DTYPES or (block_dtype is not None and found != _neutral(block_dtype)):
        wanted = _neutral(block_dtype) if block_dtype is not None else " or ".join(BLOCK_DTYPES)
        raise TypeError(f"attention input has dtype {found}, expected {wanted} (the block's dtype); convert it first, nothing is converted silently")
    if len(shape) != 3:
        raise ValueError(f"attention input must have rank 3 (B, T, D), got rank {len(shape)} with shape {tuple(shape)}")
    _, T, D = shape
    if D != d_model:
        raise ValueError(f"attention input width D={D} does not match d_model={d_model} (input shape {tuple(shape)})")
    check_length(T, max_len)


def check_tokens(shape: tuple, dtype_name: str, vocab_size: int, max_len: int, low: int | None = None, high: int | None = None) -> None:
    """tokens must be integer (B, T) with 1 <= T <= max_len and every id in [0, vocab_size).

    `low` and `high` are the smallest and largest id when they are known (None while tracing).
    """
    if _neutral(dtype_name) not in TOKEN_DTYPES:
        raise TypeError(f"tokens must be an integer array (B, T) of {' or '.join(TOKEN_DTYPES)}, got dtype {_neutral(dtype_name)}")
    if len(shape) != 2:
        raise ValueError(f"tokens must have rank 2 (B, T), got rank {len(shape)} with shape {tuple(shape)}")
    check_length(shape[1], max_len)
    if low is not None and high is not None and (low < 0 or high >= vocab_size):  # both known or neither
        raise ValueError(token_id_error(low if low < 0 else high, vocab_size))


def token_id_error(bad: int | str, vocab_size: int) -> str:
    """The message of an id out of range; `bad` may be a placeholder ("{}") that jax's checkify fills in."""
    return f"token id {bad} is out of range: ids must lie in [0, {vocab_size}) for vocab_size={vocab_size}"


def id_range(tokens: Any) -> tuple[int | None, int | None]:
    """The smallest and largest id of tokens of a dtype check_tokens accepts (a NumPy array or a
    tensor on any device), so that a bad id is named before it is used; (None, None) when there is
    none to read: no ids, or another dtype, which check_tokens refuses by its name (torch has no
    min of a uint64 tensor, and would fail here first)."""
    if 0 in tuple(tokens.shape) or _neutral(str(tokens.dtype)) not in TOKEN_DTYPES:
        return None, None
    return int(tokens.min()), int(tokens.max())


def check_batches(batches: list, vocab_size: int, max_len: int) -> None:
    """Every (x, y) of a run's batches of host arrays: the check of each x that a forward makes,
    once for the whole run, before its first step. Shapes and dtypes of every batch first (each
    distinct one once), then the ids of all batches at once; only when one is out of range are
    the batches read one by one, so that the first bad batch is named as its forward names it."""
    for shape, dtype in dict.fromkeys((x.shape, x.dtype) for x, _ in batches):  # in batch order
        check_tokens(shape, dtype.name, vocab_size, max_len)
    ids = np.concatenate([x for x, _ in batches], axis=None) if batches else np.zeros(0, np.int64)  # flat
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        for x, _ in batches:
            check_tokens(x.shape, x.dtype.name, vocab_size, max_len, *id_range(x))


def check_length(T: int, max_len: int | None) -> None:
    if T < 1:
        raise ValueError(f"sequence length T={T} must be at least 1")
    if max_len is not None and T > max_len:
        raise ValueError(f"sequence length T={T} is longer than max_len={max_len}")


def layout(array: Any) -> tuple[tuple[int, ...], str]:
    """(shape, dtype name) of any array-like: a NumPy array, a tensor, a jax array or nested lists."""
    if not (hasattr(array, "shape") and hasattr(array, "dtype")):
        array = np.asarray(array)
    return tuple(array.shape), _neutral(str(array.dtype))


def check_mask(mask_shape: tuple, dtype_name: str, target: tuple) -> None:
    """A mask (True = may attend) must be boolean and broadcast to `target` = (B, H, T, T).

    The rule for masks, the same in every backend: any array-like of bool (a NumPy array, nested
    lists, the framework's own array) is accepted and made the framework's array once, where
    the call enters; anything that is not boolean is refused, never converted."""
    if dtype_kind(dtype_name) != "bool":
        raise TypeError(f"mask must be a boolean array (True = may attend), got dtype {_neutral(dtype_name)}")
    try:
        broadcast = np.broadcast_shapes(tuple(mask_shape), tuple(target))
    except ValueError:
        broadcast = None
    if broadcast != tuple(target):
        raise ValueError(f"mask of shape {tuple(mask_shape)} does not broadcast to (B, H, T, T) = {tuple(target)}")


def check_weight_shape(name: str, shape: tuple, expected: tuple) -> None:
    """One exchange array's shape (PyTorch layout): a wrong weight is named, with its expected shape."""
    if tuple(shape) != tuple(expected):
        hint = " (looks transposed: exchange weights are PyTorch (out, in))" if tuple(shape) == tuple(expected)[::-1] else ""
        raise ValueError(f"weights['{name}'] has shape {tuple(shape)}, expected {tuple(expected)}{hint}")


def check_attention_weights(shapes: dict[str, tuple], d_model: int) -> None:
    """The block's weights, {exchange name: shape in PyTorch layout}, against d_model: checked
    before its input, so that a wrong weight is named instead of the input being blamed for it."""
    D = d_model
    expected = {"attn.qkv_proj.weight": (3 * D, D), "attn.qkv_proj.bias": (3 * D,), "attn.out_proj.weight": (D, D), "attn.out_proj.bias": (D,)}
    for name, shape in shapes.items():
        check_weight_shape(name, shape, expected[name])


def check_seed(seed: int, owner: str = "seed") -> None:
    """A seed every backend accepts: an int in SEED_RANGE."""
    low, high = SEED_RANGE
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not low <= seed <= high:
        raise ValueError(f"{owner} must be an integer in [{low}, 2**32 - 1], got {seed!r}")


def available_memory() -> int:
    """Bytes of memory the system can give now (MemAvailable), or total physical memory."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(nbytes: int, doing: str, detail: str = "") -> None:
    """Refuse, before allocating, work whose estimated memory exceeds what is available."""
    available = available_memory()
    if nbytes > available:
        raise ValueError(
            f"{doing} needs an estimated {_gib(nbytes)} of memory{detail}, more than the {_gib(available)} available; choose smaller sizes"
        )


def training_bytes(vocab_size: int, d_model: int, n_heads: int, max_len: int, batch_size: int, n_sequences: int, itemsize: int) -> dict[str, int]:
    """A lower-bound estimate of what training allocates, by part (bytes): the parameters
    with their gradients and two Adam moments, one step's activations including the
    (B, H, T, T) attention weights and their gradients, and the copy-task rows and batches."""
    V, D, H, T, B = vocab_size, d_model, n_heads, max_len, batch_size
    parameters = 2 * V * D + T * D + 4 * D * D + 4 * D + V
    return {
        "parameters": 4 * parameters * itemsize,
        "activations": (B * T * (8 * D + 3 * V) + 4 * B * H * T * T) * itemsize,
        "data": 3 * n_sequences * T * 8,  # int64 rows, then x and y batches
    }


def check_training_fits(vocab_size: int, d_model: int, n_heads: int, max_len: int, batch_size: int, n_sequences: int, itemsize: int) -> None:
    parts = training_bytes(vocab_size, d_model, n_heads, max_len, min(batch_size, n_sequences), n_sequences, itemsize)
    detail = " (" + ", ".join(f"{name} {_gib(size)}" for name, size in parts.items()) + ")"
    check_memory(sum(parts.values()), "this run", detail)


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def check_outputs(inputs: dict, outputs: dict) -> None:
    """Never write over an input, never write two outputs to one file: {flag: path} each,
    compared resolved and by (device, inode) where the file exists. None entries are skipped."""
    from shared.files import same_file

    inputs = {flag: path for flag, path in inputs.items() if path is not None}
    outputs = {flag: path for flag, path in outputs.items() if path is not None}
    flags = list(outputs)
    for index, flag in enumerate(flags):
        for source, path in inputs.items():
            if same_file(outputs[flag], path):
                raise ValueError(f"{flag} {str(outputs[flag])!r} is the input {source} {str(path)!r}: it would be overwritten; choose another file")
        for other in flags[index + 1 :]:
            if same_file(outputs[flag], outputs[other]):
                raise ValueError(
                    f"{flag} {str(outputs[flag])!r} and {other} {str(outputs[other])!r} are the same file; give each output its own file"
                )


def check_writable(path: str | os.PathLike[str], flag: str) -> None:
    """An output file a run will write at its end: refuse it before any work, not after.

    Its folder must exist and be writable, and the path must not be a folder itself."""
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a directory, expected a file name")
    if not folder.is_dir():
        raise ValueError(f"{flag} {str(path)!r}: folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {str(path)!r}: folder {str(folder)!r} is not writable")


def check_generate(
    shape: tuple,
    dtype_name: str,
    vocab_size: int,
    max_len: int,
    max_new_tokens: int,
    low: int | None = None,
    high: int | None = None,
    greedy: bool = True,
    temperature: float = 1.0,
) -> None:
    """A generation request, before any work: a non-empty integer prompt (B, P) with ids in
    [0, vocab_size), max_new_tokens a non-negative int, and P + max_new_tokens <= max_len
    (every position, the last generated one included, needs a row of pos_emb)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
        raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r} ({type(max_new_tokens).__name__})")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be at least 0, got {max_new_tokens}")
    if not greedy and not temperature > 0:
        raise ValueError(f"temperature must be positive for sampling, got {temperature}")
    if len(shape) == 2 and 0 in shape:
        raise ValueError(f"prompt is empty (shape {tuple(shape)}); expected at least one token id in each of at least one row")
    check_tokens(shape, dtype_name, vocab_size, max_len, low, high)
    if shape[1] + max_new_tokens > max_len:
        raise ValueError(
            f"prompt of {shape[1]} tokens plus max_new_tokens={max_new_tokens} is {shape[1] + max_new_tokens} "
            f"positions, longer than max_len={max_len}"
        )


def check_cache_and_mask(B: int, T: int, dtype_name: str, n_heads: int, max_len: int, mask: Any, cache: Any, filled: int | None) -> None:
    """The optional mask and KV cache of a call over a chunk of T positions of B rows in dtype_name:
    the cache (with .k (B, H, max_len, d_head)) must hold B rows of that dtype and room for T more
    after the `filled` positions (None while jit traces the call); the mask must be boolean and
    broadcast to (B, H, T, S), S = T without a cache, max_len with one."""
    if cache is not None:
        check_cache(B, dtype_name, cache.k.shape[0], str(cache.k.dtype), filled, T, max_len)
    if mask is not None:
        check_mask(*layout(mask), (B, n_heads, T, T if cache is None else max_len))


def check_cache(batch: int, dtype_name: str, cache_batch: int, cache_dtype_name: str, start: int | None, T: int, max_len: int) -> None:
    """A KV cache given to a forward pass: the batch and dtype of the chunk (B, T, D) it extends,
    and room for T more positions after the `start` already filled (None while tracing)."""
    if cache_batch != batch:
        raise ValueError(f"KV cache holds a batch of {cache_batch} rows, the input has {batch}")
    if _neutral(cache_dtype_name) != _neutral(dtype_name):
        raise TypeError(f"KV cache dtype {_neutral(cache_dtype_name)} does not match the input's {_neutral(dtype_name)}")
    if start is not None and start + T > max_len:
        raise ValueError(f"KV cache holds {start} positions; {T} more would end at {start + T}, longer than max_len={max_len}")
