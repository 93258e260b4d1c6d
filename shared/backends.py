"""One NumPy-in, NumPy-out interface over numpy_ref, torch_impl and jax_impl, used by
`mhsa parity` and the tests, so that a property is written once and checked for each.

Every model is built from the exchange dict through the backend's own from_exchange; the
frameworks are imported only when a backend is used.
"""

from __future__ import annotations

import functools

import numpy as np

import numpy_ref


class NumpyBackend:
    name = "numpy"

    def forward(self, tokens, arrays, config, mask=None, return_weights=False, trace=None):
        return numpy_ref.forward(tokens, arrays, config, mask=mask, return_weights=return_weights, trace=trace)

    def attention(self, x, arrays, config, mask=None, return_weights=False):
        return numpy_ref.attention(x, arrays, config.n_heads, mask=mask, return_weights=return_weights)

    def loss_and_grads(self, tokens, targets, arrays, config, mask=None, step=1e-3):
        """Central finite differences of numpy_ref's loss (float64 only), every coordinate."""
        assert all(value.dtype == np.float64 for value in arrays.values()), "finite differences need float64"
        loss = float(numpy_ref.loss(arrays, tokens, targets, config, mask=mask))
        grads = {}
        for name, value in arrays.items():
            grad = np.zeros_like(value)
            for index in np.ndindex(value.shape):
                grad[index] = central_difference(arrays, name, index, tokens, targets, config, mask, step)
            grads[name] = grad
        return loss, grads

    def fused_and_separate(self, x, seed):
        from numpy_ref.attention import linear

        rng = np.random.default_rng(seed)
        D = x.shape[-1]
        separate = [(rng.uniform(-1, 1, (D, D)), rng.uniform(-1, 1, D)) for _ in range(3)]
        fused_weight = np.concatenate([weight for weight, _ in separate])  # (3D, D)
        fused_bias = np.concatenate([bias for _, bias in separate])  # (3D,)
        return linear(x, fused_weight, fused_bias), np.concatenate([linear(x, w, b) for w, b in separate], axis=-1)


def central_difference(arrays, name, index, tokens, targets, config, mask=None, step=1e-3) -> float:
    """d loss / d arrays[name][index] on numpy_ref in float64, by the fourth-order central
    stencil (f(w-2h) - 8 f(w-h) + 8 f(w+h) - f(w+2h)) / 12h. Measured on the default config
    against autodiff: within 2e-12 at h = 1e-3; the plain (f(w+h) - f(w-h)) / 2h stays near
    1e-10 at best, too coarse for DESIGN.md's float64 gradient tolerance."""
    shifted = dict(arrays)
    values = {}
    for multiple in (-2, -1, 1, 2):
        copy = arrays[name].copy()
        copy[index] += multiple * step
        shifted[name] = copy
        values[multiple] = float(numpy_ref.loss(shifted, tokens, targets, config, mask=mask))
    return (values[-2] - 8 * values[-1] + 8 * values[1] - values[2]) / (12 * step)


class TorchBackend:
    name = "torch"

    def model(self, arrays, config):
        from torch_impl.model import from_exchange

        return from_exchange(arrays, config)

    def forward(self, tokens, arrays, config, mask=None, return_weights=False, trace=None):
        import torch

        model = self.model(arrays, config)
        inner = {} if trace is not None else None
        with torch.no_grad():
            result = model(torch.from_numpy(np.asarray(tokens)), mask=_torch(mask), return_weights=return_weights, trace=inner)
        if trace is not None:
            trace.update({name: value.detach().numpy() for name, value in inner.items()})
        return _numpy(result)

    def attention(self, x, arrays, config, mask=None, return_weights=False):
        import torch

        with torch.no_grad():
            result = self.model(arrays, config).attn(torch.from_numpy(x), mask=_torch(mask), return_weights=return_weights)
        return _numpy(result)

    def loss_and_grads(self, tokens, targets, arrays, config, mask=None):
        import torch

        from torch_impl.model import grads_to_exchange
        from torch_impl.train import loss_fn

        model = self.model(arrays, config)
        loss = loss_fn(model, torch.from_numpy(tokens), torch.from_numpy(targets), mask=_torch(mask))
        loss.backward()
        return float(loss.detach()), grads_to_exchange(model)

    def fused_and_separate(self, x, seed):
        """(qkv_proj(x), cat[Linear_q(x), Linear_k(x), Linear_v(x)]) with qkv_proj's weight
        stacked from three independently initialised Linear(D, D) in (Q, K, V) order."""
        import torch
        from torch import nn

        from torch_impl.attention import MultiHeadSelfAttention

        torch.manual_seed(seed)
        D = x.shape[-1]
        separate = [nn.Linear(D, D, dtype=torch.float64) for _ in range(3)]
        block = MultiHeadSelfAttention(D, 1, x.shape[1], dtype=torch.float64)
        with torch.no_grad():
            block.qkv_proj.weight.copy_(torch.cat([layer.weight for layer in separate]))  # (3D, D)
            block.qkv_proj.bias.copy_(torch.cat([layer.bias for layer in separate]))  # (3D,)
            inputs = torch.from_numpy(x)
            return block.qkv_proj(inputs).numpy(), torch.cat([layer(inputs) for layer in separate], dim=-1).numpy()


