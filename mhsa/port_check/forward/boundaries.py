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

from mhsa.port_check.core.records import Row
from mhsa.port_check.core.structure import Output

HEALS = 100.0  # how much smaller, relative to its values, the difference must be at the output that reads it


def boundaries(rows: list[Row], outputs: list[Output], explain) -> None:
    """Mark the failing output rows whose difference the outputs reading them do not carry.
    outputs: the reference's run, for what reads what; explain(row) -> str: how the two outputs at
    a marked row differ (for its note), or ''."""
    by_call: dict[int, list[Row]] = {}
    for row in rows:
        if row.section == "output":
            by_call.setdefault(row.position, []).append(row)
    calls = sorted(by_call)
    computed_from = upstream(outputs)
    for position in reversed(calls):  # a later boundary decides an earlier one
        failing = [row for row in by_call[position] if row.failed and row.status == ""]
        if not failing:
            continue
        later = [p for p in calls if p > position]
        readers = [p for p in later if computed_from.get(p, 0) >> position & 1][:1] if computed_from is not None else later
        if not readers or not all(_heals(row, after) for row in failing for p in readers for after in by_call[p]):
            continue
        reader = by_call[readers[0]][0]
        for row in failing:
            how = explain(row)
            row.boundary = (
                f"differs{' (' + how + ')' if how else ''}, but '{reader.name}', computed from it, agrees: "
                "the two sides split one computation at another module boundary there"
            )


def _heals(row: Row, after: Row) -> bool:
    """Whether `after`, an output computed from `row`'s, agrees and carries no trace of its difference."""
    if after.boundary:
        return True
    if not after.passed:
        return after.status in ("unjudged", "dtype")
    return after.rel_diff * HEALS <= row.rel_diff


def upstream(outputs: list[Output]) -> dict[int, int] | None:
    """{call index among the calls with outputs: the calls (bits, in the same indexing) it is
    computed from}, from the leaves' upstream; None where a leaf's is not known."""
    position_of = {call: position for position, call in enumerate(dict.fromkeys(output.call for output in outputs))}
    found: dict[int, int] = {}
    for output in outputs:
        if output.upstream < 0:
            return None
        bits = sum(1 << p for call, p in position_of.items() if output.upstream >> call & 1)  # distinct bits: a sum is their or
        found[position_of[output.call]] = found.get(position_of[output.call], 0) | bits
    return found
