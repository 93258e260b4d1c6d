"""The table's rows: every output leaf of every call, paired across the two models, compared; then
every parameter's gradient.

Calls pair by module path (through the name map) and call number; within a call, leaves by their
place in the output ("[0]", "[logits]"), or by position where the two structures differ but hold as
many floating-point leaves. Two outputs are laid out alike by what computed them (core/layouts.py:
torch's convolutions NCHW, Flax's NHWC), not by their shapes, which agree at C = H = W; where one
side's layout is unknown (a model run eagerly), the channels move only when that is the one
arrangement whose shapes agree. Shapes that still differ are compared after broadcasting where they
broadcast (position embeddings computed once for the batch, (1, T, D), against per row, (B, T, D));
only shapes that cannot broadcast fail, as a shape, never as a number. NaN in either output fails
its row, also NaN on both sides at the same places. A leaf one side returns as None and the other as
an array is no row: it is named in a note. Each row keeps both sides' own float32 errors
(forward/derived.py), so that the port's can join once measured (`rejudge`).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from mhsa.comparison import held
from mhsa.port_check.core import layouts
from mhsa.port_check.core.chunks import largest, largest_abs
from mhsa.port_check.core.records import Row, map_name
from mhsa.port_check.core.structure import Output
from mhsa.port_check.forward import precision
from shared.tolerances import finite_gap, max_abs_diff, tolerance


def compare_arrays(a: np.ndarray, b: np.ndarray, sides: tuple[str, str], axes=(None, None)) -> tuple[float, float, str, str]:
    """(max abs, max abs / max |reference|, status, note) of reference `a` against port `b`, each
    laid out as `axes` says (core/layouts.py); status "" (a number), "shape" (no broadcast makes them
    comparable) or "nan"."""
    note = ""
    permutation = layouts.order(*axes)
    if permutation is not None and a.ndim == len(permutation):
        a, note = a.transpose(permutation), layouts.describe(permutation)
    elif a.shape != b.shape and None in axes and a.ndim >= 3 and np.moveaxis(a, 1, -1).shape == b.shape:
        a, note = np.moveaxis(a, 1, -1), "compared channels-last (one side's layout is unknown; only that arrangement fits)"
    if a.shape != b.shape:
        try:
            shape = np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            readings = layouts.reshapings(a.shape, b.shape)
            if not readings:
                why = f"shape {a.shape} in {sides[0]}, {b.shape} in {sides[1]}: no reshape or broadcast joins them"
                return float("nan"), float("nan"), "shape", why
            a, note = _read_as(a, b, readings)
        else:
            note = f"compared after broadcasting: {a.shape} in {sides[0]}, {b.shape} in {sides[1]}"
            a, b = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
    diff = largest(finite_gap, a, b)  # inf when a NaN or an infinity is in either block: looked at below
    if diff == np.inf:
        nan_a, nan_b = (largest(lambda block: float(np.isnan(block).any()), x) > 0 for x in (a, b))
        if nan_a or nan_b:
            where = "both outputs" if nan_a and nan_b else f"{sides[0] if nan_a else sides[1]}'s output only"
            return float("nan"), float("nan"), "nan", f"NaN in {where}" + (f"; {note}" if note else "")
        diff = largest(max_abs_diff, a, b)
    scale = largest_abs(a)
    return diff, diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf")), "", note


def _read_as(a: np.ndarray, b: np.ndarray, readings) -> tuple[np.ndarray, str]:
    """(the reference's output `a` read in the port's shape, how) by the reading of layouts.reshapings
    under which the two differ least: where one agrees it is that one, where none does the check
    reports the closest (it fails there all the same)."""
    best = None
    for how, axes in readings:
        read = (a if axes is None else a.transpose(axes)).reshape(b.shape)
        gap = largest(finite_gap, read, b)
        if best is None or gap < best[0]:
            best = (gap, read, how)
    assert best is not None
    return best[1], best[2]


def _calls(outputs: list[Output]) -> list[tuple[str, int, list[Output]]]:
    """[(path, call number of that path, its leaves)] in call order."""
    grouped: dict[int, list[Output]] = {}
    for output in outputs:
        grouped.setdefault(output.call, []).append(output)
    seen: dict[str, int] = {}
    calls = []
    for leaves in grouped.values():
        path = leaves[0].path
        seen[path] = seen.get(path, -1) + 1
        calls.append((path, seen[path], leaves))
    return calls


def label(path: str, call: int, calls: int, leaf: str = "") -> str:
    """'attn.out_proj', '(model output)[logits]', 'fc (call 2)': a row's name."""
    name = (path or "(model output)") + leaf
    return f"{name} (call {call + 1})" if calls > 1 else name