class JaxBackend:
    name = "jax"

    def model(self, arrays, config):
        from jax_impl.model import from_exchange

        return from_exchange(arrays, config)

    def forward(self, tokens, arrays, config, mask=None, return_weights=False, trace=None):
        import jax.numpy as jnp

        model = self.model(arrays, config)
        inner = {} if trace is not None else None
        result = model(jnp.asarray(tokens), mask=_jax(mask), return_weights=return_weights, trace=inner)
        if trace is not None:
            trace.update({name: np.asarray(value) for name, value in inner.items()})
        return _numpy(result)

    def attention(self, x, arrays, config, mask=None, return_weights=False):
        import jax.numpy as jnp

        result = self.model(arrays, config).attn(jnp.asarray(x), mask=_jax(mask), return_weights=return_weights)
        return _numpy(result)

    def loss_and_grads(self, tokens, targets, arrays, config, mask=None):
        import jax.numpy as jnp

        from jax_impl.model import grads_to_exchange

        # compiled as one function: op-by-op, each of the ~100 ops of forward and backward would
        # compile on its own for every new shape (seconds per config); the maths is the same
        model = self.model(arrays, config)
        loss, grads = _jax_value_and_grad()(model, jnp.asarray(tokens), jnp.asarray(targets), _jax(mask))
        return float(loss), grads_to_exchange(grads)

    def fused_and_separate(self, x, seed):
        import jax.numpy as jnp
        from flax import nnx

        from jax_impl.attention import MultiHeadSelfAttention

        rngs = nnx.Rngs(seed)
        D = x.shape[-1]
        separate = [nnx.Linear(D, D, dtype=jnp.float64, param_dtype=jnp.float64,
                               bias_init=nnx.initializers.normal(1.0), rngs=rngs) for _ in range(3)]
        block = MultiHeadSelfAttention(D, 1, x.shape[1], dtype=jnp.float64, rngs=rngs)
        block.qkv_proj.kernel[...] = jnp.concatenate([layer.kernel[...] for layer in separate], axis=1)  # (D, 3D)
        block.qkv_proj.bias[...] = jnp.concatenate([layer.bias[...] for layer in separate])  # (3D,)
        inputs = jnp.asarray(x)
        return np.asarray(block.qkv_proj(inputs)), np.asarray(jnp.concatenate([layer(inputs) for layer in separate], axis=-1))


@functools.cache
def _jax_value_and_grad():
    from flax import nnx

    from jax_impl.train import loss_fn

    return nnx.jit(nnx.value_and_grad(loss_fn))


def _torch(mask):
    import torch

    return None if mask is None else torch.from_numpy(np.asarray(mask))


def _jax(mask):
    import jax.numpy as jnp

    return None if mask is None else jnp.asarray(mask)


def _numpy(result):
    if isinstance(result, tuple):
        return tuple(_numpy(item) for item in result)
    if hasattr(result, "detach"):
        return result.detach().numpy()
    return np.asarray(result)


BACKENDS = {backend.name: backend for backend in (NumpyBackend(), TorchBackend(), JaxBackend())}
