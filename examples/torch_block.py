"""A standard pre-LayerNorm transformer block in PyTorch: x + attn(ln1(x)), then x + mlp(ln2(x)),
with this project's attention block and an MLP with exact GELU; and factories for `mhsa
port-check` (each returns (model, example inputs)). Its Flax twin is examples/flax_block.py."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from shared.config import ModelConfig
from shared.weights import init_weights
from torch_impl.attention import MultiHeadSelfAttention
from torch_impl.model import from_exchange

# odd, distinct sizes, so that a swapped axis cannot pass
B, T, D, H = 3, 5, 24, 4


class MLP(nn.Module):
    """(B, T, D) -> (B, T, D): widen 4x, exact GELU, narrow, dropout."""

    def __init__(self, d_model, dropout=0.1):
        super().__init__()
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()  # exact erf; jax.nn.gelu defaults to the tanh approximation
        self.fc2 = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.fc2(self.act(self.fc1(x))))  # (B, T, D)


class Block(nn.Module):
    """(B, T, D) -> (B, T, D): pre-LayerNorm attention and MLP, each with a residual."""

    def __init__(self, d_model=D, n_heads=H, max_len=T, dropout=0.1):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)  # eps 1e-5
        self.attn = MultiHeadSelfAttention(d_model, n_heads, max_len)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))  # (B, T, D)
        return x + self.mlp(self.ln2(x))  # (B, T, D)


def example_inputs(seed=0) -> np.ndarray:
    """(B, T, D) float32 activations."""
    return np.random.default_rng(seed).standard_normal((B, T, D)).astype(np.float32)


def block():
    """The block in eval mode (dropout off) and an input batch: a factory for `mhsa port-check`."""
    torch.manual_seed(0)
    return Block().eval(), example_inputs()


TINY = ModelConfig(vocab_size=11, d_model=24, n_heads=4, max_len=7)


def tinylm():
    """This project's TinyLM from shared.weights.init_weights and a batch of token ids (3, 7)."""
    tokens = np.random.default_rng(0).integers(0, TINY.vocab_size, (3, TINY.max_len))
    return from_exchange(init_weights(TINY, seed=0), TINY), tokens
