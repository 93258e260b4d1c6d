"""A checkpoint is one unit: the weights file `NAME.safetensors` (the exchange format, what
--load reads) and its Adam companion `NAME.adam.safetensors`, bound to each other by the
SHA-256 of the weights file's bytes, recorded in the companion and verified on every --resume.

Saving writes the weights, then the companion, each atomically; SIGINT is deferred until both
are written. A process killed (SIGKILL, power loss) between the two renames leaves new weights
beside the old companion: --load still works, --resume refuses the pair because the digests
differ. A companion copied from another run is refused the same way.

Companions written before the binding (no weights_sha256) are refused with a message; if the
pair does belong together, bind() (the command `mhsa bind NAME.safetensors`) records the digest
of the weights beside it.
"""

from __future__ import annotations

import hashlib
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from shared import adam_state, checks, weights
from shared.adam_state import AdamState, companion_path
from shared.config import ModelConfig
from shared.files import PathArg, write_atomically


def save(path: PathArg, arrays: dict[str, np.ndarray], state: AdamState, model_config: ModelConfig) -> Path:
    """Write the weights and their bound Adam companion; returns the companion's path.

    Both payloads are built and validated before either file is touched."""
    path = Path(path)
    companion = companion_path(path)
    checks.check_writable(companion, "the Adam companion of --save")
    for moment in adam_state.MOMENTS:
        weights.validate(getattr(state, moment), model_config, dtype=state.train_config.dtype)
    weights_bytes = weights.payload(arrays, model_config)
    adam_bytes = adam_state.payload(state, model_config, hashlib.sha256(weights_bytes).hexdigest())
    with deferred_interrupt():
        write_atomically(path, weights_bytes)
        write_atomically(companion, adam_bytes)
    return companion


def load(path: PathArg, model_config: ModelConfig | None = None) -> tuple[weights.Loaded, AdamState]:
    """Read a checkpoint for --resume: the weights once, then the companion, verified to be
    the one written with exactly these weights."""
    loaded = weights.read(path, expect=model_config)
    state = adam_state.load(companion_path(path), loaded.config, weights_digest=loaded.digest)
    return loaded, state


@contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Hold SIGINT (Ctrl-C) while the block runs, then raise KeyboardInterrupt if one came:
    the two files of a checkpoint are written both or, on an error, neither is half-written."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


def bind(path: PathArg) -> Path:
    """Record in the companion of `path` the digest of the weights file `path` (converts a
    checkpoint saved before the binding). The companion must fit the weights' config."""
    loaded = weights.read(path)
    companion = companion_path(path)
    state = adam_state.load(companion, loaded.config)
    if loaded.dtype != state.train_config.dtype:
        raise ValueError(f"{str(companion)!r} holds {state.train_config.dtype} moments, the weights are {loaded.dtype}")
    write_atomically(companion, adam_state.payload(state, loaded.config, loaded.digest))
    return companion
