"""The reference's parameters against the port's: paired by name, shape-checked, compared in one
layout, and either copied into the port or left as the user's converter wrote them.

By default the port is checked as it is, with the user's own converter (`decide`), when at least one
parameter whose reference values are not constant holds them or a recognisable transform of them
(its transpose, a scaled copy, its rows in another order, a flipped kernel): a converter has run,
and copying over it would hide exactly the bugs it may have (a forgotten transpose passes once
overwritten), while a fresh port holds none of the reference's values. A parameter whose reference
values are constant (a fresh norm's ones, a zero bias) counts for neither: both start it alike.

Layouts: the readers give both sides in torch's state_dict layout. Where one side's layer is not a
standard one (a library's Conv1D that stores a linear weight (in, out), a raw matrix used as x @ W)
and a non-square weight fits only transposed, every 2-d weight of that pair of layer types is taken
transposed (square ones included), and the report says what it inferred and from which parameter.
"""

from __future__ import annotations

import numpy as np

from mhsa.port_check.core.chunks import BLOCK, blocks, dot, largest, largest_abs, within
from mhsa.port_check.core.records import Differing, Mismatched, Paired, Transfer, map_name
from shared.tolerances import max_abs_diff

# the layer types whose layouts the readers convert: a pair of these that fits only transposed is a bug of the port
STANDARD = ("Linear", "Embedding", "Conv", "LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm")
# the names one kind of parameter goes by: torch's weight, Flax's kernel, scale and embedding, the
# gamma and beta of older code; weight norm's two factors
CONVENTIONAL = (("weight", "kernel", "scale", "embedding", "gamma"), ("bias", "beta"), ("weight_g", "g"), ("weight_v", "v"))
SEARCHED = 16  # differing parameters searched for a transform while none has shown a converter ran
SMOOTH = 0.5  # the mean correlation of neighbouring rows above which a table is deterministic


def _module(name: str) -> str:
    return name.rpartition(".")[0]


def pair_parameters(source_params, target_params, source_desc, target_desc, name_map=None, sides=("torch", "jax")) -> Transfer:
    """Pair every reference parameter with the port's by name (through name_map) and shape.
    source_params, target_params: {neutral name: array}; *_desc: the readers' describe (the layer
    types, for the layout inference); sides: the two readers' names, for the report."""
    report = Transfer(sides=sides)
    mapped_names = [(name, map_name(name, name_map)) for name in source_params]
    candidates = [(name, mapped) for name, mapped in mapped_names if mapped in target_params]
    unpaired = [name for name, mapped in mapped_names if mapped not in target_params]
    renamed, report.ambiguous = _renamed(unpaired, target_params, {mapped for _, mapped in candidates}, source_params, name_map)
    candidates += renamed
    kernels = {pair for pair in renamed if pair[1].rpartition(".")[2] == "kernel"}  # Flax's convention: (in, out)
    paired = dict(renamed)
    report.unconsumed_source = [name for name in unpaired if name not in paired]
    consumed = {mapped for _, mapped in candidates}
    report.unconsumed_target = [name for name in target_params if name not in consumed]
    described = [
        (name, mapped, source_params[name], target_params[mapped].shape, (_type_of(source_desc, name), _type_of(target_desc, mapped)))
        for name, mapped in candidates
    ]
    transposed_types = _transposed_types(described, report)
    for name, mapped, value, expected, kinds in described:
        if value.ndim == 2 and (kinds in transposed_types or (name, mapped) in kernels) and value.T.shape == expected:
            report.filled.append(Paired(name, mapped, value.shape, transposed=True))
        elif value.ndim == 2 and kinds in transposed_types:
            report.mismatched.append(Mismatched(name, mapped, value.T.shape, expected))
        elif value.shape == expected:
            report.filled.append(Paired(name, mapped, value.shape))
        elif value.ndim == 2 and value.T.shape == expected:
            report.transposed_only.append(Paired(name, mapped, value.shape, transposed=True))
        else:
            report.mismatched.append(Mismatched(name, mapped, value.shape, expected))
    return report


