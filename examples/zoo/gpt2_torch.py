"""A GPT-2-style model in PyTorch, laid out as the popular library's GPT-2: the reference of the
zoo's second pair (gpt2_flax.py is its NNX port, gpt2_linen.py its Linen port, gpt2_convert.py the
converter).

    transformer: wte + wpe -> drop -> h.i: x + attn(ln_1(x)), x + mlp(ln_2(x)) -> ln_f
    lm_head: tied to wte; the output is a dataclass (logits, hidden_states), like a ModelOutput

What a port has to reproduce, each a classic porting bug (examples/zoo/catalog.py):
- Conv1D stores its weight (in, out) and computes x @ W + b: unlike nn.Linear, it needs no
  transpose into a Flax kernel, and a converter that transposes it anyway goes unnoticed on the
  square (D, D) c_proj.
- LayerNorm eps 1e-5 (Flax's default is 1e-6); GELU with the tanh approximation ("gelu_new",
  jax.nn.gelu's default, not torch's); attention scores scaled by 1/sqrt(d_head).
- The output layer is the token embedding: lm_head.weight IS transformer.wte.weight (state_dict
  lists it under both names).
- Position embeddings are looked up once for the batch, (1, T, D), and broadcast over the rows:
  a port that computes them per row, (B, T, D), holds the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from examples.zoo import inputs
from examples.zoo.configs import GPT2Config, gpt2_small
from examples.zoo.torch_weights import trained_look

TINY = GPT2Config()


@dataclass
class CausalLMOutput:
    """What the model returns: logits (B, T, V) and the hidden states, (B, T, D) each: the
    embeddings, the output of every block but the last, and the last after ln_f."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...]


class Conv1D(nn.Module):
    """(..., in) -> (..., out): x @ weight + bias with weight (in, out), as in the popular library."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        # the scale of torch's nn.Linear, not GPT-2's N(0, 0.02): activations of order 1, as trained ones are
        self.weight = nn.Parameter(torch.randn(in_features, out_features) / math.sqrt(in_features))
        self.bias = nn.Parameter(0.1 * torch.randn(out_features))

    def forward(self, x):
        return x @ self.weight + self.bias


class Attention(nn.Module):
    """(B, T, D) -> (B, T, D): causal multi-head attention, one fused projection c_attn."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.n_heads, self.d_head = config.n_heads, config.d_head
        self.c_attn = Conv1D(config.d_model, 3 * config.d_model)
        self.c_proj = Conv1D(config.d_model, config.d_model)
        self.scale = 1.0 / math.sqrt(config.d_head)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.c_attn(x).split(D, dim=-1)  # 3 x (B, T, D)
        q, k, v = (t.view(B, T, self.n_heads, self.d_head).transpose(1, 2) for t in (q, k, v))  # (B, H, T, d_head)
        scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, T, T)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        context = scores.softmax(dim=-1) @ v  # (B, H, T, d_head)
        return self.c_proj(context.transpose(1, 2).reshape(B, T, D))  # (B, T, D)


class MLP(nn.Module):
    """(B, T, D) -> (B, T, D): widen 4x, tanh GELU, narrow, dropout."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.c_fc = Conv1D(config.d_model, 4 * config.d_model)
        self.act = nn.GELU(approximate="tanh")  # "gelu_new"
        self.c_proj = Conv1D(4 * config.d_model, config.d_model)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))  # (B, T, D)


class Block(nn.Module):
    """(B, T, D) -> (B, T, D): pre-LayerNorm attention and MLP, each with a residual."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.attn = Attention(config)
        self.ln_2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))  # (B, T, D)
        return x + self.mlp(self.ln_2(x))  # (B, T, D)


class GPT2Model(nn.Module):
    """input_ids (B, T) -> the hidden states, (B, T, D) each, the last after ln_f."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.n_positions, config.d_model)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon)

    def forward(self, input_ids):
        T = input_ids.shape[1]
        positions = self.wpe(torch.arange(T)[None])  # (1, T, D): once for the batch, broadcast over the rows
        h = self.drop(self.wte(input_ids) + positions)  # (B, T, D)
        hidden_states = [h]
        for block in self.h:
            h = block(h)
            hidden_states.append(h)
        hidden_states[-1] = self.ln_f(h)
        return tuple(hidden_states)


class GPT2LMHeadModel(nn.Module):
    """input_ids (B, T) -> CausalLMOutput(logits (B, T, V), hidden_states)."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.transformer = GPT2Model(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied: one parameter

    def forward(self, input_ids):
        hidden_states = self.transformer(input_ids)
        return CausalLMOutput(logits=self.lm_head(hidden_states[-1]), hidden_states=hidden_states)


def build(config: GPT2Config = TINY, seed: int = 0) -> GPT2LMHeadModel:
    """The reference in eval mode (dropout off), from `seed`: N(0, 0.3) embeddings, norms that look trained."""
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    for embedding in (model.transformer.wte, model.transformer.wpe):
        nn.init.normal_(embedding.weight, std=0.3)  # torch's N(0, 1) gives logits near 30, where float32 rounding nears 1e-5
    return trained_look(model, seed).eval()


def example_inputs(config: GPT2Config = TINY) -> tuple[np.ndarray]:
    """(input_ids (3, 7),)."""
    return inputs.gpt2(config)


def reference():
    """The reference and (input_ids,): a factory for `mhsa port-check`."""
    return build(), example_inputs()


def small(batch: int = 1, length: int = 1024):
    """GPT-2 small's shape (124M parameters) and (input_ids (batch, length),), a full context by
    default: for benchmarks, not tests."""
    config = gpt2_small()
    return build(config), inputs.gpt2(config, (batch, length))
