"""Where to look, from the evidence: hints read off the rows, and probes that re-run the models
with one likely cause switched.

Probes touch only what runs at or before the first failing row: the failing module itself (a square
kernel transposed, a norm's eps or a conv's padding set to the reference's, the port's own
parameters there that differ given the reference's values), the reference's modules that ran since
the last agreeing output without a counterpart in the port (a torch GELU whose port computes the
other approximation inline), and matmul precision for the whole run. A probe that closes the gap at
the first failing row explains it: the other probes and every hint about that row are retired, and
the search goes on from the next failure with that switch in place (up to four causes). The hints
are then read off the rows with every closing switch in place: what is left to explain, if any.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import numpy as np

from mhsa.port_check.core.findings import Hint, Probe, Switch
from mhsa.port_check.core.records import Row
from mhsa.port_check.forward.boundaries import boundaries
from mhsa.port_check.forward.precision import inside
from mhsa.port_check.forward.rows import output_rows, rejudge
from mhsa.port_check.readers.protocol import ModuleInfo

GROWS = 10.0  # how many times its inputs' largest difference an output's must be for a second cause to be suspected there


@dataclass
class Side:
    """One model as the probes need it: the model, its reader, its inputs, its description."""

    model: Any
    reader: Any
    inputs: Any
    desc: dict[str, ModuleInfo]
    # the port only, when its own weights are checked: reference parameter -> {port array: the
    # port's array with the reference's values in that parameter's place} for every one that differs
    differing: dict | None = None
    derived: Any = None  # the side's own float32 errors (forward/derived.py), where measured
    traced: Any = None  # what the reader's trace() gave before the run (structure.Traced)


def hints(rows: list[Row], call_paths: list[str], source_desc: dict[str, ModuleInfo], asked: str, differing=(), upstream=None) -> list[Hint]:
    """Where to look: the port's parameters that differ in the failing module, the code between the
    last agreeing output and the first failing one and the reference modules without a counterpart
    that ran there, and the difference's largest growth after it (a second cause): at an output
    whose difference is many times that of every output it is computed from. upstream: {row
    position: the positions it is computed from, as bits} (boundaries.upstream; None: not known,
    and no growth is claimed)."""
    outputs = [row for row in rows if row.section == "output"]
    first = next((row for row in outputs if row.failed), None)
    if first is None:
        return []
    at = outputs.index(first)
    last_good = next((row for row in reversed(outputs[:at]) if row.passed), None)
    found = [Hint("holds", first.module, path=name, how=how) for name, _, how, _ in differing if inside(name.rpartition(".")[0], first.module)]
    if last_good is not None:
        parent = ".".join(os.path.commonprefix([last_good.module.split("."), first.module.split(".")]))
        found.append(Hint("enters", first.name, last_good.name, parent))
    found += _unmatched_between(rows, call_paths, source_desc, last_good, first)
    if asked == "float64" and first.status == "" and 1e-9 <= first.rel_diff <= 2e-6:
        found.append(Hint("rounding", first.name, ratio=first.rel_diff))
    growth = _growth(outputs, at, upstream)
    if growth is not None:
        ratio, before, row = growth
        found.append(Hint("grows", row.name, before.name, ratio=ratio))
        found += _unmatched_between(rows, call_paths, source_desc, before, row)
    return found


def _growth(outputs: list[Row], at: int, upstream) -> tuple[float, Row, Row] | None:
    """(ratio, the output with the largest difference of those feeding `row`, row) for the row after
    the first failure (at `at`) whose difference is the most times that of every output it is
    computed from (the largest of them failing too: the difference grows, it does not enter), where
    that is GROWS times or more; None where none is, or the dataflow is unknown."""
    if upstream is None:
        return None
    # one row per call, its largest difference: the leaves of one call are not steps of the computation
    calls = {position: max(leaves, key=lambda row: row.abs_diff) for position, leaves in groupby(outputs, key=lambda row: row.position)}
    found = []
    for row in calls.values():
        if row.position <= outputs[at].position or not np.isfinite(row.abs_diff):
            continue  # the first failure is where the difference enters, not where it grows
        feeding = [calls[p] for p in calls if p < row.position and upstream.get(row.position, 0) >> p & 1 and np.isfinite(calls[p].abs_diff)]
        if feeding:
            before = max(feeding, key=lambda other: other.abs_diff)
            if before.failed and before.abs_diff > 0 and row.abs_diff >= GROWS * before.abs_diff:  # a difference there already, grown
                found.append((row.abs_diff / before.abs_diff, before, row))
    return max(found, key=lambda jump: jump[0]) if found else None


def _unmatched(rows, call_paths, source_desc, before, row) -> list[str]:
    """Reference modules (paths, each once) without a counterpart called after row `before` (None: the start) and before `row`."""
    matched = {other.position for other in rows if other.section == "output"}
    start = before.position + 1 if before is not None else 0
    return list(dict.fromkeys(call_paths[p] for p in range(start, row.position) if call_paths[p] in source_desc and p not in matched))


def _unmatched_between(rows, call_paths, source_desc, before, row) -> list[Hint]:
    """A hint for each unmatched module between `before` and `row` that computes something: an
    inactive Dropout or an Identity (its input as it is) is no cause of a difference."""
    found = [(path, source_desc[path]) for path in _unmatched(rows, call_paths, source_desc, before, row)]
    found = [(path, info) for path, info in found if not _identity(info)]
    return [Hint("unmatched", row.name, path=path, module_kind=info.kind, settings=tuple(info.settings.items())) for path, info in found]


def _identity(info: ModuleInfo) -> bool:
    return info.kind == "Identity" or (info.kind == "Dropout" and info.settings.get("active") is False)


def run_probes(rows, call_paths, source: Side, target: Side, sides, asked, name_map, steps: int = 4) -> tuple[list[Probe], list[Row] | None]:
    """(probes, the rows with every closing probe applied, or None when none closes): the module
    docstring's search, up to `steps` causes, so that three classic bugs get all three named."""
    lines: list[Probe] = []
    explained = None
    for step in range(steps):
        first = next((row for row in rows if row.failed), None)
        if first is None or first.section != "output":
            break
        outputs = [row for row in rows if row.section == "output" and row.position < first.position]
        last_good = next((row for row in reversed(outputs) if row.passed), None)
        candidates = list(_switches(first, last_good, rows, call_paths, source, target))
        if step == 0:
            candidates.insert(0, (Switch("precision"), "precision", None))
        results = [_probe(first, what, kind, make, source, target, sides, asked, name_map) for what, kind, make in candidates]
        closing = next((result for result in results if result[1] is not None), None)
        if closing is None:
            lines += [line for line, *_ in results if line is not None]
            break
        line, rows, source, target = closing
        lines.append(line)
        explained = rows
    return lines, explained


