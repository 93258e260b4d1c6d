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

import math

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


def _refines(a: tuple, b: tuple) -> bool:
    """Whether shapes `a` and `b` are one shape with some axes split (or merged): walked together,
    every run of axes whose sizes multiply alike is a single axis on one side or the other (axes of
    size 1 aside), and the first axis (the batch) is its own run on both. (2, 6, 96) and (2, 6, 3,
    4, 8) are; (3, 12, 35) and (3, 5, 7, 12) are not: their last runs mix the channels with the
    positions."""
    i = j = 0
    runs = []
    while i < len(a) or j < len(b):
        run_a: list[int] = []
        run_b: list[int] = []
        x = y = 1
        while True:
            if x <= y and i < len(a) and (x < y or not run_a or x == y == 1):
                x, i = x * a[i], i + 1
                run_a.append(a[i - 1])
            elif y < x and j < len(b):
                y, j = y * b[j], j + 1
                run_b.append(b[j - 1])
            elif x == y and (run_a or run_b):
                break
            elif j < len(b):
                y, j = y * b[j], j + 1
                run_b.append(b[j - 1])
            else:
                return False
        runs.append((sum(size > 1 for size in run_a), sum(size > 1 for size in run_b)))
    if any(sides[0] > 1 and sides[1] > 1 for sides in runs):
        return False
    return not runs or (a[:1] == b[:1] and max(runs[0]) <= 1)


def reshapings(reference: tuple, port: tuple) -> list[tuple[str, tuple[int, ...] | None]]:
    """The ways a reference output of shape `reference` can be read as a port output of shape
    `port` holding the same values: [(how, the reference's axes moved first or None)], most
    likely first: its axes split or merged as they are (heads (B, T, H*d) against (B, T, H, d)),
    or after its channels move last or first ((B, C, H*W) against (B, H, W, C)). None where the
    sizes differ or no such reading exists (the shapes are then refused)."""
    if reference == port or math.prod(reference) != math.prod(port):
        return []
    found: list[tuple[str, tuple[int, ...] | None]] = []
    if _refines(reference, port):
        found.append((f"compared after a reshape ({_shape(reference)} as {_shape(port)})", None))
    n = len(reference)
    if n >= 3:
        last = (0, *range(2, n), 1)  # the channels (axis 1) last
        moved = tuple(reference[axis] for axis in last)
        if _refines(moved, port):
            found.append((f"compared channels-last after a reshape ({_shape(reference)} as {_shape(port)})", last))
        first = (0, n - 1, *range(1, n - 1))  # the channels (the last axis) first
        moved = tuple(reference[axis] for axis in first)
        if first != last and _refines(moved, port):
            found.append((f"compared channels-first after a reshape ({_shape(reference)} as {_shape(port)})", first))
    return found


def _shape(shape: tuple) -> str:
    return "(" + ", ".join(str(size) for size in shape) + ")"
