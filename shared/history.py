"""What a training run produced: per-step losses, epoch means, timing, and the trained model.

`History.to_dict()` is the `--history` JSON schema, identical for every backend:
backend, model_config, train_config, losses (every step), epoch_losses, seconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.config import ModelConfig, TrainConfig
from shared.files import PathArg, read_regular, write_atomically

KEYS = ("backend", "model_config", "train_config", "losses", "epoch_losses", "seconds")
# also written: first_step, the step of losses[0] (0 unless the run resumed a saved one);
# init ("shared", "native" or "file"), and for "file" the source weights file and its sha256
MAX_BYTES = 1 << 30  # a history of a billion-step run is refused rather than read


@dataclass
class History:
    backend: str
    model_config: ModelConfig
    train_config: TrainConfig
    losses: list[float]
    epoch_losses: list[float]
    seconds: float
    first_step: int = 0
    init: str = "shared"
    source: str | None = None  # the weights file the run started from (--load or --resume)
    source_sha256: str | None = None
    compile_seconds: float | None = None  # of `seconds`, spent compiling before the first step (torch's opt-in compile)
    model: Any = field(default=None, repr=False, compare=False)  # the trained TinyLM; not saved
    optimizer: Any = field(default=None, repr=False, compare=False)  # its Adam; not saved

    @property
    def final_loss(self) -> float:
        return self.losses[-1]

    def to_dict(self) -> dict:
        return {
            "backend": self.backend,
            "model_config": self.model_config.to_dict(),
            "train_config": self.train_config.to_dict(),
            "losses": [float(loss) for loss in self.losses],
            "epoch_losses": [float(loss) for loss in self.epoch_losses],
            "seconds": float(self.seconds),
            "first_step": int(self.first_step),
            "init": str(self.init),
            "source": self.source,
            "source_sha256": self.source_sha256,
            "compile_seconds": self.compile_seconds,
        }

    def save(self, path: PathArg) -> None:
        """Write the JSON atomically (temporary file, then rename)."""
        write_atomically(Path(path), json.dumps(self.to_dict(), indent=1).encode())

    @classmethod
    def load(cls, path: PathArg) -> History:
        """Read a --history file with bounded reads; every field type- and range-checked."""
        path = Path(path)
        what = f"history file {str(path)!r}"
        raw = read_regular(path, "history file", MAX_BYTES)
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
            raise ValueError(f"{what} is not readable JSON: {error}") from None
        missing = [key for key in KEYS if not isinstance(data, dict) or key not in data]
        if missing:
            raise ValueError(f"{what} lacks key(s) {missing}; expected {list(KEYS)}")
        try:
            model_config = ModelConfig.from_dict(data["model_config"])
            train_config = TrainConfig.from_dict(data["train_config"])
        except (ValueError, TypeError) as error:
            raise ValueError(f"{what} has an invalid config: {error}") from None
        losses, epoch_losses = (_numbers(data[key], key, what) for key in ("losses", "epoch_losses"))
        if not losses:
            raise ValueError(f"{what}: losses is empty; expected one loss per step")
        first_step = data.get("first_step", 0)
        if type(first_step) is not int or first_step < 0:
            raise ValueError(f"{what}: first_step must be a non-negative integer, got {first_step!r}")
        seconds = data["seconds"]
        if type(seconds) not in (int, float) or not seconds >= 0:
            raise ValueError(f"{what}: seconds must be a non-negative number, got {seconds!r}")
        compile_seconds = data.get("compile_seconds")  # absent from files written before it existed
        if compile_seconds is not None and (type(compile_seconds) not in (int, float) or not 0 <= compile_seconds <= seconds):
            raise ValueError(f"{what}: compile_seconds must be null or a number in [0, seconds], got {compile_seconds!r}")
        init, source = data.get("init", "unknown"), data.get("source")
        if not isinstance(init, str) or not (source is None or isinstance(source, str)):
            raise ValueError(f"{what}: init and source must be strings, got {init!r} and {source!r}")
        return cls(
            backend=str(data["backend"]),
            model_config=model_config,
            train_config=train_config,
            losses=losses,
            epoch_losses=epoch_losses,
            seconds=float(seconds),
            first_step=first_step,
            init=init,
            source=source,
            source_sha256=data.get("source_sha256"),
            compile_seconds=None if compile_seconds is None else float(compile_seconds),
        )


def _numbers(value, key: str, what: str) -> list[float]:
    """A flat list of numbers (NaN and infinity allowed: a diverged run records them)."""
    if not isinstance(value, list) or not all(type(item) in (int, float) for item in value):
        raise ValueError(f"{what}: {key} must be a flat list of numbers")
    return [float(item) for item in value]
