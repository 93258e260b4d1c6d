"""The reference's parameters against the port's, once paired (forward/pairing.py): compared in
the port's layout, and either copied into the port or left as the user's converter wrote them.

By default the port is checked as it is, with the user's own converter (`decide`), when at least one
parameter whose reference values are not constant holds them or a recognisable transform of them
(its transpose, a scaled copy, its rows in another order, a flipped kernel): a converter has run,
and copying over it would hide exactly the bugs it may have (a forgotten transpose passes once
overwritten), while a fresh port holds none of the reference's values. A parameter whose reference
values are constant (a fresh norm's ones, a zero bias) counts for neither: both start it alike.
"""

from __future__ import annotations

import numpy as np

from mhsa.port_check.core import transforms
from mhsa.port_check.core.chunks import BLOCK, blocks, dot, equal, largest, largest_abs, varies, within
from mhsa.port_check.core.records import Differing, Transfer
from mhsa.port_check.core.transforms import Group
from mhsa.port_check.forward import pairing
from shared.tolerances import max_abs_diff

SEARCHED = 16  # differing parameters searched for a transform while none has shown a converter ran
SMOOTH = 0.5  # the mean correlation of neighbouring rows above which a table is deterministic


def tables(source_params, frozen: frozenset[str] | set[str]) -> set[str]:
    """The reference's parameters that are no evidence of a conversion, since a fresh port can hold
    their values without one: those whose rows vary smoothly, and those it does not train (a frozen
    sinusoidal position table; only while it trains others: a model frozen whole says nothing)."""
    trained = set(source_params) - set(frozen)
    found = set(frozen) & set(source_params) if trained else set()
    return found | {name for name, value in source_params.items() if _smooth(value)}


def _smooth(value: np.ndarray) -> bool:
    """Whether a 2-d array's neighbouring rows are correlated, column by column, on average over
    SMOOTH (sin and cos of a position: about 0.8 and more; random values: about 0)."""
    if value.ndim != 2 or value.shape[0] < 8 or value.shape[1] < 2 or value.size > 1 << 22:
        return False
    rows = value.astype(np.float64)
    a, b = rows[:-1] - rows[:-1].mean(0), rows[1:] - rows[1:].mean(0)
    norms = np.sqrt((a * a).sum(0) * (b * b).sum(0))
    varying = norms > 0
    if not varying.any():
        return False
    return float(np.mean((a * b).sum(0)[varying] / norms[varying])) > SMOOTH


def compare_values(report: Transfer, source_params, target_params, tol: float, keep: bool = False, no_evidence=frozenset()) -> int:
    """Fill report.differing with every group whose port arrays hold other values than the
    reference's laid out as the group says (and how), and return the evidence that a converter
    ran: how many parameters with non-constant reference values the port holds as the group lays
    them out, or as a recognisable transform of that. Without evidence, only the first SEARCHED
    differing groups are searched for a transform (a fresh large port is not searched one by one),
    and report.differing stays empty unless `keep` (--no-transfer). no_evidence: as tables() gives."""
    evidence, differing = 0, []
    for group in report.groups:
        references = [source_params[name] for name in group.reference]
        informative = any(name not in no_evidence and varies(value) for name, value in zip(group.reference, references))
        expected, actual = group.push(references), held(group, target_params)
        varied = all(varies(value) for value in actual)
        if all(equal(a, b) or within(max_abs_diff, tol, a, b) for a, b in zip(expected, actual)):
            evidence += len(group.reference) if informative and varied else 0
        else:
            differing.append((group, references, expected, actual, informative))
    found = []
    for index, (group, references, expected, actual, informative) in enumerate(differing):
        how = _group_differs(group, references, expected, actual, tol) if evidence or index < SEARCHED else None
        evidence += informative and how is not None
        found.append((group, expected, actual, how))
    if evidence or keep:  # the port is kept: every difference is said, with its size
        for group, expected, actual, how in found:
            diff = max(largest(max_abs_diff, a, b) for a, b in zip(expected, actual))
            name = group.reference[0] if len(group.reference) == 1 else ", ".join(group.reference)
            report.differing.append(Differing(name, diff, how or f"differs by {diff:.2e}", group))
    return evidence


def held(group: Group, arrays: dict) -> list[np.ndarray]:
    """The port's arrays of a group (one layer's slice of each, for a stacked group)."""
    return [arrays[name] if group.index is None else arrays[name][group.index] for name in group.port]


