"""A causal pre-LayerNorm transformer stack in PyTorch whose attention is torch's own
`nn.MultiheadAttention`: the reference of the zoo's head-shaped pair, where each framework's
built-in attention module keeps its weights in a layout of its own (heads_flax.py is the Flax NNX
port with `nnx.MultiHeadAttention`, heads_equinox.py the Equinox port with
`eqx.nn.MultiheadAttention`, heads_convert.py the converters between them).

    x (B, T, D) -> blocks.i: x + attn(ln_1(x)) under the causal mask, x + mlp(ln_2(x)) -> ln_f

What a port has to reproduce, each a classic porting bug (examples/zoo/heads_bugs.py):
- torch packs the three input projections into one `in_proj_weight` (3D, D), rows q, k, v in that
  order, and `in_proj_bias` (3D,); the output projection is `out_proj` (D, D), a Linear that
  MultiheadAttention's forward never calls (F.multi_head_attention_forward reads its weight), so a
  hook sees the attention only at the MultiheadAttention module itself. Within each of q, k, v the
  rows are head-major: row h * d_head + j is channel j of head h.
- Flax's attention holds head-shaped kernels (D, H, d_head) and (H, d_head, D), in (in, out) order;
  Equinox's holds four separate Linears in torch's (out, in) order.
- torch's boolean attn_mask means True = may NOT attend (Flax's and Equinox's: True = may attend).
- In eval mode with autograd off, nn.MultiheadAttention takes a fused fast path
  (torch._native_multi_head_attention): the same function, rounded otherwise (float32: up to 6e-7
  from the autograd path on the example; float64: 9e-16).
- The attention biases are drawn here, not left at torch's zeros, so that a port without one differs.
- LayerNorm eps 1e-5 (torch's default; Flax's is 1e-6), exact (erf) GELU, no dropout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from examples.zoo import inputs
from examples.zoo.configs import _Heads, _positive
from examples.zoo.torch_weights import trained_look

SEQUENCE = 5  # the example's sequence length: odd, and not d_head (6), H (4) or B (3)


@dataclass(frozen=True)
class HeadsConfig(_Heads):
    """A causal pre-LayerNorm stack whose attention is each framework's built-in multi-head module."""

    d_model: int = 24
    n_heads: int = 4  # d_head 6: 1/d and 1/sqrt(d) differ, and H != d_head, so the head axes cannot swap unseen
    d_mlp: int = 44
    n_layers: int = 2
    layer_norm_eps: float = 1e-5  # torch's LayerNorm default; Flax's is 1e-6

    def __post_init__(self):
        _positive(self)
        self._check_heads()


TINY = HeadsConfig()


class MLP(nn.Module):
    """(B, T, D) -> (B, T, D): fc, exact GELU, proj."""

    def __init__(self, config: HeadsConfig):
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.d_mlp)
        self.act = nn.GELU()  # approximate="none": the erf form
        self.proj = nn.Linear(config.d_mlp, config.d_model)

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))  # (B, T, D)


class Block(nn.Module):
    """(B, T, D), blocked (T, T) bool (True = may not attend) -> (B, T, D): pre-LayerNorm
    attention and MLP, each with a residual."""

    def __init__(self, config: HeadsConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.attn = nn.MultiheadAttention(config.d_model, config.n_heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, blocked):
        h = self.ln_1(x)  # (B, T, D)
        x = x + self.attn(h, h, h, attn_mask=blocked, need_weights=False)[0]  # (B, T, D); [1] is None
        return x + self.mlp(self.ln_2(x))  # (B, T, D)


class HeadsStack(nn.Module):
    """x (B, T, D) float -> (B, T, D): causal blocks and a final LayerNorm."""

    def __init__(self, config: HeadsConfig = TINY):
        super().__init__()
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, x):
        T = x.shape[1]
        blocked = torch.ones(T, T, dtype=torch.bool).triu(1)  # (T, T): True above the diagonal = a later key
        for block in self.blocks:
            x = block(x, blocked)
        return self.ln_f(x)  # (B, T, D)


def attention_biases(model: HeadsStack, seed: int) -> HeadsStack:
    """Every attention's in_proj_bias and out_proj.bias 0.1 N(0, 1), from one seeded generator:
    torch initializes both at 0, where a port that drops one would still agree."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in model.blocks:
            for bias in (block.attn.in_proj_bias, block.attn.out_proj.bias):
                bias.copy_(0.1 * torch.randn(bias.shape, generator=generator))
    return model


def build(config: HeadsConfig = TINY, seed: int = 0) -> HeadsStack:
    """The reference in eval mode: torch's initializers from `seed`, norms and attention biases that look trained."""
    torch.manual_seed(seed)
    model = HeadsStack(config)
    return attention_biases(trained_look(model, seed), seed + 1).eval()


def example_inputs(config: HeadsConfig = TINY, seed: int = 6, batch: int = inputs.B) -> tuple[np.ndarray]:
    """(x (3, 5, 24) float32,): N(0, 1) activations, the same array for every side."""
    return (np.random.default_rng(seed).standard_normal((batch, SEQUENCE, config.d_model)).astype(np.float32),)


def reference():
    """The reference and (x,): a factory for `mhsa port-check`."""
    return build(), example_inputs()
