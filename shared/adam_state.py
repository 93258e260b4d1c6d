"""Adam's state between backends: the companion file `NAME.adam.safetensors` beside `NAME.safetensors`.

torch.optim.Adam and optax.adam keep the same three things: the first and second moment of
every parameter and the number of steps taken (for bias correction). Stored framework-free:

    exp_avg/<exchange name>     first moment, PyTorch layout, the parameter's shape and dtype
    exp_avg_sq/<exchange name>  second moment, likewise
    metadata: format "mhsa-adam", format_version "2", step, epochs_done, the model config,
              the train config, and weights_sha256: the SHA-256 of the weights file's bytes

so that a run trained for some epochs in one backend continues in the other exactly as if it
had never stopped: same moments, same step count, same remaining batches.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy

from shared import weights
from shared.config import ModelConfig, TrainConfig
from shared.files import PathArg, write_atomically
from shared.words import plural

FORMAT = "mhsa-adam"
FORMAT_VERSION = "2"  # 2: records weights_sha256, the digest of the weights file it belongs to
MOMENTS = ("exp_avg", "exp_avg_sq")
# what must not change between the saved run and its continuation: they decide the batches
STREAM_FIELDS = ("n_sequences", "batch_size", "seed", "dtype")


@dataclass
class AdamState:
    step: int  # Adam updates taken so far
    epochs_done: int
    exp_avg: dict[str, np.ndarray]
    exp_avg_sq: dict[str, np.ndarray]
    train_config: TrainConfig
    weights_sha256: str | None = None  # read from a companion: the digest of the weights it is bound to (None: not bound)

    def check_continues(self, train_config: TrainConfig) -> None:
        """Raise ValueError unless `train_config` continues the run this state came from."""
        changed = [
            f"{name}={getattr(train_config, name)!r} (saved run: {getattr(self.train_config, name)!r})"
            for name in STREAM_FIELDS
            if getattr(train_config, name) != getattr(self.train_config, name)
        ]
        if changed:
            raise ValueError(f"cannot resume: the batches would differ from the saved run's: {', '.join(changed)}")
        if train_config.epochs <= self.epochs_done:
            raise ValueError(
                f"cannot resume: --epochs {train_config.epochs} is the total and the saved run already trained {self.epochs_done}; ask for more"
            )


def companion_path(weights_path: PathArg) -> Path:
    """`run.safetensors` -> `run.adam.safetensors`."""
    path = Path(weights_path)
    return path.with_name(f"{path.name.removesuffix('.safetensors')}.adam.safetensors")


def save(path: PathArg, state: AdamState, model_config: ModelConfig, weights_digest: str | None = None) -> None:
    """Write the companion file atomically. weights_digest: the SHA-256 of the weights file
    it belongs to (shared.checkpoint.save passes it; --resume refuses a file without it)."""
    for moment in MOMENTS:
        weights.validate(getattr(state, moment), model_config, dtype=state.train_config.dtype)
    write_atomically(Path(path), payload(state, model_config, weights_digest))


def payload(state: AdamState, model_config: ModelConfig, weights_digest: str | None) -> bytes:
    arrays = {f"{moment}/{name}": np.ascontiguousarray(value) for moment in MOMENTS for name, value in getattr(state, moment).items()}
    metadata = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "step": str(state.step),
        "epochs_done": str(state.epochs_done),
        "config": json.dumps(model_config.to_dict()),
        "train_config": json.dumps(state.train_config.to_dict()),
    }
    if weights_digest is not None:
        metadata["weights_sha256"] = weights_digest
    return safetensors.numpy.save(arrays, metadata)


def load(path: PathArg, model_config: ModelConfig, weights_digest: str | None = None) -> AdamState:
    """Read and validate a companion file against the model it belongs to, with the bounded
    reads of shared.weights. With weights_digest (the SHA-256 of the weights file beside it),
    a companion that records another digest, or none, is refused: the pair does not belong
    together (a save killed between its two files, or a file copied from another run)."""
    path = Path(path)
    what = f"Adam state file {str(path)!r}"
    found: dict[str, Any] = {}

    def check(header: dict) -> None:
        metadata = header.get("__metadata__") or {}
        if metadata.get("format") != FORMAT:
            raise ValueError(f"{str(path)!r} is not an Adam state file (metadata format {metadata.get('format')!r}, expected {FORMAT!r})")
        saved_config = weights.config_from_metadata(metadata, what)
        try:
            train_config = TrainConfig.from_dict(json.loads(metadata["train_config"]))
            step, epochs_done = _count(metadata, "step"), _count(metadata, "epochs_done")
        except (KeyError, ValueError, TypeError) as error:
            raise ValueError(f"{what} has invalid metadata: {error}") from None
        if epochs_done > train_config.epochs:
            raise ValueError(f"{what} has invalid metadata: epochs_done={epochs_done} is more than the run's epochs={train_config.epochs}")
        if step != epochs_done * train_config.steps_per_epoch:
            raise ValueError(
                f"{what} has invalid metadata: step={step} does not match epochs_done={epochs_done} "
                f"x {plural(train_config.steps_per_epoch, 'step')} per epoch = {epochs_done * train_config.steps_per_epoch}"
            )
        weights.check_same_architecture(saved_config, model_config, source=what)
        layout = weights.tensor_layout(header)
        extra = sorted(key for key in layout if key.split("/", 1)[0] not in MOMENTS)
        if extra:
            raise ValueError(f"{what} has unexpected key(s) {extra}")
        for moment in MOMENTS:
            part = {key.split("/", 1)[1]: value for key, value in layout.items() if key.startswith(f"{moment}/")}
            try:
                weights.check_layout(part, model_config, dtype=train_config.dtype)
            except ValueError as error:
                raise ValueError(f"{what}: {moment} {error}") from None
        if weights_digest is not None:
            recorded = metadata.get("weights_sha256")
            if recorded is None:
                raise ValueError(
                    f"{what} does not record which weights file it belongs to (written before "
                    f"checkpoints were bound); if it belongs to the weights beside it, bind it with "
                    f"`mhsa bind WEIGHTS.safetensors`, then resume"
                )
            if recorded != weights_digest:
                raise ValueError(
                    f"{what} belongs to other weights than the file beside it (its weights_sha256 "
                    f"{recorded[:12]}..., the weights' {weights_digest[:12]}...): a save was interrupted "
                    f"between its two files, or the file comes from another run; refusing to resume"
                )
        found.update(train_config=train_config, step=step, epochs_done=epochs_done, weights_sha256=metadata.get("weights_sha256"))

    raw, _ = weights.read_safetensors(path, "Adam state file", check)
    arrays = weights.decode(raw, what)
    moments = {moment: {key.split("/", 1)[1]: value for key, value in arrays.items() if key.startswith(f"{moment}/")} for moment in MOMENTS}
    return AdamState(found["step"], found["epochs_done"], moments["exp_avg"], moments["exp_avg_sq"], found["train_config"], found["weights_sha256"])


def _count(metadata: dict, key: str) -> int:
    text = metadata[key]
    if not re.fullmatch(r"[0-9]{1,12}", text):
        raise ValueError(f"{key}={text!r} is not a non-negative integer")
    return int(text)