def _group_differs(group: Group, references, expected, actual, tol: float) -> str | None:
    """How the port's arrays of a group differ from the reference's laid out as the group says, in
    words; None when no transform explains it. A group of one array each: how_it_differs; a split or
    concatenation: which part each port array holds, where they hold the reference's parts in
    another order; a group's arrays each searched otherwise."""
    if len(expected) > 1:
        swapped = _parts_swapped(group, expected, actual, tol)
        if swapped is not None:
            return swapped
    view = group.views[0]
    plain = len(view.source) == 2 and view.shape in (view.source, view.source[::-1])  # a 2-d transpose: how_it_differs says it best
    if len(group.views) == 1 and len(group.reference) == 1 and not plain:  # laid out another way that fits the shapes (untransposed, say)
        for other in transforms.views(view.source, view.shape, None):
            if other != view and within(max_abs_diff, tol, other.push(references[0]), actual[0]):
                return f"holds the reference's values {other.words()} where the names' conventions lay them out {view.words()}"
    if group.exact and len(group.reference) == 1:
        pulled = group.pull(actual, sliced=True)[0]
        how = how_it_differs(references[0], pulled, tol)
        if how is not None:
            return how
    if len(expected) == 1:
        return how_it_differs(expected[0], actual[0], tol)
    for port, a, b in zip(group.port, expected, actual):
        if not within(max_abs_diff, tol, a, b):
            how = how_it_differs(a, b, tol)
            return None if how is None else f"is held otherwise in {port}: {how}"
    return None


def _parts_swapped(group: Group, expected, actual, tol: float) -> str | None:
    """'is held with its parts in another order: attn.key.kernel holds part 3 of 3, attn.value.kernel's; ...':
    where the port's arrays of a split (or concatenation) hold the reference's parts in another
    order; None otherwise."""
    if len({a.shape for a in expected}) != 1:
        return None
    holds = {}
    for n, b in enumerate(actual):
        match = [k for k, a in enumerate(expected) if a.shape == b.shape and within(max_abs_diff, tol, a, b)]
        if len(match) != 1:
            return None
        holds[n] = match[0]
    if all(n == k for n, k in holds.items()):
        return None
    count = len(expected)
    moved = [f"{group.port[n]} holds part {k + 1} of {count}, {group.port[k]}'s" for n, k in holds.items() if n != k]
    return "is held with its parts in another order: " + "; ".join(moved)


def how_it_differs(reference: np.ndarray, port: np.ndarray, tol: float) -> str | None:
    """The transform of the reference's values the port holds, in words; None when it is none of
    them. Checked: transpose, a scale, rows (or columns, or values) in another order, a kernel
    flipped along its spatial axes, spatial axes swapped, in and out channels swapped, rounding."""
    if not (np.all(np.isfinite(reference)) and np.all(np.isfinite(port))):
        return None
    close = lambda a: a.shape == port.shape and within(max_abs_diff, tol, a, port)  # noqa: E731
    if reference.ndim == 2 and close(reference.T):
        return "holds its transpose"
    scale = _scale(reference, port)
    if scale is not None and close(scale * reference):
        return f"scaled by {scale:.6g}{_as_root(scale)}"
    for axis, what in ((0, "rows"), (1, "columns")):
        if reference.ndim > axis:
            order = _reordering(reference, port, axis, tol)
            if order is not None:
                what = "values" if reference.ndim == 1 else what
                first, _, later = order.partition(", from ")
                if later:  # the first places agree: the sentence starts where they part
                    start = int(later.split()[0])
                    return f"holds the reference's {what} in another order (the port's {what} {start}, {start + 1}, ... are its {first})"
                return f"holds the reference's {what} in another order (the port's {what} 0, 1, 2, ... are its {order})"
    if reference.ndim >= 3:
        spatial = tuple(range(2, reference.ndim))
        if close(np.flip(reference, axis=spatial)):
            return "holds the kernel flipped along its spatial axes"
        if reference.ndim == 4 and close(reference.swapaxes(2, 3)):
            return "holds the kernel with its two spatial axes swapped"
        if close(reference.swapaxes(0, 1)):
            return "holds the kernel with its in and out channels swapped"
    scale_of = largest_abs(reference) or 1.0
    if within(max_abs_diff, 1e-2 * scale_of, reference, port):
        relative = largest(max_abs_diff, reference, port) / scale_of
        return f"close to the reference's values but not within tolerance ({relative:.1e} relative): rounded through a lower precision?"
    return None


