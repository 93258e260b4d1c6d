"""Equinox ports of the small torch models of models.py, written as Equinox code is: per example
(one (T, D) sequence), each layer vmapped over the positions; and their planted bugs, each asked
for by name. The functions at the end are factories for the command."""

from __future__ import annotations

import functools
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import torch

from examples import equinox_block
from mhsa.port_check.readers.equinox import reader
from tests.tools.port_check.models import D, TorchMLP, activations

H = 4  # heads: d_head = 6


class EqxMLP(eqx.Module):
    """The Equinox port of models.TorchMLP, (T, D) -> (T, D): norm -> fc1 -> GELU -> fc2 per
    position. eps, the GELU's approximation and fc1's bias as asked (a faithful port by default)."""

    norm: eqx.nn.LayerNorm
    fc1: eqx.nn.Linear
    act: eqx.nn.Lambda
    fc2: eqx.nn.Linear

    def __init__(self, hidden: int = 2 * D, eps: float = 1e-5, approximate: bool = False, bias: bool = True, seed: int = 0):
        k1, k2 = jax.random.split(jax.random.key(seed))
        self.norm = eqx.nn.LayerNorm(D, eps=eps)
        self.fc1 = eqx.nn.Linear(D, hidden, use_bias=bias, key=k1)
        self.act = eqx.nn.Lambda(functools.partial(jax.nn.gelu, approximate=approximate))
        self.fc2 = eqx.nn.Linear(hidden, D, key=k2)

    def __call__(self, x):
        return jax.vmap(self.fc2)(jax.vmap(self.act)(jax.vmap(self.fc1)(jax.vmap(self.norm)(x))))  # (T, D)


class BatchedMLP(EqxMLP):
    """EqxMLP whose call takes the whole batch (B, T, D), and says so."""

    port_check_batched: ClassVar[bool] = True

    def __call__(self, x):
        return jax.vmap(super().__call__)(x)  # (B, T, D)


class SumOverFirstAxis(eqx.Module):
    """x -> x.sum(axis=0) @ weight.T: per example, (T, D) -> (D,) sums the positions; given the
    batch, it would sum the examples: which one it is called with shows in the output's shape."""

    proj: eqx.nn.Linear

    def __init__(self):
        self.proj = eqx.nn.Linear(D, D, key=jax.random.key(0))

    def __call__(self, x):
        return self.proj(x.sum(axis=0))


class Twice(eqx.Module):
    """One Linear assigned twice (fc and again: the same object) and called twice, (T, D) -> (T, D)."""

    fc: eqx.nn.Linear
    again: eqx.nn.Linear

    def __init__(self):
        self.fc = eqx.nn.Linear(D, D, key=jax.random.key(0))
        self.again = self.fc

    def __call__(self, x):
        return jax.vmap(self.again)(jax.nn.relu(jax.vmap(self.fc)(x)))


class TorchTwice(torch.nn.Module):
    """The torch reference of Twice: one Linear, called twice."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(D, D)
        self.again = self.fc

    def forward(self, x):
        return self.again(torch.relu(self.fc(x)))


class Jitted(EqxMLP):
    """EqxMLP run under an eqx.filter_jit of its own."""

    def __call__(self, x):
        return eqx.filter_jit(super().__call__)(x)


class Scanned(eqx.Module):
    """One Linear applied twice inside a lax.scan of the model's own, (T, D) -> (T, D)."""

    fc: eqx.nn.Linear

    def __init__(self):
        self.fc = eqx.nn.Linear(D, D, key=jax.random.key(0))

    def __call__(self, x):
        return jax.lax.scan(lambda carry, _: (jax.vmap(self.fc)(carry), None), x, None, length=2)[0]


class Attention(eqx.Module):
    """eqx.nn.MultiheadAttention as self-attention, (T, D) -> (T, D)."""

    mha: eqx.nn.MultiheadAttention

    def __init__(self):
        self.mha = eqx.nn.MultiheadAttention(H, D, key=jax.random.key(0))

    def __call__(self, x):
        return self.mha(x, x, x)


class Raising(EqxMLP):
    """EqxMLP whose call fails after its first layers ran (recorders in place)."""

    def __call__(self, x):
        jax.vmap(self.fc1)(jax.vmap(self.norm)(x))
        raise RuntimeError("the port's code fails here")


class Stateful(EqxMLP):
    """EqxMLP with a BatchNorm after it, whose statistics live in an eqx.nn.State: called as
    model(x, state) -> (output, state); build it with eqx.nn.make_with_state(Stateful)()."""

    bn: eqx.nn.BatchNorm

    def __init__(self):
        super().__init__()
        self.bn = eqx.nn.BatchNorm(D, axis_name="positions", inference=True, mode="batch")

    def __call__(self, x, state):
        return jax.vmap(self.bn, axis_name="positions", in_axes=(0, None), out_axes=(0, None))(super().__call__(x), state)


class SwappedHeads(equinox_block.Attention):
    """The attention block with a planted bug: heads split as (T, d_head, H) instead of (T, H, d_head)."""

    def __init__(self, d_model: int, n_heads: int, *, key):
        super().__init__(d_model, n_heads, key=key)

    def __call__(self, x):
        T, D = x.shape
        d_head = D // self.n_heads
        q, k, v = jnp.split(jax.vmap(self.qkv_proj)(x), 3, axis=-1)  # 3 x (T, D)
        q, k, v = (t.reshape(T, d_head, self.n_heads).transpose(2, 0, 1) for t in (q, k, v))  # wrong: (H, T, d_head) from the wrong split
        scores = (q / jnp.sqrt(d_head)) @ k.swapaxes(-2, -1)  # (H, T, T)
        scores = jnp.where(jnp.tril(jnp.ones((T, T), dtype=bool)), scores, -jnp.inf)
        context = jax.nn.softmax(scores, axis=-1) @ v  # (H, T, d_head)
        return jax.vmap(self.out_proj)(context.transpose(1, 0, 2).reshape(T, D))  # (T, D)


def swapped_heads_block() -> equinox_block.Block:
    block = equinox_block.Block(key=jax.random.key(0))
    return eqx.tree_at(lambda b: b.attn, block, SwappedHeads(D, H, key=jax.random.key(1)))


def converted(source: torch.nn.Module, target: eqx.Module, transpose: str = "") -> eqx.Module:
    """target holding source's weights, as a user's converter writes them (eqx.tree_at on each
    array); planted bug: the weight of the module named `transpose` written transposed."""
    arrays = {name: value.detach().numpy() for name, value in source.state_dict().items()}
    if transpose:
        arrays[f"{transpose}.weight"] = arrays[f"{transpose}.weight"].T
    return reader.load_parameters(target, arrays)


# --- factories for the command ---


def torch_mlp():
    torch.manual_seed(0)
    return TorchMLP(), activations()


def eqx_mlp():
    return EqxMLP(), activations()


@functools.cache
def prebuilt():
    """An EqxMLP built once: the missing-equinox tests build it first, then hide equinox."""
    return EqxMLP(), activations()


def torch_twice():
    torch.manual_seed(0)
    return TorchTwice(), activations()


def eqx_twice():
    return Twice(), activations()


def inputs() -> np.ndarray:
    return activations()
