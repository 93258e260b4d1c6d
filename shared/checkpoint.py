"""A checkpoint is one unit: the weights file `NAME.safetensors` (the exchange format, what
--load reads) and its Adam companion `NAME.adam.safetensors`, bound to each other by the
SHA-256 of the weights file's bytes, recorded in the companion and verified on every --resume.

Saving writes both files to temporaries in their folder (synced to the disk) before it renames
either: a full disk, an error or a Ctrl-C while they are written removes them and leaves the
previous pair as it was. Then the weights are renamed into place, then the companion, with
SIGINT (and a SIGTERM the program handles) held until both are (SavedThenInterrupted says that one came meanwhile). A process killed
between the two renames (SIGKILL, power loss) leaves the new weights beside the old companion,
and the new companion in its temporary: the next --resume or save of that path finds it, sees
that it is bound to the weights in place and completes the pair (finish_interrupted_save). So
after any failure either the previous pair or the new one is whole and resumable. A companion
copied from another run is refused: its digest names other weights.

Companions written before the binding (no weights_sha256) are refused with a message; if the
pair does belong together, bind() (the command `mhsa bind NAME.safetensors`) records the digest
of the weights beside it. It refuses a companion already bound to other weights unless forced.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from shared import adam_state, checks, files, weights
from shared.adam_state import AdamState, companion_path
from shared.config import ModelConfig
from shared.files import PathArg


class SavedThenInterrupted(KeyboardInterrupt):
    """Ctrl-C came while a checkpoint was being renamed into place; it was held until both files
    were: the new pair is whole on disk."""

    def __init__(self, companion: Path) -> None:
        super().__init__(f"interrupted after both files were written (Adam's state: {companion})")
        self.companion = companion


def save(path: PathArg, arrays: dict[str, np.ndarray], state: AdamState, model_config: ModelConfig) -> Path:
    """Write the weights and their bound Adam companion; returns the companion's path.

    Both payloads are built and validated, then both written to temporaries, before either
    file is replaced. An OSError names the file and says what is on disk."""
    path = Path(path)
    companion = companion_path(path)
    checks.check_writable(companion, "the Adam companion of --save")
    for moment in adam_state.MOMENTS:
        weights.validate(getattr(state, moment), model_config, dtype=state.train_config.dtype)
    weights_bytes = weights.payload(arrays, model_config)
    adam_bytes = adam_state.payload(state, model_config, hashlib.sha256(weights_bytes).hexdigest())
    finish_interrupted_save(path)  # before the clean-up below, which would remove a killed save's second half
    files.remove_stale_temporaries(path)
    files.remove_stale_temporaries(companion)
    try:
        written = [files.write_temporary(path, weights_bytes), files.write_temporary(companion, adam_bytes)]
    except OSError as error:
        _remove_own_temporaries(path)
        raise type(error)(error.errno, f"{error.strerror}; nothing was replaced: a checkpoint saved there before is whole") from None
    except BaseException:  # Ctrl-C: also a temporary whose name was not returned yet
        _remove_own_temporaries(path)
        raise
    with deferred_interrupt(SavedThenInterrupted(companion)):
        try:
            files.commit(written[0], path)
        except OSError as error:
            _remove_own_temporaries(path)
            raise type(error)(error.errno, f"{error.strerror}; nothing was replaced: a checkpoint saved there before is whole") from None
        try:
            files.commit(written[1], companion)
        except OSError as error:  # the temporary stays: it completes the pair with the weights now in place
            raise type(error)(
                error.errno,
                f"{error.strerror}; the new weights are in place and their Adam companion is kept in "
                f"{str(written[1])!r}: the next --resume or save of {str(path)!r} completes the pair",
            ) from None
    return companion


def load(path: PathArg, model_config: ModelConfig | None = None) -> tuple[weights.Loaded, AdamState]:
    """Read a checkpoint for --resume: the weights once, then the companion, verified to be
    the one written with exactly these weights (completing a save killed between its renames)."""
    loaded = weights.read(path, expect=model_config)
    try:
        state = adam_state.load(companion_path(path), loaded.config, weights_digest=loaded.digest)
    except (ValueError, FileNotFoundError):
        pending = _pending_companion(loaded)
        if pending is None:
            raise
        temporary, state = pending
        try:
            files.commit(temporary, companion_path(path))
        except OSError:  # a folder turned read-only: the pair is read as it is, completed by the next save
            pass
    return loaded, state


def finish_interrupted_save(path: PathArg) -> bool:
    """Complete a save of `path` killed between its two renames: rename the companion temporary
    bound to the weights in place over the companion. True when it did."""
    path = Path(path)
    if not files.abandoned_temporaries(companion_path(path)):
        return False
    try:
        loaded = weights.read(path)
    except (ValueError, FileNotFoundError):
        return False  # no weights to complete: the temporaries are only stale
    try:
        adam_state.load(companion_path(path), loaded.config, weights_digest=loaded.digest)
        return False  # the pair in place is whole
    except (ValueError, FileNotFoundError):
        pending = _pending_companion(loaded)
    if pending is None:
        return False
    files.commit(pending[0], companion_path(path))
    return True


def _pending_companion(loaded: weights.Loaded) -> tuple[Path, AdamState] | None:
    """The newest temporary companion of a save that stopped between its renames (its writer is
    gone, or is this process) that is bound to exactly these weights, read; None if there is none."""
    for temporary in files.abandoned_temporaries(companion_path(loaded.path)):
        try:
            return temporary, adam_state.load(temporary, loaded.config, weights_digest=loaded.digest)
        except (ValueError, FileNotFoundError):
            continue
    return None


def _remove_own_temporaries(path: Path) -> None:
    """Remove the temporaries this process wrote for the pair of `path`."""
    for target in (path, companion_path(path)):
        for temporary, pid in files.temporaries(target):
            if pid == os.getpid():
                temporary.unlink(missing_ok=True)


@contextmanager
def deferred_interrupt(raised: KeyboardInterrupt | None = None) -> Iterator[None]:
    """Hold SIGINT (Ctrl-C), and SIGTERM where the program handles it (a handler of its own, as
    the command lines install), while the block runs, then raise `raised` (KeyboardInterrupt by
    default) if one came and the block finished: the renames of a checkpoint happen both or,
    on an error, neither is half-done by an interrupt. A held signal is handed to the handler it
    had before the block first, so that the program learns which signal came."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    held = [signal.SIGINT] + [signal.SIGTERM] * callable(signal.getsignal(signal.SIGTERM))
    previous = {int(signum): signal.signal(signum, lambda signum, frame: received.append(signum)) for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        handler = previous[received[0]]
        if callable(handler):
            try:
                handler(received[0], None)
            except KeyboardInterrupt:  # raised below, as `raised`
                pass
        raise raised or KeyboardInterrupt()


def bind(path: PathArg, force: bool = False) -> tuple[Path, str | None, str]:
    """Record in the companion of `path` the digest of the weights file `path` (converts a
    checkpoint saved before the binding). The companion must fit the weights' config. Returns
    the companion, the digest it was bound to before (None: it was not bound) and the weights'
    digest it is bound to now. A companion
    already bound to other weights is refused unless `force`; one bound to these is left as it is."""
    loaded = weights.read(path)
    companion = companion_path(path)
    state = adam_state.load(companion, loaded.config)
    if loaded.dtype != state.train_config.dtype:
        raise ValueError(f"{str(companion)!r} holds {state.train_config.dtype} moments, the weights are {loaded.dtype}")
    before = state.weights_sha256
    if before == loaded.digest:
        return companion, before, loaded.digest
    if before is not None and not force:
        raise ValueError(
            f"{str(companion)!r} is already bound to other weights (sha256 {before[:12]}..., the file beside it: "
            f"{loaded.digest[:12]}...): it belongs to another run or to a save that was interrupted; "
            f"refusing to rebind it (--force rebinds it anyway, and --resume would then continue these weights with its moments)"
        )
    files.write_atomically(companion, adam_state.payload(state, loaded.config, loaded.digest))
    return companion, before, loaded.digest