def _pair_leaves(source: list[Output], target: list[Output]) -> tuple[list[tuple[Output, Output]], bool]:
    """Leaves of one call paired by their place in the output; by position where the structures
    differ but hold the same number of floating-point leaves. (pairs, paired by position)."""
    by_label = {output.label: output for output in target}
    pairs = [(output, by_label[output.label]) for output in source if output.label in by_label]
    if len(pairs) == len(source) == len(target):
        return pairs, False
    floats_s = [output for output in source if output.value is not None]
    floats_t = [output for output in target if output.value is not None]
    if len(floats_s) == len(floats_t) and not all(output.label in by_label for output in floats_s):
        return list(zip(floats_s, floats_t)), True
    if not pairs and floats_s and floats_t and (len(floats_s) == 1) != (len(floats_t) == 1):
        # one side returns a bare array, the other a tuple that starts with it (torch's RNN: (output, state))
        one, many = (floats_s[0], floats_t[0]) if len(floats_s) == 1 else (floats_t[0], floats_s[0])
        if one.label == "" and (one.shape == many.shape or layouts.reshapings(many.shape, one.shape) or _moved(many.shape, one.shape)):
            return [(floats_s[0], floats_t[0])], True
    return pairs, False


def _moved(a: tuple, b: tuple) -> bool:
    """Whether shape `a` is `b` with its channels moved (NCHW against NHWC)."""
    return len(a) >= 3 and len(a) == len(b) and b in ((a[0], *a[2:], a[1]), (a[0], a[-1], *a[1:-1]))


def output_rows(source_outputs, target_outputs, source_desc, target_desc, asked, sides, name_map=None, derived=None):
    """(rows in the reference's call order, unmatched reference labels, unmatched port labels,
    leaves skipped: [(label, why)], non-floats or None on one side). *_desc: the readers' describe.
    derived: {(call, leaf label) of the reference's run: (own error, largest value)} for the rows
    judged at float32 (forward/derived.py); every other row holds its dtype's fixed tolerance."""
    source, target = _calls(source_outputs), _calls(target_outputs)
    counts_s, counts_t = (Counter(path for path, _, _ in calls) for calls in (source, target))
    index = {(path, call): (position, leaves) for position, (path, call, leaves) in enumerate(target)}
    floor_s, floor_t = precision.floors(source_outputs, asked, source_desc), precision.floors(target_outputs, asked, target_desc)
    rows, unmatched, used, skipped = [], [], set(), []
    left_over: dict[tuple[str, int], list[Output]] = {}
    for position, (path, call, leaves) in enumerate(source):
        key = (map_name(path, name_map), call)
        if key not in index:
            unmatched += [label(path, call, counts_s[path], output.label) for output in leaves if output.value is not None]
            continue
        used.add(key)
        pairs, by_position = _pair_leaves(leaves, index[key][1])
        paired_s, paired_t = {id(s) for s, _ in pairs}, {id(t) for _, t in pairs}  # a leaf of one side that pairs with none of the other's is said
        unmatched += [label(path, call, counts_s[path], output.label) for output in leaves if output.value is not None and id(output) not in paired_s]
        left_over[key] = [output for output in index[key][1] if output.value is not None and id(output) not in paired_t]
        kind = source_desc[path].kind if path in source_desc else ""
        for s, t in pairs:
            name, target_name = label(path, call, counts_s[path], s.label), label(*key, counts_t[key[0]], t.label)
            if s.value is None or t.value is None:
                if (s.value is None) == (t.value is None):
                    skipped.append((name, s.dtype))
                elif "NoneType" in (s.dtype, t.dtype):  # attention weights nobody asked for, say: nothing to compare
                    absent, other = (sides[0], t.dtype) if s.dtype == "NoneType" else (sides[1], s.dtype)
                    skipped.append((name, f"None in {absent}, {other} in the other"))
                else:
                    note = f"{s.dtype} in {sides[0]}, {t.dtype} in {sides[1]}"
                    rows.append(Row("output", name, target_name, kind, float("nan"), float("nan"), position, path, key[0], "dtype", note=note))
                continue
            rank = min(floor_s[s.call], floor_t[t.call], precision.leaf_floor(s), precision.leaf_floor(t))
            dtype = precision.dtype_of(rank)
            abs_diff, rel_diff, status, note = compare_arrays(s.value, t.value, sides, (s.layout, t.layout))
            if by_position:
                note = f"paired by position: '{s.label or '(whole)'}' in {sides[0]}, '{t.label or '(whole)'}' in {sides[1]}" + (
                    f"; {note}" if note else ""
                )
            if dtype is None and status == "":
                status = "unjudged"
            row = Row("output", name, target_name, kind, abs_diff, rel_diff, position, path, key[0], status, note=note)
            row.key, row.target_key = (s.call, s.label), (t.call, t.label)
            _hold(row, "stage", dtype, (derived or {}).get((s.call, s.label)))
            rows.append(row)
    unmatched_target = []
    for path, call, leaves in target:
        leaves = left_over.get((path, call), []) if (path, call) in used else leaves
        unmatched_target += [label(path, call, counts_t[path], output.label) for output in leaves if output.value is not None]
    return rows, unmatched, unmatched_target, skipped


