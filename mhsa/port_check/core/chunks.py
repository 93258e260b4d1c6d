"""Reductions over large arrays in blocks of 65,536 elements, so that comparing a
124M-parameter model's weights, outputs and gradients never makes a float64 copy of a whole array
(shared.tolerances converts what it compares to float64: for GPT-2 small's logits, 1024 x 50257
float32, that is 400 MB per copy, several per comparison).

Every reduction here is the largest of its blocks' results, so `largest(max_abs_diff, a, b)` is
exactly `max_abs_diff(a, b)` (same NaN and infinity rules), in a block's worth of memory; `within`
stops at the first block beyond the tolerance, which makes a search for a transform of a fresh
port's random weights cost one block per transform tried."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

# elements per block: 512 KB of float64, so that a block's temporaries stay in the cache and their
# memory is reused from block to block (temporaries of megabytes are fresh pages each time)
BLOCK = 1 << 16


def blocks(shape: tuple[int, ...], size: int = BLOCK) -> Iterator[tuple]:
    """Index tuples that cut an array of `shape` into views of at most about `size` elements (at
    least one row of the last axes that fit), in order; one empty tuple for an array that fits."""
    inner, axis = 1, len(shape)
    while axis > 0 and inner * shape[axis - 1] <= size:
        inner *= shape[axis - 1]
        axis -= 1
    if axis == 0:
        yield ()
        return
    step = max(1, size // inner)
    for outer in np.ndindex(*shape[: axis - 1]):
        for start in range(0, shape[axis - 1], step):
            yield (*outer, slice(start, start + step))


def largest(reduce: Callable[..., float], *arrays: np.ndarray, size: int = BLOCK) -> float:
    """max over blocks of reduce(*the arrays' blocks), the arrays broadcast together first (as
    views); 0.0 for empty arrays. Exact for any reduction that is a maximum over elements."""
    views = np.broadcast_arrays(*(np.asarray(array) for array in arrays))
    return max((reduce(*(view[index] for view in views)) for index in blocks(views[0].shape, size)), default=0.0)


def within(reduce: Callable[..., float], tol: float, *arrays: np.ndarray, size: int = BLOCK) -> bool:
    """Whether largest(reduce, *arrays) <= tol, stopping at the first block beyond it."""
    views = np.broadcast_arrays(*(np.asarray(array) for array in arrays))
    return all(reduce(*(view[index] for view in views)) <= tol for index in blocks(views[0].shape, size))


def equal(a: np.ndarray, b: np.ndarray, size: int = BLOCK) -> bool:
    """Whether two arrays of one shape hold the same values, stopping at the first block that
    differs: a converted port's weights usually do, and this pass is several times cheaper than
    measuring a gap of 0 in float64 (a NaN is never equal: the gap's rules settle it)."""
    return a.shape == b.shape and all(np.array_equal(a[index], b[index]) for index in blocks(a.shape, size))


def varies(array: np.ndarray, size: int = BLOCK) -> bool:
    """Whether an array holds more than one value within one of its blocks (as np.ptp(array) > 0,
    but a block holding a NaN shows nothing), stopping at the first block that shows two: the first, as a rule."""
    return array.size > 1 and any(np.ptp(array[index]) > 0 for index in blocks(array.shape, size))


def dot(a: np.ndarray, b: np.ndarray, size: int = BLOCK) -> float:
    """sum(a * b) over every element, accumulated in float64 block by block (arrays of one shape)."""
    return float(sum(np.vdot(a[index].astype(np.float64), b[index].astype(np.float64)) for index in blocks(a.shape, size)))


def largest_abs(array: np.ndarray, size: int = BLOCK) -> float:
    """max |array| of an array without NaN; 0.0 for an empty one."""
    return largest(lambda block: float(np.max(np.abs(block))) if block.size else 0.0, array, size=size)
