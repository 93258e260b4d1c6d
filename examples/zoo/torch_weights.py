"""The torch side's weights for the zoo: the reference models start from torch's own initializers
and then get norms and BatchNorm statistics that look trained, so that a port which drops one of
them (a scale left at 1, statistics left at 0 and 1) differs; and a state_dict as NumPy arrays,
which is what the converters read."""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

NORMS = (nn.LayerNorm, nn.RMSNorm, nn.modules.batchnorm._BatchNorm)
M = TypeVar("M", bound=nn.Module)


def trained_look(model: M, seed: int) -> M:
    """Every norm's scale 1 + 0.1 N(0, 1) and bias 0.1 N(0, 1), and every BatchNorm's running mean
    0.5 N(0, 1) and variance in [0.5, 1.5), drawn from one seeded generator; returns the model."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        norms: list[Any] = [module for module in model.modules() if isinstance(module, NORMS)]  # weight, bias, statistics by name
        for module in norms:
            for name, center, spread in (("weight", 1.0, 0.1), ("bias", 0.0, 0.1), ("running_mean", 0.0, 0.5)):
                tensor = getattr(module, name, None)
                if tensor is not None:
                    tensor.copy_(center + spread * torch.randn(tensor.shape, generator=generator))
            if getattr(module, "running_var", None) is not None:
                module.running_var.copy_(0.5 + torch.rand(module.running_var.shape, generator=generator))
    return model


def numpy_state(model: nn.Module) -> dict[str, np.ndarray]:
    """model.state_dict() as NumPy arrays, names and layouts unchanged (tied weights appear under
    each of their names, as state_dict lists them)."""
    return {name: value.detach().cpu().numpy().copy() for name, value in model.state_dict().items()}
