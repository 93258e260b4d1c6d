"""Every registered backend behind one call signature (exchange arrays and config in, NumPy
out), used by `mhsa parity` and the tests so that a property is written once and checked for
each; and numpy_ref's finite-difference gradient, the independent check of every autodiff.

Each model is built from the exchange dict through the backend's own from_exchange.
"""

from __future__ import annotations

from mhsa import registry


class Adapter:
    """One backend of the registry, called with (arrays, config) instead of a built model."""

    def __init__(self, backend: registry.Backend):
        self.backend = backend
        self.name = backend.name

    def __repr__(self) -> str:
        return f"Adapter({self.name!r})"

    def model(self, arrays, config):
        return self.backend.model.from_exchange(arrays, config)

    def forward(self, tokens, arrays, config, mask=None, return_weights=False, trace=None):
        """tokens (B, T) -> logits (B, T, V), or (logits, weights (B, H, T, T))."""
        return self.backend.model.predict(self.model(arrays, config), tokens, mask=mask, return_weights=return_weights, trace=trace)

    def attention(self, x, arrays, config, mask=None, return_weights=False):
        """x (B, T, D) -> (B, T, D), or (out, weights): the block alone."""
        return self.backend.model.attend(self.model(arrays, config), x, mask=mask, return_weights=return_weights)

    def loss_and_grads(self, tokens, targets, arrays, config, mask=None):
        """(loss, {name: d loss / d arrays[name]}) by the backend's own gradient."""
        return self.backend.model.loss_and_grads(self.model(arrays, config), tokens, targets, mask=mask)


ADAPTERS = {name: Adapter(registry.get(name)) for name in registry.names()}


def central_difference(arrays, name, index, tokens, targets, config, mask=None, step=1e-3) -> float:
    """d loss / d arrays[name][index] of the reference backend (the registry's first, numpy_ref,
    whose loss_fn takes NumPy) in float64, by the fourth-order central
    stencil (f(w-2h) - 8 f(w-h) + 8 f(w+h) - f(w+2h)) / 12h. Measured on the default config
    against autodiff: within 2e-12 at h = 1e-3; the plain (f(w+h) - f(w-h)) / 2h stays near
    1e-10 at best, too coarse for the float64 gradient tolerance."""
    reference = registry.get(registry.names()[0]).model
    shifted = dict(arrays)
    values = {}
    for multiple in (-2, -1, 1, 2):
        copy = arrays[name].copy()
        copy[index] += multiple * step
        shifted[name] = copy
        values[multiple] = float(reference.loss_fn(reference.from_exchange(shifted, config), tokens, targets, mask=mask))
    return (values[-2] - 8 * values[-1] + 8 * values[1] - values[2]) / (12 * step)