def call_paths(outputs: list[Output]) -> list[str]:
    """The module path of every call, in call order: a row's position indexes this list."""
    return [path for path, _, _ in _calls(outputs)]


def gradient_rows(compared: dict[str, tuple], rank, port_of: dict[str, str], derived=None, zero=()) -> list[Row]:
    """One row per paired reference parameter with a gradient on both sides. compared: {name:
    compare_arrays(the reference's gradient, the port's pulled back into the reference's name and
    layout (pairing.Pulling: a gradient pulls back through every transform, a sum's included))};
    port_of: each reference parameter's port names, for the row; rank: the lowest precision any
    output reached (a gradient runs through every one); derived: as output_rows', by parameter;
    zero: the parameters whose exact gradient is 0: their rows say so, and pass while the port's is
    rounding too."""
    dtype = precision.dtype_of(rank)
    rows = []
    for name, (abs_diff, rel_diff, status, note) in compared.items():
        mapped = port_of[name]
        status = "unjudged" if dtype is None and status == "" else status
        row = Row("gradient", name, mapped, "", abs_diff, rel_diff, module=name, target_module=mapped, status=status, note=note)
        row.key, row.target_key = name, name  # the port's gradient pulled back: its own error too, by the reference's name
        _hold(row, "grad", dtype, (derived or {}).get(name))
        if name in zero and status == "":
            row.zero = True
        rows.append(row)
    return rows


def _hold(row: Row, kind: str, dtype: str | None, twin: tuple[float, float] | None) -> None:
    """Set the row's tolerance at `dtype`: derived from the reference's own float32 error where the
    row is judged at float32 and a twin run measured it (forward/derived.py), else fixed."""
    row.dtype = dtype or ""
    if dtype == "float32" and twin is not None:
        row.reference_error, row.scale = twin
    row.tol, _ = held(twin if dtype == "float32" else None, None, tolerance(kind, dtype or "float32"))


def rejudge(rows: list[Row], port: dict) -> int:
    """Hold every float32 row to the two sides' own errors (comparison.held), the port's from `port`
    ({port key (call, label) or parameter: (own error, largest value)}): a derived row to K times the
    larger, a fixed row to K times the port's where larger (the reference had no twin); float64 rows
    keep their fixed tolerance. Returns how many rows the port's error sets."""
    count = 0
    for row in rows:
        twin = port.get(row.target_key) if row.status == "" and row.dtype == "float32" else None
        if twin is None:
            continue
        row.port_error = twin[0]
        reference = None if row.reference_error is None else (row.reference_error, row.scale)
        row.tol, row.by_port = held(reference, twin, row.tol)
        if reference is None and row.by_port:
            row.scale = twin[1]
        count += row.by_port
    return count
