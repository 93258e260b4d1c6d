"""A torch/flax pair of small attention files, written to be read by `mhsa diff`'s tests
(tests/tools/test_diff_*.py), and a NumPy version of the same steps as pure functions."""

import re
import textwrap

TORCH = textwrap.dedent('''\
    """Causal self-attention, in PyTorch."""

    from __future__ import annotations

    import math

    import torch
    from torch import nn


    class MultiHeadSelfAttention(nn.Module):
        """(B, T, D) -> (B, T, D)."""

        def __init__(self, d_model, n_heads, max_len, bias=True):
            super().__init__()
            self.n_heads = n_heads
            self.d_head = d_model // n_heads
            self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
            self.out_proj = nn.Linear(d_model, d_model, bias=bias)
            self.register_buffer("causal_mask", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)), persistent=False)

        def forward(self, x, mask=None, return_weights=False):
            B, T, D = x.shape

            # 1. project: one matmul makes Q, K and V
            qkv = self.qkv_proj(x)  # (B, T, 3D)

            # 2. split
            q, k, v = qkv.split(D, dim=-1)  # 3 x (B, T, D)
            q = q.reshape(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)
            k = k.reshape(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)
            v = v.reshape(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)

            # 3. score and scale
            scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(self.d_head))  # (B, H, T, T)

            # 4. mask: no query may see a later key
            allowed = self.causal_mask[:T, :T]  # (T, T)
            scores = scores.masked_fill(~allowed, float("-inf"))

            # 5. softmax over keys
            weights = torch.softmax(scores, dim=-1)  # (B, H, T, T)

            # 6. merge heads
            merged = (weights @ v).transpose(1, 2).reshape(B, T, D)  # (B, T, D)
            out = self.out_proj(merged)  # (B, T, D)
            return (out, weights) if return_weights else out


    def count_parameters(module):
        return sum(p.numel() for p in module.parameters())


    if __name__ == "__main__":
        print(count_parameters(MultiHeadSelfAttention(32, 4, 12)))
    ''')

FLAX = textwrap.dedent('''\
    """Causal self-attention, in JAX with Flax NNX."""

    from __future__ import annotations

    import math

    import jax
    import jax.numpy as jnp
    from flax import nnx


    class CausalMask(nnx.Variable):
        """Not a parameter: never differentiated, never saved."""


    class MultiHeadSelfAttention(nnx.Module):
        """(B, T, D) -> (B, T, D)."""

        def __init__(self, d_model, n_heads, max_len, bias=True, *, rngs: nnx.Rngs):
            self.n_heads = n_heads
            self.d_head = d_model // n_heads
            self.qkv_proj = nnx.Linear(d_model, 3 * d_model, use_bias=bias, rngs=rngs)
            self.out_proj = nnx.Linear(d_model, d_model, use_bias=bias, rngs=rngs)
            self.causal_mask = CausalMask(jnp.tril(jnp.ones((max_len, max_len), dtype=bool)))

        def __call__(self, x, mask=None, return_weights=False):
            B, T, D = x.shape

            # 1. project: one matmul makes Q, K and V
            qkv = self.qkv_proj(x)  # (B, T, 3D)

            # 2. split
            q, k, v = jnp.split(qkv, 3, axis=-1)  # 3 x (B, T, D)
            q = q.reshape(B, T, self.n_heads, self.d_head).transpose(0, 2, 1, 3)  # (B, H, T, d_head)
            k = k.reshape(B, T, self.n_heads, self.d_head).transpose(0, 2, 1, 3)  # (B, H, T, d_head)
            v = v.reshape(B, T, self.n_heads, self.d_head).transpose(0, 2, 1, 3)  # (B, H, T, d_head)

            # 3. score and scale
            scores = q @ k.swapaxes(-2, -1) * (1.0 / math.sqrt(self.d_head))  # (B, H, T, T)

            # 4. mask: no query may see a later key
            allowed = self.causal_mask[:T, :T]  # (T, T)
            scores = jnp.where(allowed, scores, -jnp.inf)

            # 5. softmax over keys
            weights = jax.nn.softmax(scores, axis=-1)  # (B, H, T, T)

            # 6. merge heads
            merged = (weights @ v).transpose(0, 2, 1, 3).reshape(B, T, D)  # (B, T, D)
            out = self.out_proj(merged)  # (B, T, D)
            return (out, weights) if return_weights else out


    def count_parameters(module):
        return sum(p.size for p in jax.tree.leaves(nnx.state(module, nnx.Param)))


    if __name__ == "__main__":
        print(count_parameters(MultiHeadSelfAttention(32, 4, 12, rngs=nnx.Rngs(0))))
    ''')

ANSI = re.compile(r"\x1b\[")


def lines(text):
    return text.splitlines()


NUMPY = textwrap.dedent('''\
    """Causal self-attention, in NumPy: pure functions."""

    import math

    import numpy as np


    def softmax(scores):
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


    def attention(x, params, n_heads):
        B, T, D = x.shape
        d_head = D // n_heads

        # 1. project: one matmul makes Q, K and V
        qkv = x @ params["qkv.weight"].T  # (B, T, 3D)

        # 2. split
        q, k, v = np.split(qkv, 3, axis=-1)  # 3 x (B, T, D)
        q = q.reshape(B, T, n_heads, d_head).transpose(0, 2, 1, 3)  # (B, H, T, d_head)
        k = k.reshape(B, T, n_heads, d_head).transpose(0, 2, 1, 3)  # (B, H, T, d_head)
        v = v.reshape(B, T, n_heads, d_head).transpose(0, 2, 1, 3)  # (B, H, T, d_head)

        # 3. score and scale
        scores = q @ k.swapaxes(-2, -1) * (1.0 / math.sqrt(d_head))  # (B, H, T, T)

        # 4. mask: no query may see a later key
        allowed = np.tril(np.ones((T, T), dtype=bool))  # (T, T)
        scores = np.where(allowed, scores, -np.inf)

        # 5. softmax over keys
        weights = softmax(scores)  # (B, H, T, T)

        # 6. merge heads
        merged = (weights @ v).transpose(0, 2, 1, 3).reshape(B, T, D)  # (B, T, D)
        return merged @ params["out.weight"].T  # (B, T, D)
    ''')
