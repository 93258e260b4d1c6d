"""The one config for every backend and every CLI: frozen dataclasses, validated on creation."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from shared import checks

DTYPES = ("float32", "float64")
ATTN_IMPLS = ("explicit", "fused")


def _check_positive_int(owner: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}.{name} must be an int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive integer, got {value}")


def _check_choice(owner: str, name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{owner}.{name} must be one of {', '.join(choices)}; got {value!r}")


def _from_dict(cls, data: dict):
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} expects a dict, got {type(data).__name__}")
    names = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}; expected a subset of {sorted(names)}")
    return cls(**data)


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of `TinyLM`: tok_emb (V, D) + pos_emb (max_len, D) -> attention (H heads) -> lm_head (D, V)."""

    vocab_size: int = 64
    d_model: int = 32
    n_heads: int = 4
    max_len: int = 12
    bias: bool = True
    attn_impl: str = "explicit"  # "fused" calls the framework's attention kernel when weights are not requested

    def __post_init__(self) -> None:
        _check_positive_int("ModelConfig", "vocab_size", self.vocab_size)
        checks.check_block(self.d_model, self.n_heads, self.max_len)
        if not isinstance(self.bias, bool):
            raise TypeError(f"ModelConfig.bias must be a bool, got {self.bias!r}")
        _check_choice("ModelConfig", "attn_impl", self.attn_impl, ATTN_IMPLS)

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        return _from_dict(cls, data)


@dataclass(frozen=True)
class TrainConfig:
    """How the copy task is trained. Rows fill the model's context: T = ModelConfig.max_len.

    The defaults (3 epochs of 64 Adam steps, lr 1e-2) take the loss from log(64) ~ 4.16 to
    below 0.1 in the last epoch, in both backends.
    """

    epochs: int = 3
    batch_size: int = 32
    n_sequences: int = 2048
    lr: float = 1e-2
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "n_sequences"):
            _check_positive_int("TrainConfig", name, getattr(self, name))
        checks.check_seed(self.seed, "TrainConfig.seed")  # one range for every backend
        for name in ("lr", "eps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"TrainConfig.{name} must be a positive finite number, got {value!r}")
        betas = tuple(self.betas)
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"TrainConfig.betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        object.__setattr__(self, "lr", float(self.lr))
        object.__setattr__(self, "eps", float(self.eps))
        _check_choice("TrainConfig", "dtype", self.dtype, DTYPES)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.n_sequences / self.batch_size)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["betas"] = list(self.betas)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        return _from_dict(cls, data)