def _probe(first: Row, what: Switch, kind, make, source: Side, target: Side, sides, asked, name_map):
    """(Probe or None when the switch does not apply, the probe's rows if it closes the gap at
    `first` else None, source, target as switched)."""
    try:
        switched = make() if make is not None else None
        if kind != "precision" and switched is None:
            return None, None, source, target
        if kind == "source":  # each side's own errors stay those of the side as it is: a switch is a probe
            source = Side(switched, source.reader, source.inputs, source.desc, derived=source.derived)
        elif kind == "target":
            target = Side(switched, target.reader, target.inputs, target.desc, target.differing, derived=target.derived)
        with contextlib.ExitStack() as stack:
            if kind == "precision":  # full float32 matmuls in both frameworks
                stack.enter_context(source.reader.highest_precision())
                stack.enter_context(target.reader.highest_precision())
            runs = source.reader.run(source.model, source.inputs)[0], target.reader.run(target.model, target.inputs)[0]
    except Exception as error:  # a switched model that cannot run answers nothing
        return Probe(what, "error", error=type(error).__name__), None, source, target
    probed, *_ = output_rows(*runs, source.desc, target.desc, asked, sides, name_map, source.derived and source.derived.outputs)
    if target.derived is not None:
        rejudge(probed, target.derived.outputs)
    boundaries(probed, *runs)  # a difference the switched run still splits at another boundary is none there either
    row = next((r for r in probed if r.name == first.name), None)
    if row is None or not row.passed:
        return Probe(what, "open", first.name, first.abs_diff, None if row is None else row.abs_diff), None, source, target
    rest = next((r for r in probed if r.failed), None)
    return Probe(what, "closes", first.name, first.abs_diff, row.abs_diff, None if rest is None else rest.name), probed, source, target


def _setting(desc: dict[str, ModuleInfo], path: str, key: str) -> Any:
    """The setting `key` of the module at `path` as the lint read it; None where it has none."""
    info = desc.get(path)
    return None if info is None else info.settings.get(key)


def _switches(first, last_good, rows, call_paths, source: Side, target: Side):
    """(Switch, "source" or "target", make) for each likely cause at or before `first`, a failing
    output; make() builds the switched copy (None where the switch does not apply: a kernel that is
    not square), one at a time, so that a large model is not copied once per candidate up front."""

    def make(side: Side, *how):
        return lambda: side.reader.switched(side.model, *how)

    if first.kind == "Linear":  # a square kernel: a transposed one has the right shape and wrong values
        yield Switch("transpose", first.target_module), "target", make(target, "transpose", first.target_module)
    eps, other = _setting(source.desc, first.module, "eps"), _setting(target.desc, first.target_module, "eps")
    if eps is not None and other is not None and eps != other:  # a norm of the library's or written by hand
        yield Switch("eps", first.target_module, eps, other), "target", make(target, "eps", first.target_module, eps)
    padding, other = _setting(source.desc, first.module, "padding"), _setting(target.desc, first.target_module, "padding")
    if first.kind == "Conv" and isinstance(padding, tuple) and other is not None and padding != other:  # 'SAME' at stride 2, say
        yield Switch("padding", first.target_module, padding, other), "target", make(target, "padding", first.target_module, padding)
    fixes = {
        port: value
        for name, arrays in (target.differing or {}).items()
        if inside(name.rpartition(".")[0], first.module)
        for port, value in arrays.items()
    }
    if fixes:  # the port's own parameters that differ, in the failing module: all of them at once
        yield Switch("load", names=tuple(fixes)), "target", make(target, "load", "", fixes)
    for path in _unmatched(rows, call_paths, source.desc, last_good, first):
        info = source.desc[path]
        if info.kind == "GELU":
            approximate = "tanh" if info.settings.get("approximate") == "none" else "none"
            yield Switch("approximate", path, approximate), "source", make(source, "approximate", path, approximate)
