"""A small conv encoder in PyTorch whose feature maps have as many channels as rows and columns:
the reference of the zoo's conv pair (convnet_flax.py is its NNX port, convnet_convert.py the
converter).

    images (B, C, S, S) -> conv_in -> ReLU -> conv_wn (weight-normed) -> ReLU
      -> tokens (B, S*S, C) + embed_positions (a sinusoidal table) -> norm -> mean -> head (B, classes)

What a port has to reproduce (examples/zoo/catalog.py):
- C = H = W = 8: NCHW here and NHWC in Flax have one shape, so only what each module is (a
  convolution puts its channels first in torch, last in Flax) says which axis is which.
- conv_wn is torch.nn.utils.parametrizations.weight_norm's: the state_dict holds
  parametrizations.weight.original0 (g, (out, 1, 1, 1)) and original1 (v, (out, in, kH, kW)),
  weight = g v / ||v||, the norm over every axis but the output channels'.
- embed_positions is an nn.Embedding that starts as a sinusoidal table, as the popular library's
  Whisper encoder holds its positions: a fresh port builds the very same table, though every other
  weight of it is random.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from examples.zoo import inputs
from examples.zoo.configs import ConvNetConfig
from examples.zoo.tables import sinusoids
from examples.zoo.torch_weights import trained_look

TINY = ConvNetConfig()


class ConvNet(nn.Module):
    """images (B, C, S, S) -> logits (B, classes)."""

    def __init__(self, config: ConvNetConfig):
        super().__init__()
        C = config.channels
        self.conv_in = nn.Conv2d(C, C, 3, padding=1)
        self.conv_wn = weight_norm(nn.Conv2d(C, C, 3, padding=1), dim=0)
        self.embed_positions = nn.Embedding(config.n_positions, C)
        with torch.no_grad():
            self.embed_positions.weight.copy_(torch.from_numpy(sinusoids(config.n_positions, C)))
        self.norm = nn.LayerNorm(C, eps=config.layer_norm_eps)
        self.head = nn.Linear(C, config.n_classes)

    def forward(self, images):
        x = F.relu(self.conv_wn(F.relu(self.conv_in(images))))  # (B, C, S, S)
        tokens = x.flatten(2).transpose(1, 2)  # (B, S*S, C): positions in row-major order
        positions = self.embed_positions(torch.arange(tokens.shape[1], device=tokens.device))  # (S*S, C)
        return self.head(self.norm(tokens + positions).mean(dim=1))  # (B, classes)


def build(config: ConvNetConfig = TINY, seed: int = 0) -> ConvNet:
    """The reference from `seed`, its norm looking trained."""
    torch.manual_seed(seed)
    return trained_look(ConvNet(config), seed).eval()


def reference():
    """The reference and its NCHW images (5, 8, 8, 8): a factory for `mhsa port-check`."""
    return build(), (inputs.square_images_nchw(TINY),)
