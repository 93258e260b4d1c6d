"""Which axis of an output is which: the layout of a spatial array, decided by what computed it.

A convolution's output has a batch axis, a channel axis and spatial axes; torch puts the channels
first (NCHW), Flax last (NHWC). Whether a port's output must have its axes moved before it is
compared is decided by what each side computed, never by whether two shapes happen to differ: at
C = H = W both layouts have one shape, and comparing them without moving the channels fails a
faithful port and can let a transposed one pass.

A layout is `axes`: for each logical axis (batch, channels, spatial 1, ...) the physical axis that
holds it; torch's NCHW is (0, 1, 2, 3), Flax's NHWC (0, 3, 1, 2). The readers follow it through each
operation (readers/jaxpr.py, readers/torch/dataflow.py); a result they cannot follow (a reshape, an
einsum) has none (None) and is compared as it is.
"""

from __future__ import annotations

import numpy as np

Axes = tuple[int, ...]


def channels_first(ndim: int) -> Axes | None:
    """The layout torch's convolutions, poolings and norms give an output of `ndim` axes."""
    return tuple(range(ndim)) if ndim >= 3 else None


def transposed(axes: Axes | None, permutation) -> Axes | None:
    """The layout after `x.transpose(permutation)` (output axis j is input axis permutation[j])."""
    if axes is None or len(permutation) != len(axes):
        return None
    where = {int(source): target for target, source in enumerate(permutation)}
    return tuple(where[axis] for axis in axes)


def swapped(axes: Axes | None, a: int, b: int) -> Axes | None:
    """The layout after `x.transpose(a, b)` (torch's two-axis transpose)."""
    if axes is None:
        return None
    n = len(axes)
    permutation = list(range(n))
    permutation[a % n], permutation[b % n] = permutation[b % n], permutation[a % n]
    return transposed(axes, permutation)


def moved(axes: Axes | None, source, destination) -> Axes | None:
    """The layout after `x.movedim(source, destination)`."""
    if axes is None:
        return None
    n = len(axes)
    source, destination = ([int(axis) % n for axis in np.atleast_1d(given)] for given in (source, destination))
    order = [axis for axis in range(n) if axis not in source]  # the axes that stay, then each moved one at its place (np.moveaxis)
    for place, axis in sorted(zip(destination, source)):
        order.insert(place, axis)
    return transposed(axes, order)


def channels_last(axes: Axes | None) -> bool:
    """Whether the channels sit on the last axis."""
    return axes is not None and axes[1] == len(axes) - 1


def order(reference: Axes | None, port: Axes | None) -> tuple[int, ...] | None:
    """The permutation that lays a reference output out as the port's (`reference.transpose(p)`),
    when both have a layout of one rank and they differ; None when it is compared as it is."""
    if reference is None or port is None or len(reference) != len(port) or reference == port:
        return None
    logical_of = {physical: logical for logical, physical in enumerate(port)}
    return tuple(reference[logical_of[physical]] for physical in range(len(port)))


def describe(permutation: tuple[int, ...]) -> str:
    """'compared channels-last' for NCHW -> NHWC, else the axes moved."""
    n = len(permutation)
    if permutation == (0, *range(2, n), 1):
        return "compared channels-last"
    if permutation == (0, n - 1, *range(1, n - 1)):
        return "compared channels-first"
    return f"compared with the reference's axes in the port's order {permutation}"
