"""A Llama-style decoder in PyTorch, the reference of the zoo's first pair (llama_flax.py is its
Flax NNX port, llama_convert.py the converter between them).

    embed_tokens -> layers.i: x + self_attn(input_layernorm(x)), x + mlp(post_attention_layernorm(x))
                 -> norm -> logits = h @ embed_tokens.weight^T (tied)

What a port has to reproduce, each a classic porting bug (examples/zoo/catalog.py):
- RMSNorm eps from the config (1e-5): torch's nn.RMSNorm defaults to the dtype's machine epsilon,
  Flax's to 1e-6.
- Rotary embeddings over the two halves of each head (`rotate_half`: channel i turns with channel
  i + d_head/2, the convention of GPT-NeoX and most ports), not over adjacent pairs (Meta's original
  code); a checkpoint in one convention is wrong in the other unless q and k rows are permuted.
- Grouped-query attention: kv head j serves query heads j*g .. j*g + g - 1 (g = n_heads //
  n_kv_heads, repeat_interleave), not j, j + n_kv_heads, ... (tile).
- attention_mask (B, T): 1 = a real token, 0 = padding, ANDed with the causal mask. A masked score
  becomes the dtype's most negative finite value, not -inf, so a row without an allowed key gets
  uniform weights instead of NaN (as in the popular library).
- The output layer is the token embedding (tied): one parameter with two uses, one gradient.
- No bias anywhere; SwiGLU MLP down(silu(gate(x)) * up(x)).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from examples.zoo import inputs
from examples.zoo.configs import LlamaConfig, llama_3_2_1b
from examples.zoo.torch_weights import trained_look

TINY = LlamaConfig()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., d_head) -> (..., d_head): (x1, x2) -> (-x2, x1) over the two halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class Rotary(nn.Module):
    """(B, heads, T, d_head) -> the same, rotated: at position t, channels i and i + d_head/2
    turn together by the angle t * base^(-2i/d_head)."""

    def __init__(self, d_head: int, base: float):
        super().__init__()
        self.d_head, self.base = d_head, base

    def forward(self, x):
        T = x.shape[-2]
        inv_freq = self.base ** (-torch.arange(0, self.d_head, 2, dtype=x.dtype) / self.d_head)  # (d_head/2,)
        angles = torch.arange(T, dtype=x.dtype)[:, None] * inv_freq  # (T, d_head/2)
        angles = torch.cat([angles, angles], dim=-1)  # (T, d_head): each half turns by the same angles
        return x * angles.cos() + rotate_half(x) * angles.sin()


class Attention(nn.Module):
    """(B, T, D), keep (B, 1, T, T) -> (B, T, D): causal grouped-query attention with rotary q and k."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = config.n_heads, config.n_kv_heads, config.d_head
        self.q_proj = nn.Linear(config.d_model, config.n_heads * config.d_head, bias=False)
        self.k_proj = nn.Linear(config.d_model, config.n_kv_heads * config.d_head, bias=False)
        self.v_proj = nn.Linear(config.d_model, config.n_kv_heads * config.d_head, bias=False)
        self.o_proj = nn.Linear(config.n_heads * config.d_head, config.d_model, bias=False)
        self.rotary = Rotary(config.d_head, config.rope_base)

    def repeat_kv(self, x):
        """(B, n_kv_heads, T, d_head) -> (B, n_heads, T, d_head): kv head j serves query heads j*g .. j*g + g - 1."""
        return x.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)

    def forward(self, x, keep):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.d_head).transpose(1, 2)  # (B, KV, T, d_head)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.d_head).transpose(1, 2)  # (B, KV, T, d_head)
        q, k = self.rotary(q), self.rotary(k)
        k, v = self.repeat_kv(k), self.repeat_kv(v)  # (B, H, T, d_head)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B, H, T, T)
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        context = scores.softmax(dim=-1) @ v  # (B, H, T, d_head)
        return self.o_proj(context.transpose(1, 2).reshape(B, T, self.n_heads * self.d_head))  # (B, T, D)


class MLP(nn.Module):
    """(B, T, D) -> (B, T, D): SwiGLU, down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.down_proj = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # (B, T, D)


class DecoderLayer(nn.Module):
    """(B, T, D), keep -> (B, T, D): pre-RMSNorm attention and MLP, each with a residual."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.d_model, eps=config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.d_model, eps=config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, keep):
        x = x + self.self_attn(self.input_layernorm(x), keep)  # (B, T, D)
        return x + self.mlp(self.post_attention_layernorm(x))  # (B, T, D)


class Llama(nn.Module):
    """input_ids (B, T), attention_mask (B, T) or None -> logits (B, T, V)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(config.d_model, eps=config.rms_norm_eps)

    def attention_keep(self, attention_mask, T):
        """(B, T) 1 = token, 0 = padding, or None -> (B, 1, T, T) bool, True = may attend."""
        causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
        if attention_mask is None:
            return causal[None, None]
        return causal[None, None] & attention_mask[:, None, None, :].bool()

    def unembed(self, h):
        """(B, T, D) -> (B, T, V): the tied output layer."""
        return F.linear(h, self.embed_tokens.weight)

    def forward(self, input_ids, attention_mask=None):
        h = self.embed_tokens(input_ids)  # (B, T, D)
        keep = self.attention_keep(attention_mask, input_ids.shape[1])
        for layer in self.layers:
            h = layer(h, keep)
        return self.unembed(self.norm(h))  # (B, T, V)


def build(config: LlamaConfig = TINY, seed: int = 0) -> Llama:
    """The reference in eval mode: torch's initializers from `seed`, norms that look trained."""
    torch.manual_seed(seed)
    model = Llama(config)
    nn.init.normal_(model.embed_tokens.weight, std=0.3)  # torch's N(0, 1) gives logits near 30, where float32 rounding nears the 1e-5 tolerance
    return trained_look(model, seed).eval()


def example_inputs(config: LlamaConfig = TINY) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids (3, 7), attention_mask (3, 7)) with padded rows."""
    return inputs.llama(config)


def large(batch: int = 1, length: int = 32):
    """Llama-3.2-1B's shape (1.24B parameters) with random weights, and (input_ids (batch, length),):
    for benchmarks, not tests. Built once per process: llama_convert.large converts this very model."""
    return _large(batch, length)


@functools.cache  # keyed by position: large() and large(1, 32) are one model
def _large(batch: int, length: int):
    config = llama_3_2_1b()
    return build(config), (inputs.token_ids(config.vocab_size, shape=(batch, length)),)


def reference():
    """The reference and (input_ids, attention_mask), positionally: a factory for `mhsa port-check`."""
    return build(), example_inputs()


def reference_keywords():
    """The reference and {"input_ids", "attention_mask"}: the keyword form of `reference`."""
    return build(), inputs.llama_keywords(TINY)