def _scale(reference, port) -> float | None:
    """The least-squares s of port ~ s * reference, or None unless the first block fits one (a fresh port's random values end there)."""
    if reference.shape != port.shape or reference.size == 0:
        return None
    first = next(blocks(reference.shape))
    a, b = reference[first], port[first]
    head = dot(a, a)
    if head > 0 and not within(max_abs_diff, 1e-3 * largest_abs(a), dot(b, a) / head * a, b):
        return None  # a scaled copy fits one scale in every block, the first included
    norm = dot(reference, reference)
    if norm == 0:
        return None
    scale = dot(port, reference) / norm
    return None if abs(scale) < 1e-6 or abs(scale - 1) < 1e-6 else scale


def _as_root(scale: float) -> str:
    """' (1/sqrt(16))' when a scale is one over the square root of a small integer (an attention scale)."""
    if scale <= 0:
        return ""
    square = 1 / scale**2
    return f" (1/sqrt({round(square)}))" if 1 < round(square) <= 4096 and abs(square - round(square)) < 1e-3 else ""


def _reordering(reference, port, axis, tol) -> str | None:
    """'3, 0, 4, ...': which of the reference's slices along `axis` the port's slices are, when the
    port holds the same slices in another order; None otherwise. Slices are sorted by a random
    projection (one pass over the values, not a lexicographic sort of every column)."""
    a, b = np.moveaxis(reference, axis, 0), np.moveaxis(port, axis, 0)
    if a.shape != b.shape or a.shape[0] < 2:
        return None
    if abs(float(a.max()) - float(b.max())) > tol or abs(float(a.min()) - float(b.min())) > tol:
        return None  # slices in another order hold the same values: a fresh port's random ones end here
    direction = np.random.default_rng(0).standard_normal(int(np.prod(a.shape[1:])))
    projections = [_project(x, direction) for x in (a, b)]
    order_a, order_b = (np.argsort(p, kind="stable") for p in projections)
    # slices equal within tol project within tol * sum |direction|: most candidates end here, in one pass
    if not within(max_abs_diff, tol * float(np.abs(direction).sum()), projections[0][order_a], projections[1][order_b]):
        return None
    step = max(1, BLOCK // max(1, direction.size))
    for start in range(0, len(order_a), step):
        rows = slice(start, start + step)
        if not within(max_abs_diff, tol, a[order_a[rows]], b[order_b[rows]]):
            return None
    source_of = np.empty_like(order_b)
    source_of[order_b] = order_a  # the port's slice i is the reference's slice source_of[i]
    if np.array_equal(source_of, np.arange(len(source_of))):
        return None
    start = int(np.flatnonzero(source_of != np.arange(len(source_of)))[0])  # where the orders part: the places before agree
    shown = ", ".join(str(int(i)) for i in source_of[start : start + 6]) + (", ..." if len(source_of) > start + 6 else "")
    return shown if start == 0 else f"{shown}, from {start} on"


def _project(slices: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """(n,) the projection of each of the n slices (along the first axis) onto `direction`, in float64, block by block."""
    step = max(1, BLOCK // max(1, direction.size))
    return np.concatenate([slices[i : i + step].reshape(-1, direction.size).astype(np.float64) @ direction for i in range(0, len(slices), step)])


def decide(report: Transfer, evidence: int, informative: int, transfer: bool | None) -> bool:
    """Whether to copy the reference's weights into the port (see the module's docstring); sets
    report.copied and report.decision, the sentence the report prints."""
    if transfer is not None:
        report.copied = transfer
        report.decision = "copied from the reference (--transfer)" if transfer else "the port's own weights checked (--no-transfer)"
        return transfer
    report.copied = evidence == 0
    if report.copied:
        report.decision = (
            f"a fresh port: none of the {informative} parameters whose reference values are not constant hold them (--no-transfer checks its own)"
        )
    else:
        report.decision = (
            f"the port holds converted weights ({evidence} of {informative} parameters hold the reference's values or a transform of them): "
            "checked as it is, your converter with it (--transfer copies the reference's)"
        )
    return report.copied


def informative_count(report: Transfer, source_params, no_evidence=frozenset()) -> int:
    """How many paired parameters have reference values that are not constant (and are no table)."""
    return sum(name not in no_evidence and varies(source_params[name]) for name in report.paired)


def arrays_to_copy(report: Transfer, source_params, target_params) -> dict[str, np.ndarray]:
    """{port name: the reference's arrays laid out as the port holds them} for every group (a stacked
    array assembled from its layers')."""
    shapes = {name: tuple(target_params[name].shape) for group in report.groups for name in group.port}
    return pairing.push(report.groups, source_params, shapes)
