"""A stack of nanoGPT-style causal self-attention blocks in PyTorch, with one fused q/k/v
projection: the reference of the zoo's "fused" pair (fused_flax.py is its NNX port, which keeps
that projection head-shaped, fused_convert.py the converter between them).

    x (B, T, D) -> blocks.i: x + attn(ln_1(x)), x + mlp(ln_2(x)) -> ln_f -> (B, T, D)
    attn: qkv (B, T, 3D) viewed as (B, T, 3, H, d_head) -> q, k, v -> causal softmax -> proj

What a port has to reproduce, each a classic porting bug (examples/zoo/catalog.py):
- The fused projection's output axis is (3, H, d_head), row-major: all of q's heads, then all of
  k's, then v's (GPT-2's and nanoGPT's layout). GPT-NeoX and Megatron fuse per head, (H, 3,
  d_head): a converter written for one reads the other's checkpoint without a shape error.
- The port's projections are head-shaped (fused_flax.py): qkv's kernel (D, 3, H, d_head) is the
  weight (3D, D) transposed, then reshaped; proj's kernel (H, d_head, D) the weight (D, D)
  transposed, then reshaped with the heads major. Reshaped before the transpose, or with the axes
  in another order, the same numbers fit the same shapes.
- Scores scaled by 1/sqrt(d_head) (d_head = 6: 1/d differs), under a causal mask (T = 5).
- LayerNorm eps 1e-5, torch's default (Flax's is 1e-6); exact (erf) GELU, torch's nn.GELU.

The input is a float (B, T, D) batch, the same numbers on both sides; every size is odd or
distinct from the others (B = 2 is not the fused axis's 3), so a swapped axis cannot pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from examples.zoo.configs import _positive
from examples.zoo.torch_weights import trained_look


@dataclass(frozen=True)
class FusedConfig:
    """Causal self-attention blocks with a fused q/k/v projection, the nanoGPT block."""

    d_model: int = 24
    n_heads: int = 4  # d_head 6: 1/d and 1/sqrt(d) differ, and H != d_head, so the head axes cannot swap unseen
    d_mlp: int = 44
    n_layers: int = 2
    layer_norm_eps: float = 1e-5  # torch's LayerNorm default; Flax's is 1e-6
    batch: int = 2  # the example batch's rows: not 3, the fused axis's size
    length: int = 5  # T

    def __post_init__(self):
        _positive(self)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model must be a multiple of n_heads; got {self.d_model}, {self.n_heads}")
        sizes = {"batch": self.batch, "length": self.length, "n_heads": self.n_heads, "d_head": self.d_head, "3 (q, k, v)": 3}
        if len(set(sizes.values())) < len(sizes):
            raise ValueError(f"the axes of qkv's output (B, T, 3, H, d_head) must have distinct sizes, so that no swap passes; got {sizes}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


TINY = FusedConfig()


class CausalSelfAttention(nn.Module):
    """(B, T, D) -> (B, T, D): causal multi-head attention, one fused projection qkv, as nanoGPT writes it."""

    def __init__(self, config: FusedConfig):
        super().__init__()
        self.n_heads, self.d_head = config.n_heads, config.d_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.scale = 1.0 / math.sqrt(config.d_head)

    def keep(self, T: int) -> torch.Tensor:
        """(T, T) bool, True = query t may attend to key s (s <= t)."""
        return torch.ones(T, T, dtype=torch.bool).tril()

    def forward(self, x):
        B, T, D = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_heads, self.d_head)  # (B, T, 3, H, d_head)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, d_head)
        scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, T, T)
        scores = scores.masked_fill(~self.keep(T), torch.finfo(scores.dtype).min)
        context = scores.softmax(dim=-1) @ v  # (B, H, T, d_head)
        return self.proj(context.transpose(1, 2).reshape(B, T, D))  # (B, T, D): heads major, as qkv's view splits them


class MLP(nn.Module):
    """(B, T, D) -> (B, T, D): widen, exact GELU, narrow."""

    def __init__(self, config: FusedConfig):
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.d_mlp)
        self.act = nn.GELU()  # exact erf
        self.proj = nn.Linear(config.d_mlp, config.d_model)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))  # (B, T, D)


class Block(nn.Module):
    """(B, T, D) -> (B, T, D): pre-LayerNorm attention and MLP, each with a residual."""

    def __init__(self, config: FusedConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))  # (B, T, D)
        return x + self.mlp(self.ln_2(x))  # (B, T, D)


class Decoder(nn.Module):
    """x (B, T, D) -> (B, T, D): the blocks, then a final LayerNorm."""

    def __init__(self, config: FusedConfig):
        super().__init__()
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)  # (B, T, D)


def build(config: FusedConfig = TINY, seed: int = 0) -> Decoder:
    """The reference in eval mode: torch's initializers from `seed`, LayerNorms that look trained."""
    torch.manual_seed(seed)
    return trained_look(Decoder(config), seed).eval()


def example_inputs(config: FusedConfig = TINY, seed: int = 6) -> tuple[np.ndarray]:
    """(x (B, T, D) float32,): N(0, 1), the same numbers for both frameworks (no layout differs)."""
    return (np.random.default_rng(seed).standard_normal((config.batch, config.length, config.d_model)).astype(np.float32),)


def reference():
    """The reference and its (B, T, D) batch: a factory for `mhsa port-check`."""
    return build(), example_inputs()
