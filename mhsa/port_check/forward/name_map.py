"""A name map proposed by structure, for a port whose names do not correspond to the reference's.

The parameters left over on both sides are grouped by the module that owns them; the modules are put
in call order (of their first calls; modules never called follow in the order of their parameters)
and aligned by their parameters' shapes (difflib's longest matching blocks), so that `norm`/`ln` and
`fc1`/`dense1` pair up where they sit in the computation, and twelve identical layers pair in order.
Each pair becomes one entry {reference path: port path} (one per parameter where the parameters' own
names differ too); entries that share a renamed prefix (`h.0.attn.c_attn` -> `h_0.attn.c_attn`) are
shortened to it (`h.0` -> `h_0`) when that changes nothing else. The map is advice: the check stops
and prints it, and the user runs again with `--map`.
"""

from __future__ import annotations

import difflib

from mhsa.port_check.core.records import Mismatched, Paired, Transfer, map_name


def _split(name: str) -> tuple[str, str]:
    module, _, leaf = name.rpartition(".")
    return module, leaf


def _grouped(names, params, order) -> list[tuple[str, list[tuple[str, tuple]]]]:
    """[(module, [(parameter name, shape)])] in call order (modules never called last, as listed)."""
    groups: dict[str, list] = {}
    for name in names:
        groups.setdefault(_split(name)[0], []).append((name, params[name].shape))
    rank = {path: i for i, path in reversed(list(enumerate(order)))}
    listed = list(groups)
    return sorted(groups.items(), key=lambda item: (rank.get(item[0], len(order) + listed.index(item[0])),))


def _signature(group) -> tuple:
    # the shapes' sizes, without their order: a (in, out) kernel and its (out, in) twin look alike
    return tuple(sorted(tuple(sorted(shape)) for _, shape in group))


def propose_map(report: Transfer, source_params, target_params, source_order, target_order, name_map=None) -> tuple[dict[str, str], list[str]]:
    """(new entries {reference prefix: port prefix}, one line per pair for the report). Only the
    parameters left over on both sides are paired; the entries come on top of name_map."""
    source = _grouped(report.unconsumed_source, source_params, source_order)
    target = _grouped(report.unconsumed_target, target_params, target_order)
    matcher = difflib.SequenceMatcher(None, [_signature(g) for _, g in source], [_signature(g) for _, g in target], autojunk=False)
    entries: dict[str, str] = {}
    pairs: dict[str, str] = {}  # reference parameter -> port parameter, what every map must give
    lines = []
    for block in matcher.get_matching_blocks():
        for i in range(block.size):
            (s_module, s_group), (t_module, t_group) = source[block.a + i], target[block.b + i]
            s_params, t_params = (sorted(group, key=lambda item: (sorted(item[1]), item[0])) for group in (s_group, t_group))
            paired = {s: t for (s, _), (t, _) in zip(s_params, t_params)}
            pairs.update(paired)
            if s_module and t_module and all(_split(s)[1] == _split(t)[1] for s, t in paired.items()):
                entries[s_module] = t_module
            else:
                entries.update(paired)
            leaves = ", ".join(_split(s)[1] for s, _ in s_group)  # in the reference's own order
            lines.append(f"{s_module or '(the model)'} -> {t_module or '(the model)'} ({len(s_params)} parameters: {leaves})")
    if not entries:
        return {}, []
    by_name: list[Paired | Mismatched] = [*report.filled, *report.transposed_only, *report.mismatched]
    kept = {pair.reference: pair.port for pair in by_name}  # paired by name already: a proposal must keep them
    shortened = _shortened(entries)
    for candidate in (shortened, entries):
        if _consistent({**(name_map or {}), **candidate}, pairs, kept, source_params):
            return candidate, lines
    return entries, lines


def _shortened(entries: dict[str, str]) -> dict[str, str]:
    """Module entries that rename the same leading parts, shortened to that prefix."""
    prefixes: dict[str, set[str]] = {}
    for source, target in entries.items():
        s, t = source.split("."), target.split(".")
        common = 0
        while common < min(len(s), len(t)) - 1 and s[-1 - common] == t[-1 - common]:
            common += 1
        prefixes.setdefault(".".join(s[: len(s) - common]), set()).add(".".join(t[: len(t) - common]))
    return {source: targets.pop() for source, targets in prefixes.items() if len(targets) == 1}


def _consistent(candidate: dict[str, str], pairs: dict[str, str], kept: dict[str, str], source_params) -> bool:
    """Whether the map gives every proposed pair and keeps every parameter already paired."""
    return all(map_name(name, candidate) == target for name, target in {**pairs, **kept}.items() if name in source_params)
