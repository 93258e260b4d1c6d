"""A small VAE-decoder-like block in PyTorch, its attention written as the popular diffusion
library writes its VAE's: the reference of the zoo's "vae" pair (vae_flax.py is its NNX port,
vae_convert.py the converter).

    images (B, C_in, H, W) -> conv_in -> attn -> SiLU -> conv_out -> (B, C_out, H, W)
    attn: x (B, C, H, W) -> group_norm over x.view(B, C, H*W) -> (B, H*W, C) -> to_q, to_k, to_v
          -> attention over the H*W positions -> to_out -> back to (B, C, H, W), + x

What a port has to reproduce, each a classic porting bug (examples/zoo/catalog.py):
- GroupNorm sees (B, C, H*W) here and (B, H, W, C) in the Flax twin: the same statistics (each
  group's channels over every position), in another layout, at one module boundary.
- GroupNorm eps 1e-6, as the library's VAE sets it: torch's default is 1e-5, Flax's 1e-6.
- Positions flattened row-major, p = h*W + w, on both sides; a port that flattens W before H, and
  unflattens row-major, hands every pixel another pixel's attention output (H = 5 != W = 7).
- The residual is added after to_out; conv weights (out, in, kH, kW) against Flax's (kH, kW, in,
  out), which a reshape instead of a transpose also fills without a shape error.
- Images NCHW here, NHWC in Flax: the factories hand each side its own layout of the same batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from examples.zoo.configs import _positive

M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class VAEConfig:
    """A conv in, the VAE's attention block, a conv out; attention over every pixel of the map."""

    in_channels: int = 4  # a latent's channels
    channels: int = 12
    out_channels: int = 6
    groups: int = 4  # GroupNorm's: 3 channels a group
    n_heads: int = 1  # the VAE's single head, d_head = channels
    group_norm_eps: float = 1e-6  # the library's VAE; torch's GroupNorm default is 1e-5, Flax's 1e-6
    batch: int = 3
    height: int = 5
    width: int = 7  # not the height: positions flattened in the wrong order cannot pass

    def __post_init__(self):
        _positive(self)
        if self.channels % self.groups or self.channels % self.n_heads:
            raise ValueError(f"channels must be a multiple of groups and of n_heads; got {self.channels}, {self.groups}, {self.n_heads}")
        sizes = {"batch": self.batch, "in_channels": self.in_channels, "channels": self.channels, "out_channels": self.out_channels}
        sizes |= {"height": self.height, "width": self.width, "positions": self.height * self.width}
        if len(set(sizes.values())) < len(sizes):
            raise ValueError(f"the feature maps' axes must have distinct sizes, so that no swap passes; got {sizes}")

    @property
    def d_head(self) -> int:
        return self.channels // self.n_heads


TINY = VAEConfig()


class AttentionBlock(nn.Module):
    """(B, C, H, W) -> (B, C, H, W): GroupNorm, attention over the H*W positions, a residual."""

    def __init__(self, config: VAEConfig):
        super().__init__()
        C = config.channels
        self.n_heads, self.d_head = config.n_heads, config.d_head
        self.group_norm = nn.GroupNorm(config.groups, C, eps=config.group_norm_eps)
        self.to_q, self.to_k, self.to_v = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)
        self.to_out = nn.Linear(C, C)

    def heads(self, x):
        """(B, N, C) -> (B, heads, N, d_head)."""
        B, N, _ = x.shape
        return x.view(B, N, self.n_heads, self.d_head).transpose(1, 2)

    def forward(self, x):
        B, C, H, W = x.shape
        h = self.group_norm(x.view(B, C, H * W)).transpose(1, 2)  # (B, H*W, C): position p = h*W + w
        q, k, v = self.heads(self.to_q(h)), self.heads(self.to_k(h)), self.heads(self.to_v(h))  # (B, heads, H*W, d_head)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.d_head)  # (B, heads, H*W, H*W)
        context = scores.softmax(dim=-1) @ v  # (B, heads, H*W, d_head)
        out = self.to_out(context.transpose(1, 2).reshape(B, H * W, C))  # (B, H*W, C)
        return x + out.transpose(1, 2).reshape(B, C, H, W)  # (B, C, H, W)


class Decoder(nn.Module):
    """images (B, C_in, H, W) -> (B, C_out, H, W)."""

    def __init__(self, config: VAEConfig):
        super().__init__()
        self.conv_in = nn.Conv2d(config.in_channels, config.channels, 3, padding=1)
        self.attn = AttentionBlock(config)
        self.conv_out = nn.Conv2d(config.channels, config.out_channels, 3, padding=1)

    def forward(self, images):
        return self.conv_out(F.silu(self.attn(self.conv_in(images))))  # (B, C_out, H, W)


def trained_group_norms(model: M, seed: int) -> M:
    """Every GroupNorm's scale 1 + 0.1 N(0, 1) and bias 0.1 N(0, 1) (torch_weights.trained_look
    does LayerNorm, RMSNorm and BatchNorm only): a port that drops either differs. Returns the model."""
    generator = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.GroupNorm):
                module.weight.copy_(1.0 + 0.1 * torch.randn(module.weight.shape, generator=generator))
                module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=generator))
    return model


def build(config: VAEConfig = TINY, seed: int = 0) -> Decoder:
    """The reference in eval mode: torch's initializers from `seed`, a GroupNorm that looks trained."""
    torch.manual_seed(seed)
    return trained_group_norms(Decoder(config), seed).eval()


def images_nchw(config: VAEConfig = TINY, seed: int = 7) -> np.ndarray:
    """(B, C_in, H, W) float32, N(0, 1): torch's layout."""
    return np.random.default_rng(seed).standard_normal((config.batch, config.in_channels, config.height, config.width)).astype(np.float32)


def images_nhwc(config: VAEConfig = TINY, seed: int = 7) -> np.ndarray:
    """(B, H, W, C_in) float32: the same images in Flax's layout."""
    return np.ascontiguousarray(images_nchw(config, seed).transpose(0, 2, 3, 1))


def reference():
    """The reference and its NCHW images: a factory for `mhsa port-check`."""
    return build(), (images_nchw(TINY),)
