"""The backward pass of TinyLM by hand: one pure NumPy function per forward stage, in the
forward's numbered steps (numpy_ref/model.py's 1-3, numpy_ref/attention.py's 1-9), walked in
reverse. What torch's autograd and jax.grad do for you, written out.

Every function takes the gradient of the loss with respect to a stage's output (`g_out`,
same shape as that output) and what the forward kept, and returns the gradient with respect
to the stage's inputs. Notation: for y = f(x) and a scalar loss L, g_y = dL/dy, and the chain
rule gives g_x = (dy/dx)^T g_y, a vector-Jacobian product; nothing here builds a Jacobian.
B batch, T sequence, D d_model, H heads, d_head = D // H, V vocab_size, N = B * T.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from numpy_ref.attention import allowed_keys, merge_heads, split_heads
from shared.config import ModelConfig

# --- model.py, step 3 and the loss ----------------------------------------------------------


def cross_entropy_backward(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(B, T, V), int (B, T) -> (loss, a 0-d array; g_logits (B, T, V)).

    L = -(1/N) sum_n log p_n[t_n] with p_n = softmax(z_n). Since log p_n[t] = z_n[t] - logsumexp(z_n),
    dL/dz_n[j] = (p_n[j] - [j == t_n]) / N: the predicted probabilities minus the one-hot target,
    averaged over the N positions. No softmax Jacobian is needed: it cancels against the log.
    The loss comes from the same exponentials (numpy_ref.cross_entropy's arithmetic, once).
    """
    B, T = targets.shape
    shifted = logits - logits.max(axis=-1, keepdims=True)  # (B, T, V)
    exp = np.exp(shifted)  # (B, T, V)
    total = exp.sum(axis=-1, keepdims=True)  # (B, T, 1)
    rows, cols = np.indices((B, T))  # (B, T) each: with targets, the index of every target logit
    loss = -(shifted[rows, cols, targets] - np.log(total[..., 0])).mean()  # -mean log p[target]
    g_logits = exp / total  # (B, T, V) probabilities
    g_logits[rows, cols, targets] -= 1  # minus the one-hot target
    g_logits /= B * T
    return loss, g_logits


