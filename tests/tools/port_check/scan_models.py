"""Small stacks of layers for the scan tests: a torch reference whose blocks sit in an nn.ModuleList,
and its ports whose blocks' parameters are stacked on a leading layer axis, run the ways JAX code
runs them: nnx.scan, jax.lax.scan over nnx.split's state (in a library's own module too), Linen's nn.scan, Equinox's jax.lax.scan
over a filter_vmap'd block; and a torch bidirectional LSTM against nnx.Bidirectional. Sizes are
odd and distinct (B=3, T=5, D=8, L=3 layers)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import linen as nn
from flax import nnx

B, T, D, L = 3, 5, 8, 3


class TorchBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(D)
        self.fc = torch.nn.Linear(D, D)

    def forward(self, x):
        return x + self.fc(self.ln(x))  # (B, T, D)


class TorchStack(torch.nn.Module):
    """x (B, T, D) -> (B, T, D): L blocks in a ModuleList, then `out`."""

    def __init__(self):
        super().__init__()
        self.h = torch.nn.ModuleList([TorchBlock() for _ in range(L)])
        self.out = torch.nn.Linear(D, D)

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return self.out(x)


def inputs() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((B, T, D)).astype(np.float32)


def reference() -> TorchStack:
    torch.manual_seed(0)
    return TorchStack().eval()


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.ln = nnx.LayerNorm(D, epsilon=1e-5, rngs=rngs)
        self.fc = nnx.Linear(D, D, rngs=rngs)
        self.residual = nnx.Variable(jnp.ones(()))  # 1, or the planted bug's 2: a variable, no parameter

    def __call__(self, x):
        return x * self.residual[...] + self.fc(self.ln(x))


class StackedLayers(nnx.Module):
    """A library's own module around a stack (as SkyRL's StackedDecoderLayers): the stacked Block
    held as `_stacked`, run by jax.lax.scan over nnx.split's state."""

    def __init__(self, stacked: Block):
        self._stacked = stacked

    def __call__(self, x):
        graphdef, state = nnx.split(self._stacked)

        def step(x, state):
            return nnx.merge(graphdef, state)(x), None

        return jax.lax.scan(step, x, state)[0]


class NNXStack(nnx.Module):
    """The port: `h` one Block whose parameters are stacked (L, ...), run by nnx.scan ("scan"), by
    jax.lax.scan over nnx.split's state ("split") or inside a module of its own ("wrapped", h._stacked);
    `broken_layer`: that layer's residual doubled (a bug)."""

    def __init__(self, style: str = "scan", broken_layer: int | None = None):
        rngs = nnx.Rngs(0)

        @nnx.split_rngs(splits=L)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return Block(rngs)

        self.h = make(rngs)
        if broken_layer is not None:
            self.h.residual[...] = jnp.where(jnp.arange(L) == broken_layer, 2.0, 1.0)
        if style == "wrapped":
            self.h = StackedLayers(self.h)
        self.out = nnx.Linear(D, D, rngs=rngs)
        self.style = style

    def __call__(self, x):
        if self.style == "wrapped":
            x = self.h(x)
        elif self.style == "scan":

            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def body(x, block):
                return block(x)

            x = body(x, self.h)
        else:
            graphdef, state = nnx.split(self.h)

            def step(x, state):
                return nnx.merge(graphdef, state)(x), None

            x, _ = jax.lax.scan(step, x, state)
        return self.out(x)


class LinenBlock(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        return x + nn.Dense(D, name="fc")(nn.LayerNorm(epsilon=1e-5, name="ln")(x)), None


class LinenStack(nn.Module):
    @nn.compact
    def __call__(self, x):
        scanned = nn.scan(LinenBlock, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=0, length=L)
        x, _ = scanned(name="h")(x, None)
        return nn.Dense(D, name="out")(x)


def linen():
    module = LinenStack()
    return module, module.init(jax.random.key(0), inputs()[0])


class EqxBlock(eqx.Module):
    ln: eqx.nn.LayerNorm
    fc: eqx.nn.Linear

    def __init__(self, key):
        self.ln, self.fc = eqx.nn.LayerNorm(D), eqx.nn.Linear(D, D, key=key)

    def __call__(self, x):  # one example: x (T, D)
        return x + jax.vmap(self.fc)(jax.vmap(self.ln)(x))


class EqxStack(eqx.Module):
    """The Equinox port, per example: `h` an EqxBlock made by eqx.filter_vmap (its arrays stacked),
    run by jax.lax.scan over eqx.partition's arrays."""

    h: EqxBlock
    out: eqx.nn.Linear

    def __init__(self):
        keys = jax.random.split(jax.random.key(0), L + 1)
        self.h = eqx.filter_vmap(EqxBlock)(keys[:L])
        self.out = eqx.nn.Linear(D, D, key=keys[L])

    def __call__(self, x):
        arrays, static = eqx.partition(self.h, eqx.is_array)

        def step(x, layer):
            return eqx.combine(layer, static)(x), None

        x, _ = jax.lax.scan(step, x, arrays)
        return jax.vmap(self.out)(x)


class TorchBidirectional(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(7, 6, batch_first=True, bidirectional=True)
        self.head = torch.nn.Linear(12, 4)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


class NNXBidirectional(nnx.Module):
    def __init__(self):
        rngs = nnx.Rngs(0)
        forward, backward = (nnx.RNN(nnx.LSTMCell(7, 6, rngs=rngs), rngs=False) for _ in range(2))
        self.lstm = nnx.Bidirectional(forward, backward, rngs=False)
        self.head = nnx.Linear(12, 4, rngs=rngs)

    def __call__(self, x):
        zeros = (jnp.zeros((x.shape[0], 6)), jnp.zeros((x.shape[0], 6)))
        return self.head(self.lstm(x, initial_carry=(zeros, zeros)))  # (B, T, 4)
