"""A small convolutional ViT in PyTorch: the reference of the zoo's third pair (vit_flax.py is its
NNX port, vit_convert.py the converter).

    images (B, C, H, W) -> stem: down(relu(bn(conv(x)))) -> patch_embed (conv, stride = patch)
      -> tokens (B, N, D) + pos_embed -> blocks.i (pre-LayerNorm, timm's layout) -> norm
      -> mean over the tokens -> head -> logits (B, classes)

What a port has to reproduce, each a classic porting bug (examples/zoo/catalog.py):
- Conv weights (out, in, kH, kW) against Flax's (kH, kW, in, out): a converter that reverses all
  four axes also swaps kH and kW, which no shape check sees on a square kernel.
- Images NCHW here, NHWC in Flax: the factories hand each side its own layout of the same batch.
- The stem's padding=1 (3x3, stride 1) is 'SAME' in Flax: equal for every image size at stride 1.
  Its downsampling conv (3x3, stride 2, padding=1) is not: at stride 2 'SAME' pads by the input's
  size, (0, 1) on an even one (the images are 18 x 30), where padding=1 pads (1, 1) on every size.
- BatchNorm in eval mode normalizes with its running statistics: they are weights to convert, and
  momentum 0.1 here (the weight of the new batch) is Flax's momentum 0.9 (that of the old average).
- Every conv and linear layer has a bias; attention over all tokens (no mask), softmax over keys;
  LayerNorm eps 1e-6 as timm's ViT sets it.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from examples.zoo import inputs
from examples.zoo.configs import ViTConfig
from examples.zoo.torch_weights import trained_look

TINY = ViTConfig()


class Stem(nn.Module):
    """(B, C, H, W) -> (B, S, ceil(H / 2), ceil(W / 2)): a 3x3 conv, BatchNorm, ReLU, a 3x3 conv of stride 2."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.conv = nn.Conv2d(config.in_channels, config.stem_channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(config.stem_channels, eps=config.batch_norm_eps, momentum=0.1)
        self.down = nn.Conv2d(config.stem_channels, config.stem_channels, 3, stride=2, padding=1)

    def forward(self, x):
        return self.down(F.relu(self.bn(self.conv(x))))  # (B, S, ceil(H / 2), ceil(W / 2))


class Attention(nn.Module):
    """(B, N, D) -> (B, N, D): multi-head attention over all tokens, one fused projection qkv."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.n_heads, self.d_head = config.n_heads, config.d_model // config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def weights(self, scores):
        """(B, H, N, N) -> attention weights: a softmax over the keys, the last axis."""
        return scores.softmax(dim=-1)

    def forward(self, x):
        B, N, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)  # 3 x (B, N, D)
        q, k, v = (t.view(B, N, self.n_heads, self.d_head).transpose(1, 2) for t in (q, k, v))  # (B, H, N, d_head)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, H, N, N)
        context = self.weights(scores) @ v  # (B, H, N, d_head)
        return self.proj(context.transpose(1, 2).reshape(B, N, D))  # (B, N, D)


class MLP(nn.Module):
    """(B, N, D) -> (B, N, D): widen, exact GELU, narrow."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.d_mlp)
        self.act = nn.GELU()  # exact erf
        self.fc2 = nn.Linear(config.d_mlp, config.d_model)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))  # (B, N, D)


class Block(nn.Module):
    """(B, N, D) -> (B, N, D): pre-LayerNorm attention and MLP, each with a residual."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.attn = Attention(config)
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))  # (B, N, D)
        return x + self.mlp(self.norm2(x))  # (B, N, D)


class ConvViT(nn.Module):
    """images (B, C, H, W) -> logits (B, classes)."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.stem = Stem(config)
        self.patch_embed = nn.Conv2d(config.stem_channels, config.d_model, config.patch, stride=config.patch)
        self.pos_embed = nn.Parameter(0.1 * torch.randn(1, config.n_patches, config.d_model))
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.head = nn.Linear(config.d_model, config.n_classes)

    def forward(self, images):
        x = self.patch_embed(self.stem(images))  # (B, D, H / (2 patch), W / (2 patch))
        x = x.flatten(2).transpose(1, 2) + self.pos_embed  # (B, N, D): patches in row-major order
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))  # (B, classes)


def build(config: ViTConfig = TINY, seed: int = 0) -> ConvViT:
    """The reference in eval mode (BatchNorm on its running statistics), from `seed`, with norms and
    statistics that look trained."""
    torch.manual_seed(seed)
    return trained_look(ConvViT(config), seed).eval()


def example_inputs(config: ViTConfig = TINY) -> tuple[np.ndarray]:
    """(images (5, C, H, W),) in torch's NCHW."""
    return (inputs.images_nchw(config),)


def reference():
    """The reference and its NCHW images: a factory for `mhsa port-check`."""
    return build(), example_inputs()