def _renamed(unpaired, target_params, consumed, source_params, name_map) -> tuple[list[tuple[str, str]], list[tuple[str, list[str]]]]:
    """([(reference name, port name)] for the parameters unpaired by name that a conventional rename
    pairs: in the module the name map gives, the one unpaired port parameter of the same kind
    (CONVENTIONAL) whose shape fits, as it is or transposed; [(reference name, the port's
    candidates)] where there are several: ambiguous, paired by no rule)."""
    left = [name for name in target_params if name not in consumed]
    by_module: dict[str, list[str]] = {}
    for name in left:
        by_module.setdefault(_module(name), []).append(name)
    found, ambiguous, taken = [], [], set()
    for name in unpaired:
        module, leaf = _module(name), name.rpartition(".")[2]
        kind = next((names for names in CONVENTIONAL if leaf in names), None)
        if kind is None:
            continue
        target_module = _module(map_name(name, name_map)) if module else ""
        options = [other for other in by_module.get(target_module, []) if other.rpartition(".")[2] in kind and other not in taken]
        value = source_params[name]
        fits = [other for other in options if target_params[other].shape in (value.shape, value.T.shape)]
        siblings = [other for other in unpaired if _module(other) == module and other.rpartition(".")[2] in kind]
        if len(fits) == 1 and len(options) == 1 and len(siblings) == 1:
            found.append((name, fits[0]))
            taken.add(fits[0])
        elif fits:
            ambiguous.append((name, fits))
    return found, ambiguous


def _type_of(desc, name) -> str:
    info = desc.get(_module(name))
    return info.kind if info is not None else ""


def _transposed_types(described, report) -> set[tuple[str, str]]:
    """The (reference type, port type) pairs whose 2-d weights are laid out transposed: a pair
    where one side is not a standard layer and a non-square weight fits only transposed."""
    found = set()
    for name, mapped, value, expected, kinds in described:
        standard = kinds[0] in STANDARD and kinds[1] in STANDARD
        if not standard and kinds not in found and value.ndim == 2 and value.shape != expected and value.T.shape == expected:
            found.add(kinds)
            report.layouts.append(
                f"{kinds[0] or '?'} in {report.sides[0]} / {kinds[1] or '?'} in {report.sides[1]}: 2-d weights taken transposed "
                f"('{name}' {value.shape} fits '{mapped}' {expected} only so)"
            )
    return found


def _view(value: np.ndarray, transposed: bool) -> np.ndarray:
    return value.T if transposed else value


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
    """Fill report.differing with every paired parameter the port holds other values of (and how),
    and return the evidence that a converter ran: how many parameters with non-constant reference
    values hold them or a recognisable transform of them. Without evidence, only the first SEARCHED
    differing ones are searched for a transform (a fresh large port is not searched one by one), and
    report.differing stays empty unless `keep` (--no-transfer). no_evidence: as tables() gives."""
    evidence, differing = 0, []
    for pair in report.filled:
        name, reference, port = pair.reference, _view(source_params[pair.reference], pair.transposed), target_params[pair.port]
        informative = bool(name not in no_evidence and reference.size > 1 and np.ptp(reference) > 0 and np.ptp(port) > 0)
        if within(max_abs_diff, tol, reference, port):
            evidence += informative
        else:
            differing.append((name, reference, port, informative))
    found = []
    for index, (name, reference, port, informative) in enumerate(differing):
        how = how_it_differs(reference, port, tol) if evidence or index < SEARCHED else None
        evidence += informative and how is not None
        found.append((name, reference, port, how))
    if evidence or keep:  # the port is kept: every difference is said, with its size
        for name, reference, port, how in found:
            diff = largest(max_abs_diff, reference, port)
            report.differing.append(Differing(name, diff, how or f"differs by {diff:.2e}"))
    return evidence


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
    shown = ", ".join(str(int(i)) for i in source_of[:6])
    return shown + (", ..." if len(source_of) > 6 else "")


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
    return sum(name not in no_evidence and source_params[name].size > 1 and np.ptp(source_params[name]) > 0 for name, *_ in report.filled)


def arrays_to_copy(report: Transfer, source_params) -> dict[str, np.ndarray]:
    """{port name: the reference's array in the port's layout} for every paired parameter."""
    return {pair.port: _view(source_params[pair.reference], pair.transposed) for pair in report.filled}
