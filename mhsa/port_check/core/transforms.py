"""How a port may hold the reference's parameters: the transforms of one pairing, in one table.

A pairing is a list of `Group`s. A group joins some of the reference's parameters (neutral names,
torch's layouts) to some of the port's: the reference's arrays are combined into one by a row of
COMBINES (concatenated along their first axis, the output axis of a weight; or summed), that one is
cut along its first axis into one part per port array, and each part is laid out as its port array
by a `View` (as it is, transposed, its axes split or merged). Every transform the check knows is a
group of that form:

| transform | reference -> port | example |
|---|---|---|
| as it is | one -> one | `norm.weight` -> `norm.scale` |
| transposed | one -> one | a Linear's (out, in) weight -> a (in, out) kernel |
| head axes split or merged | one -> one | (H*d_head, D) -> a LinearGeneral kernel (D, H, d_head); (D, H*d_head) -> (H, d_head, D) |
| rows and columns interleaved | one -> one | (N*H, D) -> an Einsum kernel (N, D, H), the input between the head axes |
| split | one -> several | a fused qkv (3D, D) -> query, key, value; torch's packed gates (4H, I) -> one kernel per gate |
| concatenated | several -> one | q, k, v (D, D) each -> a fused (D, 3, H, d_head) kernel |
| summed | several -> one or more | torch's LSTM biases b_ih + b_hh -> the one bias of a JAX cell (per gate, or packed) |
| GRU biases | b_ih, b_hh -> bias (, bias_n) | torch's GRU: b_hr, b_hz summed into b_ir, b_iz; b_hn kept apart (Equinox's bias_n) or lost |
| stacked | one layer of a list -> one slice | `h.1.attn.c_proj.weight` -> `h.attn.c_proj.kernel[1]` (Group.index) |

`push` runs a group: the reference's values as the port holds them (a fresh port filled, a
converted one compared). `pull` runs it backwards, the port's arrays in the reference's names and
layouts: the exact inverse for every transform that only moves values (Group.exact), and its adjoint
for a sum (each term's gradient is the gradient of the sum), so that gradients always pull back.
tests/tools/port_check/test_transforms.py runs every row both ways.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class View:
    """How one part of the reference's combined array is laid out as one port array: as a 2-d form
    (its first `rows` axes, then the rest), transposed or not, reshaped to the port's `shape`."""

    source: tuple  # the part's shape in the reference's layout
    shape: tuple  # the port array's shape (one layer's, for a stacked group)
    transposed: bool = False  # the port's first axis is of the 2-d form's columns (a kernel's input first)
    rows: int = 1  # how many leading axes of `source` make the 2-d form's rows
    # rows and columns interleaved (Gemma's q kernel (N, D, H) for a (N*H, D) weight): the 2-d form
    # split into `split` (the rows' axes, then the columns'), its axes then in `order`; () otherwise
    split: tuple = ()
    order: tuple = ()

    def push(self, x: np.ndarray) -> np.ndarray:
        """The reference's part -> the port's array (a view where NumPy can make one)."""
        if self.order:
            return x.reshape(self.split).transpose(self.order)
        if self.transposed:
            x = x.reshape(math.prod(self.source[: self.rows]), -1).T
        return x if x.shape == self.shape else x.reshape(self.shape)

    def pull(self, y: np.ndarray) -> np.ndarray:
        """The port's array -> the reference's part (push undone)."""
        if self.order:
            return y.transpose(np.argsort(self.order)).reshape(self.source)
        if self.transposed:
            y = y.reshape(-1, math.prod(self.source[: self.rows])).T
        return y if y.shape == self.source else y.reshape(self.source)

    @property
    def _row_axes(self) -> int:
        """How many axes of `split` are the rows'."""
        rows = self.source[: self.rows]
        count, product = 0, 1
        while product < math.prod(rows):
            product *= self.split[count]
            count += 1
        return count

    @property
    def moved(self) -> bool:
        """Whether the part is laid out otherwise than as it is."""
        return self.transposed or self.shape != self.source

    def words(self) -> str:
        """'as it is', 'transposed', 'reshaped to (4, 6)', 'transposed and reshaped to (24, 4, 6)'."""
        two_d = len(self.source) == 2 and self.rows == 1
        if self.order:
            rows = len(self.split) - sum(axis >= self._row_axes for axis in self.order)
            return f"its rows split into {self.split[:rows]}, its columns into {self.split[rows:]}, laid out as {self.shape}"
        if not self.transposed:
            return "as it is" if self.shape == self.source else f"reshaped to {self.shape}"
        if two_d and self.shape == self.source[::-1]:
            return "transposed"
        return f"transposed and reshaped to {self.shape}"


def same(shape: tuple) -> View:
    """The view of a part the port holds as it is."""
    return View(tuple(shape), tuple(shape))


def transpose(shape: tuple) -> View:
    """The view of a 2-d part the port holds transposed (a Linear's weight as a Flax kernel)."""
    return View(tuple(shape), tuple(shape)[::-1], transposed=True)