def linear_backward(g_out: np.ndarray, x: np.ndarray, weight: np.ndarray, bias: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """g_out (B, T, out), x (B, T, in), weight (out, in) -> (g_x (B, T, in), g_weight (out, in), g_bias (out,) or None).

    y = x W^T + b, so dy_o/dx_i = W[o, i], dy_o/dW[o, i] = x_i, dy_o/db_o = 1. Hence
    g_x = g_out W; g_W = sum over every position of g_out^T x (an outer product per position);
    g_b = sum over every position of g_out. The weight is shared by all B * T positions, so its
    gradient adds their contributions.
    """
    g_x = g_out @ weight  # (B, T, out) @ (out, in) -> (B, T, in)
    # one (out, T) @ (T, in) product per sequence, then summed over the batch: the sum over all
    # B * T positions that the docstring derives
    g_weight = (g_out.swapaxes(-2, -1) @ x).sum(axis=0)  # (B, out, T) @ (B, T, in) -> (B, out, in) -> (out, in)
    g_bias = g_out.sum(axis=(0, 1)) if bias else None  # (out,)
    return g_x, g_weight, g_bias


def read_out_backward(g_logits: np.ndarray, x: np.ndarray, params: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """3. read out: g_logits (B, T, V) -> (g_x (B, T, D), {lm_head.*: gradient}). The LM head is a linear layer."""
    g_x, g_weight, g_bias = linear_backward(g_logits, x, params["lm_head.weight"], "lm_head.bias" in params)
    return g_x, _named("lm_head", g_weight, g_bias)


# --- attention.py, steps 9 to 1 -------------------------------------------------------------


def merge_heads_backward(g_merged: np.ndarray, n_heads: int) -> np.ndarray:
    """8. merge heads: g_merged (B, T, D) -> g_context (B, H, T, d_head).

    Merging only moves numbers (a transpose and a reshape); each output entry is exactly one
    input entry, so the gradient moves back the same way: split_heads, the inverse permutation.
    """
    return split_heads(g_merged, n_heads)  # (B, H, T, d_head)


def weighted_values_backward(g_context: np.ndarray, weights: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """7. weight the values: g_context (B, H, T, d_head), weights (B, H, T, T), v (B, H, T, d_head)
    -> (g_weights (B, H, T, T), g_v (B, H, T, d_head)).

    context[i] = sum_j w[i, j] v[j], per batch and head. So dL/dw[i, j] = g_context[i] . v[j],
    i.e. g_w = g_context v^T; and dL/dv[j] = sum_i w[i, j] g_context[i], i.e. g_v = w^T g_context.
    """
    g_weights = g_context @ v.swapaxes(-2, -1)  # (B, H, T, d_head) @ (B, H, d_head, T) -> (B, H, T, T)
    g_v = weights.swapaxes(-2, -1) @ g_context  # (B, H, T, T) @ (B, H, T, d_head) -> (B, H, T, d_head)
    return g_weights, g_v


def softmax_backward(g_weights: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """6. softmax over keys: g_weights (B, H, T, T), weights (B, H, T, T) -> g_scores (B, H, T, T).

    For one row w = softmax(s): dw_j/ds_k = w_j ([j == k] - w_k). The vector-Jacobian product is
        g_s[k] = sum_j g_w[j] w_j ([j == k] - w_k) = w_k g_w[k] - w_k sum_j w_j g_w[j]
               = w_k (g_w[k] - sum_j w_j g_w[j]).
    In words: each score's gradient is its weight times how much its upstream gradient beats the
    weighted average of the row's. Shifting every score of a row by the same amount leaves the
    softmax unchanged, so the row's gradients must sum to zero: the subtraction is what does it.
    A masked key has w_k = 0 and gets 0; a fully masked row (all w = 0) gets 0 throughout.
    """
    row_average = np.einsum("...j,...j->...", weights, g_weights)[..., None]  # (B, H, T, 1): sum_j w_j g_j
    return weights * (g_weights - row_average)  # (B, H, T, T)


def mask_backward(g_scores: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """5. mask: g_scores (B, H, T, T), allowed bool broadcastable to it -> g_scores (B, H, T, T).

    The forward replaced masked scores by the constant -inf, which does not depend on the score:
    their gradient is 0. Allowed scores pass through unchanged (the derivative of the identity).
    After softmax_backward the masked entries are already 0 (their weight is 0); zeroing them here
    states it rather than relying on it.
    """
    return np.where(allowed, g_scores, 0)


def scores_backward(g_scores: np.ndarray, q: np.ndarray, k: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """4. score and scale: g_scores (B, H, T, T), q, k (B, H, T, d_head) -> (g_q, g_k), each (B, H, T, d_head).

    scores[i, j] = (scale * q[i]) . k[j], as the forward computes it. So dL/dq[i] = scale *
    sum_j g[i, j] k[j], i.e. g_q = scale * g k; and dL/dk[j] = sum_i g[i, j] (scale * q[i]),
    i.e. g_k = g^T (scale * q).
    """
    g_q = (g_scores @ k) * scale  # (B, H, T, T) @ (B, H, T, d_head) -> (B, H, T, d_head)
    g_k = g_scores.swapaxes(-2, -1) @ (q * scale)  # (B, H, T, T) @ (B, H, T, d_head) -> (B, H, T, d_head)
    return g_q, g_k


def split_heads_backward(g_heads: np.ndarray) -> np.ndarray:
    """3. reshape into heads: g (B, H, T, d_head) -> (B, T, D).

    A pure rearrangement: the gradient goes back by the inverse rearrangement, merge_heads.
    """
    return merge_heads(g_heads)  # (B, T, D)


def split_backward(g_q: np.ndarray, g_k: np.ndarray, g_v: np.ndarray) -> np.ndarray:
    """2. split: 3 x (B, T, D) -> g_qkv (B, T, 3D).

    Q, K and V are three disjoint slices of qkv: the slices' gradients, side by side, are qkv's.
    """
    return np.concatenate([g_q, g_k, g_v], axis=-1)  # (B, T, 3D)


def attention_backward(
    g_out: np.ndarray, trace: dict[str, np.ndarray], params: dict[str, np.ndarray], n_heads: int, mask: Any = None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The block, steps 9 to 1: g_out (B, T, D) -> (g_x (B, T, D), {attn.*: gradient}).

    trace: the forward's stages (numpy_ref.attention records them): embed (the block's input x),
    q, k, v, weights, merged. mask: the same optional mask the forward was given.
    """
    x, q, k, v, weights = trace["embed"], trace["q"], trace["k"], trace["v"], trace["weights"]
    T, d_head = q.shape[-2], q.shape[-1]
    grads = {}

    # 9. project out: a linear layer
    g_merged, g_weight, g_bias = linear_backward(g_out, trace["merged"], params["attn.out_proj.weight"], "attn.out_proj.bias" in params)  # (B, T, D)
    grads.update(_named("attn.out_proj", g_weight, g_bias))

    # 8. merge heads
    g_context = merge_heads_backward(g_merged, n_heads)  # (B, H, T, d_head)

    # 7. weight the values
    g_weights, g_v = weighted_values_backward(g_context, weights, v)  # (B, H, T, T), (B, H, T, d_head)

    # 6. softmax over keys
    g_scores = softmax_backward(g_weights, weights)  # (B, H, T, T)

    # 5. mask: no gradient reaches a masked score
    allowed = allowed_keys(0, T, T, mask)  # (T, T), or (B, H, T, T) with a mask
    g_scores = mask_backward(g_scores, allowed)  # (B, H, T, T)

    # 4. score and scale
    g_q, g_k = scores_backward(g_scores, q, k, 1.0 / math.sqrt(d_head))  # 2 x (B, H, T, d_head)

    # 3. reshape into heads
    g_q, g_k, g_v = (split_heads_backward(g) for g in (g_q, g_k, g_v))  # 3 x (B, T, D)

    # 2. split
    g_qkv = split_backward(g_q, g_k, g_v)  # (B, T, 3D)

    # 1. project: one linear layer made Q, K and V
    g_x, g_weight, g_bias = linear_backward(g_qkv, x, params["attn.qkv_proj.weight"], "attn.qkv_proj.bias" in params)  # (B, T, D)
    grads.update(_named("attn.qkv_proj", g_weight, g_bias))
    return g_x, grads


# --- model.py, step 1 -----------------------------------------------------------------------


def embed_backward(g_x: np.ndarray, tokens: np.ndarray, vocab_size: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """1. embed: g_x (B, T, D), int tokens (B, T) -> (g_tok_emb (V, D), g_pos_emb (max_len, D)).

    x[b, t] = tok_emb[tokens[b, t]] + pos_emb[t]: a lookup is a selection, so each row of the
    table receives the sum of the gradients of every position that looked it up. A token id
    used five times gets five contributions: np.add.at adds them all (a plain fancy-index
    assignment `g[tokens] += g_x` would keep only one). Ids never used get 0. Position t is used
    once per sequence: its gradient is the sum over the batch; positions >= T get 0.
    """
    T, D = g_x.shape[1:]
    g_tok = np.zeros((vocab_size, D), dtype=g_x.dtype)
    # scatter-add the N rows of g_x into the (V, D) table. ufunc.at has its fast loop for a
    # one-dimensional target only, so the table is addressed as V * D numbers: (id, d) -> id * D + d
    flat_index = (tokens.reshape(-1, 1) * D + np.arange(D)).reshape(-1)  # (N * D,)
    np.add.at(g_tok.reshape(-1), flat_index, g_x.reshape(-1))  # (V * D,) += (N * D,)
    g_pos = np.zeros((max_len, D), dtype=g_x.dtype)
    g_pos[:T] = g_x.sum(axis=0)  # (T, D)
    return g_tok, g_pos


# --- the whole model ------------------------------------------------------------------------


def backward(
    tokens: Any, targets: Any, params: dict[str, np.ndarray], config: ModelConfig, trace: dict[str, np.ndarray], mask: Any = None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(loss, d loss / d every exchange array), from one forward pass's trace (numpy_ref.model's
    forward records every stage it needs under shared.trace.tracing): the loss, then steps 3, 2
    (the block) and 1."""
    tokens, targets = np.asarray(tokens), np.asarray(targets)

    # the loss: mean cross-entropy of the logits
    loss, g_logits = cross_entropy_backward(trace["logits"], targets)  # (B, T, V)

    # 3. read out the next token
    g_attn_out, grads = read_out_backward(g_logits, trace["attn_out"], params)  # (B, T, D)

    # 2. attend
    g_x, attn_grads = attention_backward(g_attn_out, trace, params, config.n_heads, mask=mask)  # (B, T, D)
    grads.update(attn_grads)

    # 1. embed
    grads["tok_emb.weight"], grads["pos_emb.weight"] = embed_backward(g_x, tokens, config.vocab_size, config.max_len)
    return loss, {name: grads[name] for name in params}  # the exchange order


def _named(prefix, g_weight, g_bias):
    grads = {f"{prefix}.weight": g_weight}
    if g_bias is not None:
        grads[f"{prefix}.bias"] = g_bias
    return grads
