"""TinyLM in PyTorch (embeddings -> attention -> LM head) and its one exchange-format converter."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from shared import checks, weights
from shared.config import ModelConfig
from shared.trace import record
from torch_impl.attention import MultiHeadSelfAttention

DTYPES = {"float32": torch.float32, "float64": torch.float64}


class TinyLM(nn.Module):
    """int tokens (B, T) -> logits (B, T, V). Its state_dict keys are the exchange names."""

    def __init__(self, config: ModelConfig, *, dtype="float32"):
        super().__init__()
        self.config = config
        dtype = DTYPES[dtype]
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model, dtype=dtype)
        self.pos_emb = nn.Embedding(config.max_len, config.d_model, dtype=dtype)
        self.attn = MultiHeadSelfAttention(config.d_model, config.n_heads, config.max_len, config.bias, dtype=dtype,
                                           attn_impl=config.attn_impl)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.bias, dtype=dtype)

    def forward(self, tokens, mask=None, return_weights=False, trace=None):
        """tokens int (B, T) -> logits (B, T, V), or (logits, weights (B, H, T, T))."""
        checks.check_tokens(
            tuple(tokens.shape), str(tokens.dtype), self.config.vocab_size, self.config.max_len,
            *_id_range(tokens),
        )
        T = tokens.shape[1]

        # 1. embed: token identity plus learned position
        positions = torch.arange(T, device=tokens.device)  # (T,)
        x = self.tok_emb(tokens) + self.pos_emb(positions)  # (B, T, D)
        record(trace, "embed", x)

        # 2. attend
        attended = self.attn(x, mask=mask, return_weights=return_weights, trace=trace)
        x, weights = attended if return_weights else (attended, None)  # (B, T, D)

        # 3. read out the next token
        logits = self.lm_head(x)  # (B, T, V)
        record(trace, "logits", logits)
        return (logits, weights) if return_weights else logits


def _id_range(tokens):
    # the smallest and largest id, so that a bad id is named instead of failing deep inside
    if tokens.numel() == 0 or tokens.is_floating_point() or tokens.dtype == torch.bool:
        return None, None
    return int(tokens.min()), int(tokens.max())


def from_exchange(arrays: dict, config: ModelConfig) -> TinyLM:
    """A TinyLM holding the exchange arrays, in their dtype. Everything is checked before
    anything is assigned; torch's layout is the exchange layout, so nothing is transposed."""
    dtype = weights.validate(arrays, config)
    model = TinyLM(config, dtype=dtype)
    model.load_state_dict({name: torch.from_numpy(np.array(value)) for name, value in arrays.items()}, strict=True)
    return model


def to_exchange(model: TinyLM) -> dict[str, np.ndarray]:
    """The model's parameters as exchange arrays (copies, in the model's dtype)."""
    return {name: tensor.detach().cpu().numpy().copy() for name, tensor in model.state_dict().items()}


def grads_to_exchange(model: TinyLM) -> dict[str, np.ndarray]:
    """The .grad of every parameter after loss.backward() as exchange arrays."""
    return {name: parameter.grad.detach().cpu().numpy().copy() for name, parameter in model.named_parameters()}