@dataclass(frozen=True)
class Combine:
    """One row of COMBINES: how several reference arrays make the one that the views cut."""

    words: str
    push: Callable[[Sequence[np.ndarray], int], np.ndarray]  # (the reference's arrays, the combined size along axis 0) -> the combined array
    pull: Callable[[np.ndarray, Sequence[tuple]], list[np.ndarray]]  # (the combined array, the reference's shapes) -> one array each
    exact: bool  # pull(push(x)) == x: values pull back, not only gradients


def _concat(arrays: Sequence[np.ndarray], size: int) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)


def _unconcat(combined: np.ndarray, shapes: Sequence[tuple]) -> list[np.ndarray]:
    ends = np.cumsum([shape[0] for shape in shapes])[:-1]
    return [part.reshape(shape) for part, shape in zip(np.split(combined, ends, axis=0), shapes)]


def _sum(arrays: Sequence[np.ndarray], size: int) -> np.ndarray:
    total = np.array(arrays[0], copy=True)
    for array in arrays[1:]:
        total += array
    return total


def _unsum(combined: np.ndarray, shapes: Sequence[tuple]) -> list[np.ndarray]:
    return [combined.reshape(shape) for shape in shapes]  # the adjoint: every term gets the sum's gradient


def _gru(arrays: Sequence[np.ndarray], size: int) -> np.ndarray:
    """torch GRU's (b_ih, b_hh), gates r, z, n -> [b_ir + b_hr, b_iz + b_hz, b_in] and, where the port
    has room for it (size 4H: Equinox's bias_n), b_hn after them."""
    b_ih, b_hh = arrays
    hidden = b_ih.shape[0] // 3
    parts = [b_ih[: 2 * hidden] + b_hh[: 2 * hidden], b_ih[2 * hidden :]]
    return np.concatenate(parts + ([b_hh[2 * hidden :]] if size > 3 * hidden else []))


def _ungru(combined: np.ndarray, shapes: Sequence[tuple]) -> list[np.ndarray]:
    """The adjoint of _gru: b_ih gets the first 3H; b_hh the r and z thirds, and b_hn's part where the
    port holds one (else 0: the port has no parameter there)."""
    hidden = shapes[0][0] // 3
    b_hn = combined[3 * hidden :] if combined.shape[0] > 3 * hidden else np.zeros(hidden, combined.dtype)
    return [np.array(combined[: 3 * hidden]), np.concatenate([combined[: 2 * hidden], b_hn])]


COMBINES = {
    "concat": Combine("concatenated", _concat, _unconcat, exact=True),
    "sum": Combine("summed", _sum, _unsum, exact=False),
    "gru": Combine("as torch's GRU biases (b_hr, b_hz summed into the input's)", _gru, _ungru, exact=False),
}


