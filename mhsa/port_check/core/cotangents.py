"""The direction the forward check takes its gradients in: d<r, output>/dθ, with r a fixed random
array per floating-point leaf of the model's output, drawn once (seeded by the leaf's place in the
output) and given to both sides in each one's layout.

Not d sum(output)/dθ: a sum is constant under much of what ends a model. The features of a LayerNorm
whose weight is 1 and bias 0 (as libraries initialise it) sum to 0 in every row, a softmax's rows to
1, a mean-centred output to 0: the exact gradient of such a sum is 0, and every gradient row would
compare rounding noise. A random direction is not orthogonal to what the parameters change, so the
exact gradient has the size of the output's own sensitivity, which both sides then compute.

r is standard normal in float32 (exact in float64 too: a float64 run uses the same numbers); a leaf
given none (a port leaf with no counterpart in the reference) does not count.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np

from mhsa.port_check.core import layouts
from mhsa.port_check.core.structure import Output, is_float_dtype

SEED = 0  # the check's fixed seed of every direction: the same numbers on every run

# a side's direction: the leaves of its model's output -> {leaf label: r in that leaf's shape and layout}
Direction = Callable[[list[Output]], dict[str, np.ndarray]]


def draw(label: str, shape: tuple, seed: int = SEED) -> np.ndarray:
    """The direction of the reference's output leaf at `label`: standard normal float32 of `shape`."""
    rng = np.random.default_rng([seed, zlib.crc32(label.encode())])
    return rng.standard_normal(tuple(shape), dtype=np.float32)


def floats(outputs: list[Output]) -> list[Output]:
    """The floating-point leaves of an output, in their order."""
    return [output for output in outputs if is_float_dtype(output.dtype)]


def reference(outputs: list[Output]) -> dict[str, np.ndarray]:
    """The reference's direction: one draw per floating-point leaf of its output."""
    return {output.label: draw(output.label, output.shape) for output in floats(outputs)}


class PortDirection:
    """The port's direction: each of its output leaves paired with the reference's (by label, or
    by position where the two outputs are structured differently but hold as many floating-point
    leaves), given the reference's draw laid out as the port lays that leaf out. `left_out` names
    the port leaves that got none, and why."""

    def __init__(self, reference_outputs: list[Output]):
        self.reference = floats(reference_outputs)
        self.kinds = {output.label: output.dtype for output in reference_outputs}
        self.left_out: list[str] = []

    def __call__(self, outputs: list[Output]) -> dict[str, np.ndarray]:
        port = floats(outputs)
        by_label = {output.label: output for output in self.reference}
        pairs = [(by_label[output.label], output) for output in port if output.label in by_label]
        if len(pairs) < len(port) and len(port) == len(self.reference):
            pairs = list(zip(self.reference, port))
        paired = {id(output) for _, output in pairs}
        self.left_out = [f"'{output.label or '(whole)'}' ({self._missing(output.label)})" for output in port if id(output) not in paired]
        directions = {}
        for ref, output in pairs:
            r, permutation = draw(ref.label, ref.shape), layouts.order(ref.layout, output.layout)
            r = r if permutation is None else r.transpose(permutation)
            if r.shape != tuple(output.shape):
                self.left_out.append(f"'{output.label or '(whole)'}' (shape {tuple(output.shape)}, the reference's {tuple(ref.shape)})")
                continue
            directions[output.label] = r
        return directions

    def _missing(self, label: str) -> str:
        kind = self.kinds.get(label)
        return "no counterpart in the reference" if kind is None else f"{'None' if kind == 'NoneType' else kind} in the reference"
