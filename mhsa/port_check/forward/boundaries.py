"""One computation split at another module boundary: a difference that the outputs reading it do not
carry is no failure.

A port may do a step of the reference's module in the module after it, or the other way round: a
library's torch embedding multiplies by sqrt(d) inside its module, its Flax twin after nn.Embed.
That module's output then differs, and every output computed from it agrees again. Such a row is
marked (Row.boundary, its note naming the module that agrees), not failed, and the first failure is
searched after it: a real bug further on is still named where it parts.

Which outputs read a row's output is known from the reference's run (Output.upstream: the calls each
output is computed from). A failing row is a boundary when the first later call computed from it
agrees, or is itself such a boundary, and the difference heals there: its relative size falls by
HEALS at least (a bug's difference flows on at about its own size, and a small one may stay within
the next row's tolerance without healing). Where the reference's run does not say what reads what,
every later output row must agree and heal. A row that no later output reads stays a failure.
"""

from __future__ import annotations

from mhsa.port_check.core import layouts
from mhsa.port_check.core.chunks import largest_abs
from mhsa.port_check.core.records import Row
from mhsa.port_check.core.structure import Output, is_float_dtype
from mhsa.port_check.forward import weights

HEALS = 100.0  # how much smaller, relative to its values, the difference must be at the output that reads it


def boundaries(rows: list[Row], outputs: list[Output], port_outputs: list[Output]) -> None:
    """Mark the failing output rows whose difference the outputs reading them do not carry.
    outputs: the reference's run, for what reads what; port_outputs: the port's, for how the two
    outputs at a marked row differ (its note)."""
    explain = _explainer(outputs, port_outputs)
    values = {(output.call, output.label): output.value for output in outputs}
    by_call: dict[int, list[Row]] = {}
    for row in rows:
        if row.section == "output":
            by_call.setdefault(row.position, []).append(row)
    calls = sorted(by_call)
    computed_from = _rowed(upstream(outputs), calls)
    for position in reversed(calls):  # a later boundary decides an earlier one
        failing = [row for row in by_call[position] if row.failed and row.status == ""]
        if not failing:
            continue
        readers = _readers(position, calls, computed_from)
        if not readers or not all(_heals(row, after, values) for row in failing for p in readers for after in by_call[p]):
            continue
        reader = by_call[readers[0]][0]
        for row in failing:
            how = explain(row)
            row.boundary = (
                f"differs{' (' + how + ')' if how else ''}, but '{reader.name}', computed from it, agrees: "
                "the two sides split one computation at another module boundary there"
            )
    if computed_from is not None:
        _entered(by_call, calls, computed_from)


def _rowed(computed_from: dict[int, int] | None, calls: list[int]) -> dict[int, int] | None:
    """{row position: the earlier row positions it is computed from, as bits}: a call without rows
    (a module one side has and the other not) is looked through, as an operation is."""
    if computed_from is None:
        return None
    rowed = sum(1 << p for p in calls)
    return {p: computed_from.get(p, 0) & rowed & ((1 << p) - 1) for p in calls}


def _readers(position: int, calls: list[int], computed_from: dict[int, int] | None) -> list[int]:
    """The row positions that read `position`'s output first-hand: computed from it, and not only
    through another of them. A difference that heals at one of them and flows on at another (a time
    embedding read by many blocks) is a failure. Where what reads what is not known: every later one."""
    later = [p for p in calls if p > position]
    if computed_from is None:
        return later
    reading = [p for p in later if computed_from[p] >> position & 1]
    through = sum(1 << p for p in reading)
    return [p for p in reading if not computed_from[p] & through]


def _entered(by_call: dict[int, list[Row]], calls: list[int], computed_from: dict[int, int]) -> None:
    """Unmark a boundary whose difference did not enter there: a row computed first-hand from a
    failing one carries that failure's difference, whether or not the next outputs show it."""
    for position in calls:  # in call order: an unmarked row fails for the rows after it
        marked = [row for row in by_call[position] if row.boundary]
        if not marked:
            continue
        before = computed_from[position]
        covered = 0
        for p in calls:
            if before >> p & 1:
                covered |= computed_from[p]
        first_hand = before & ~covered
        if any(row.failed for p in calls if first_hand >> p & 1 for row in by_call[p]):
            for row in marked:
                row.boundary = ""


def _heals(row: Row, after: Row, values: dict) -> bool:
    """Whether `after`, an output computed from `row`'s, agrees and carries no trace of its
    difference. An output that is zero in the reference (a zero-initialized conv, say) agrees
    whatever it reads: it shows nothing healed."""
    if after.boundary:
        return True
    if not after.passed:
        return after.status in ("unjudged", "dtype")
    value = values.get(after.key)
    return after.rel_diff * HEALS <= row.rel_diff and value is not None and largest_abs(value) > 0


def upstream(outputs: list[Output]) -> dict[int, int] | None:
    """{call index among the calls with outputs: the calls (bits, in the same indexing) it is
    computed from}, from the leaves' upstream; None where a floating-point leaf's is not known.
    A leaf that is no floating-point array (an attention's None weights, a mask of ints) carries no
    difference and says nothing of what it is computed from."""
    position_of = {call: position for position, call in enumerate(dict.fromkeys(output.call for output in outputs))}
    found: dict[int, int] = {}
    for output in outputs:
        if not is_float_dtype(output.dtype):
            continue
        if output.upstream < 0:
            return None
        bits = sum(1 << p for call, p in position_of.items() if output.upstream >> call & 1)  # distinct bits: a sum is their or
        found[position_of[output.call]] = found.get(position_of[output.call], 0) | bits
    return found


def _explainer(source_outputs: list[Output], target_outputs: list[Output]):
    """explain(row) -> how the port's output differs from the reference's there (weights.how_it_differs), or ''."""
    source = {(output.call, output.label): output for output in source_outputs}
    target = {(output.call, output.label): output for output in target_outputs}

    def explain(row: Row) -> str:
        a, b = source.get(row.key), target.get(row.target_key)
        if a is None or b is None or a.value is None or b.value is None:
            return ""
        permutation = layouts.order(a.layout, b.layout)
        value = a.value if permutation is None else a.value.transpose(permutation)
        how = weights.how_it_differs(value, b.value, row.tol) if value.shape == b.value.shape else None
        if how is None:
            return ""
        return f"the port's is the reference's {how}" if how.startswith("scaled") else f"the port's output {how}"

    return explain
