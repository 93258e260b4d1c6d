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
from shared.files import write_atomically

KEYS = ("backend", "model_config", "train_config", "losses", "epoch_losses", "seconds")
# also written: first_step, the step of losses[0] (0 unless the run resumed a saved one)


@dataclass
class History:
    backend: str
    model_config: ModelConfig
    train_config: TrainConfig
    losses: list[float]
    epoch_losses: list[float]
    seconds: float
    first_step: int = 0
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
        }

    def save(self, path) -> None:
        """Write the JSON atomically (temporary file, then rename)."""
        write_atomically(Path(path), json.dumps(self.to_dict(), indent=1).encode())

    @classmethod
    def load(cls, path) -> "History":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"history file {str(path)!r} does not exist") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"history file {str(path)!r} is not readable JSON: {error}") from None
        missing = [key for key in KEYS if not isinstance(data, dict) or key not in data]
        if missing:
            raise ValueError(f"history file {str(path)!r} lacks key(s) {missing}; expected {list(KEYS)}")
        return cls(
            backend=data["backend"],
            model_config=ModelConfig.from_dict(data["model_config"]),
            train_config=TrainConfig.from_dict(data["train_config"]),
            losses=[float(loss) for loss in data["losses"]],
            epoch_losses=[float(loss) for loss in data["epoch_losses"]],
            seconds=float(data["seconds"]),
            first_step=int(data.get("first_step", 0)),
        )