@dataclass(frozen=True)
class Group:
    """Some of the reference's parameters and the port's arrays that hold them (the module docstring)."""

    reference: tuple[str, ...]
    port: tuple[str, ...]
    views: tuple[View, ...]  # one per port array
    shapes: tuple[tuple, ...]  # the reference's arrays' shapes
    combine: str = "concat"  # a row of COMBINES
    index: int | None = None  # the slice of every port array's first axis this group holds (a stacked layer); None: the whole arrays
    found: str = "name"  # the pairing rule that found it (forward/pairing.py: "map", "name", "convention", "cells", "structure")

    def push(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The reference's arrays (in `reference`'s order) -> one array per port name (one layer's slice for a stacked group)."""
        combined = COMBINES[self.combine].push(arrays, sum(view.source[0] for view in self.views))
        out, start = [], 0
        for view in self.views:
            part = combined[start : start + view.source[0]] if len(self.views) > 1 else combined
            start += view.source[0]
            out.append(view.push(part))
        return out

    def pull(self, arrays: Sequence[np.ndarray], sliced: bool = False) -> list[np.ndarray]:
        """The port's whole arrays (in `port`'s order; the group's slice of each already, if
        `sliced`) -> one array per reference name: their values where the group is exact, their
        adjoint (gradients) otherwise."""
        if self.index is not None and not sliced:
            arrays = [array[self.index] for array in arrays]
        parts = [view.pull(array) for view, array in zip(self.views, arrays)]
        combined = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        return COMBINES[self.combine].pull(combined, self.shapes)

    @property
    def exact(self) -> bool:
        """Whether the port's values pull back exactly (every transform but a sum)."""
        return COMBINES[self.combine].exact

    @property
    def moved(self) -> bool:
        """Whether anything but a rename joins the two sides (a transposed kernel, a split, a sum ...)."""
        return len(self.reference) > 1 or len(self.port) > 1 or self.index is not None or any(view.moved for view in self.views)

    def port_names(self) -> str:
        """'attn.qkv.kernel', 'h.attn.c_proj.kernel[1]', 'attn.query.kernel, attn.key.kernel, attn.value.kernel'."""
        index = "" if self.index is None else f"[{self.index}]"
        return ", ".join(name + index for name in self.port)

    def words(self) -> str:
        """How the group is read, in words: 'transposed', 'split in 3 along its first axis, each
        transposed and reshaped to (24, 4, 6)', 'summed, then split in 4 ...'."""
        how = []
        if len(self.reference) > 1:
            how.append(COMBINES[self.combine].words)
        if len(self.views) > 1:
            how.append(f"split in {len(self.views)} along its first axis")
        layouts = sorted({view.words() for view in self.views})
        if layouts != ["as it is"] or not how:
            how.append(("each " if len(self.views) > 1 else "") + " or ".join(layouts))
        if self.index is not None:
            how.append(f"stacked at index {self.index} of the port's first axis")
        return ", ".join(how)


def one(reference: str, port: str, view: View, found: str = "name", index: int | None = None) -> Group:
    """A group of one parameter on each side."""
    return Group((reference,), (port,), (view,), (view.source,), index=index, found=found)


def flat(shape: tuple, rows: int) -> tuple[int, int]:
    """The 2-d form of `shape`: its first `rows` axes, then the rest (a 1-d shape is (n, 1))."""
    return math.prod(shape[:rows]), math.prod(shape[rows:])


def views(source: tuple, shape: tuple, kernel: bool | None) -> list[View]:
    """Every way a reference part of shape `source` (torch's layout: its first axis the output's) can
    be laid out as a port array of `shape`, most likely first. kernel: whether the port's array is in
    Flax's kernel convention (input axes first: True), torch's (output axes first: False) or unknown
    (None). A reshape never mixes the 2-d form's rows with its columns: (H*d_head, D) may become
    (H, d_head, D) or, transposed, (D, H, d_head), never (D, d_head, H)."""
    source, shape = tuple(source), tuple(shape)
    if math.prod(source) != math.prod(shape):
        return []
    if len(source) <= 1 or len(shape) <= 1:  # a vector: reshaped only (a bias (H*d_head,) held as (H, d_head))
        vectors = sum(size > 1 for size in source) <= 1 and sum(size > 1 for size in shape) <= 1
        return [View(source, shape)] if len(source) <= 1 and len(shape) >= 1 or vectors else []
    prefixes = {math.prod(shape[:cut]) for cut in range(len(shape) + 1)}
    found: list[View] = []
    for rows in range(1, len(source)):
        a, b = flat(source, rows)
        if a in prefixes and not any(not view.transposed for view in found):  # rows first: as it is, or its axes split or merged
            found.append(View(source, shape, False, rows))
        if b in prefixes:  # columns first: transposed
            found.append(View(source, shape, True, rows))
    if not found:  # a head-shaped kernel with the input between its head axes
        found = _interleaved(source, shape)
    if kernel is not None:  # the port's convention first
        found.sort(key=lambda view: view.transposed != kernel)
    return found


def _interleaved(source: tuple, shape: tuple) -> list[View]:
    """The views that give each axis of `shape` to the 2-d form's rows or its columns, each side's
    axes in their own order, the two interleaved: (N*H, D) as (N, D, H), a fused (2*K*H, D) as
    (2, K, D, H). Only where neither the rows-first nor the columns-first form fits."""
    found: dict[tuple, View] = {}
    for rows in range(1, len(source)):
        a, b = flat(source, rows)
        for mask in itertools.product((True, False), repeat=len(shape)):  # True: the axis is the rows'
            row_axes = [n for n, is_row in enumerate(mask) if is_row]
            column_axes = [n for n, is_row in enumerate(mask) if not is_row]
            if not row_axes or not column_axes or row_axes[-1] < column_axes[0] or column_axes[-1] < row_axes[0]:
                continue  # all rows first, or all columns first: the plain views
            if math.prod(shape[n] for n in row_axes) != a or math.prod(shape[n] for n in column_axes) != b:
                continue
            split = tuple(shape[n] for n in row_axes + column_axes)
            order = tuple(int(n) for n in np.argsort(row_axes + column_axes))
            view = View(source, shape, transposed=not mask[0], rows=rows, split=split, order=order)
            found.setdefault(_moves(split, order), view)  # a size-1 axis given to either side moves nothing
    return [view for key, view in found.items() if key != _moves((math.prod(source),), (0,))]


def _moves(split: tuple, order: tuple) -> tuple:
    """What a reshape to `split` then a transpose to `order` does to the values, whatever the axes of
    size 1 and the axes that stay neighbours: the runs of `split`'s axes, in the port's order."""
    rank = {axis: n for n, axis in enumerate(axis for axis in range(len(split)) if split[axis] > 1)}
    kept = [rank[axis] for axis in order if axis in rank]
    split = tuple(size for size in split if size > 1)
    runs: list[list[int]] = []
    for axis in kept:
        if runs and axis == runs[-1][-1] + 1:
            runs[-1].append(axis)
        else:
            runs.append([axis])
    return tuple((math.prod(split[axis] for axis in run), run[0]) for run in runs) if len(runs) > 1 else ()
