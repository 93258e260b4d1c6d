"""Adam's state between backends: the companion file `NAME.adam.safetensors` beside `NAME.safetensors`.

torch.optim.Adam and optax.adam keep the same three things: the first and second moment of
every parameter and the number of steps taken (for bias correction). Stored framework-free:

    exp_avg/<exchange name>     first moment, PyTorch layout, the parameter's shape and dtype
    exp_avg_sq/<exchange name>  second moment, likewise
    metadata: format "mhsa-adam", step, epochs_done, the model config and the train config

so that a run trained for some epochs in one backend continues in the other exactly as if it
had never stopped: same moments, same step count, same remaining batches.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors.numpy

from shared import weights
from shared.config import ModelConfig, TrainConfig
from shared.files import write_atomically

FORMAT = "mhsa-adam"
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

    def check_continues(self, train_config: TrainConfig) -> None:
        """Raise ValueError unless `train_config` continues the run this state came from."""
        changed = [f"{name}={getattr(train_config, name)!r} (saved run: {getattr(self.train_config, name)!r})"
                   for name in STREAM_FIELDS if getattr(train_config, name) != getattr(self.train_config, name)]
        if changed:
            raise ValueError(f"cannot resume: the batches would differ from the saved run's: {', '.join(changed)}")
        if train_config.epochs <= self.epochs_done:
            raise ValueError(f"cannot resume: --epochs {train_config.epochs} is the total and the saved run "
                             f"already trained {self.epochs_done}; ask for more")


def companion_path(weights_path) -> Path:
    """`run.safetensors` -> `run.adam.safetensors`."""
    path = Path(weights_path)
    return path.with_name(f"{path.name.removesuffix('.safetensors')}.adam.safetensors")


def save(path, state: AdamState, model_config: ModelConfig) -> None:
    for moment in MOMENTS:
        weights.validate(getattr(state, moment), model_config, dtype=state.train_config.dtype)
    arrays = {f"{moment}/{name}": np.ascontiguousarray(value)
              for moment in MOMENTS for name, value in getattr(state, moment).items()}
    metadata = {
        "format": FORMAT, "step": str(state.step), "epochs_done": str(state.epochs_done),
        "config": json.dumps(model_config.to_dict()), "train_config": json.dumps(state.train_config.to_dict()),
    }
    write_atomically(Path(path), safetensors.numpy.save(arrays, metadata))


def load(path, model_config: ModelConfig) -> AdamState:
    """Read and validate a companion file against the model it belongs to."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Adam state file {str(path)!r} does not exist (it is written beside the weights by --save)")
    raw = path.read_bytes()
    header = weights.read_header(raw, path)
    metadata = header.get("__metadata__") or {}
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not an Adam state file (metadata format {metadata.get('format')!r}, expected {FORMAT!r})")
    try:
        saved_config = ModelConfig.from_dict(json.loads(metadata["config"]))
        train_config = TrainConfig.from_dict(json.loads(metadata["train_config"]))
        step, epochs_done = int(metadata["step"]), int(metadata["epochs_done"])
    except (KeyError, ValueError, TypeError) as error:
        raise ValueError(f"Adam state file {str(path)!r} has invalid metadata: {error}") from None
    weights.check_same_architecture(saved_config, model_config, source=f"Adam state file {str(path)!r}")
    arrays = safetensors.numpy.load(raw)
    moments = {moment: {key.split("/", 1)[1]: value for key, value in arrays.items() if key.startswith(f"{moment}/")}
               for moment in MOMENTS}
    extra = sorted(key for key in arrays if key.split("/", 1)[0] not in MOMENTS)
    if extra:
        raise ValueError(f"Adam state file {str(path)!r} has unexpected key(s) {extra}")
    for moment in MOMENTS:
        weights.validate(moments[moment], model_config, dtype=train_config.dtype)
    return AdamState(step, epochs_done, moments["exp_avg"], moments["exp_avg_sq"], train_config)
