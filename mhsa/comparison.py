"""The comparison core of the tools: `mhsa parity`'s sections, `mhsa port-check`'s rows and
`--train`'s steps are each a table of `Comparison` rows, held to tolerances by one rule (`held`)
and printed by one renderer (`table`).

A row is one or more gaps (max |a - b| between two computations of one value, one per compared
pair) and the tolerance they are held to: fixed (docs/DESIGN.md's), or derived from the sides'
own float32 errors, each side's float32 run against its float64 twin (shared/tolerances.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from shared.tolerances import derived

Column = tuple[str, int, str]  # header, width, alignment ("<" or ">")
RESULT: Column = ("result", 6, "<")  # PASS, FAIL, ...: every table's last column


@dataclass(kw_only=True)
class Comparison:
    """One row of a tool's table. Each tool's row adds what it compares (parity: a gap per pair of
    backends; the port check: the reference against the port at a module or parameter; --train:
    the same at a step) and gives its gaps."""

    tol: float = 0.0
    reference_error: float | None = None  # the reference's own float32 error `tol` is derived from; None: a fixed tolerance
    port_error: float | None = None  # the port's own float32 error, where its twin run was made
    by_port: bool = False  # whether the port's own error sets `tol` (held)
    note: str = ""

    def gaps(self) -> Mapping[str, float | None]:
        """Column -> max |a - b| (None where a pair does not apply)."""
        raise NotImplementedError

    def tol_of(self, key: str) -> float:
        return self.tol

    def failing_pair(self) -> str | None:
        """The first column beyond its tolerance (a NaN gap is beyond any), or None."""
        return next((key for key, gap in self.gaps().items() if gap is not None and not gap <= self.tol_of(key)), None)

    @property
    def passed(self) -> bool:
        return self.failing_pair() is None

    @property
    def closeness(self) -> float:
        """How near the row is to its tolerance: its largest gap / tolerance (a tolerance of 0: 0 or inf)."""
        held_to = [(gap, self.tol_of(key)) for key, gap in self.gaps().items() if gap is not None]
        return max((gap / tol if tol > 0 else (0.0 if gap == 0 else float("inf")) for gap, tol in held_to), default=0.0)

    def error_cell(self) -> str:
        """The own error the tolerance is derived from: the reference's, or the port's marked '*'
        where it is the larger; 'fixed' for a fixed tolerance."""
        if self.by_port:
            return f"{self.port_error:.2e}*"
        return "fixed" if self.reference_error is None else f"{self.reference_error:.2e}"


def held(reference: tuple[float, float] | None, port: tuple[float, float] | None, fixed: float) -> tuple[float, bool]:
    """The tolerance rule of every tool: (tolerance, whether the port's own error sets it).

    reference, port: each side's (own float32 error, largest value of its float64 twin) at the
    compared value, or None where that side has no twin. K times the larger of the two errors,
    never less than K float32 roundings of the larger of the largest values (shared.tolerances.
    derived). Without the reference's error the row holds `fixed`, widened to the port's derived
    tolerance where that is larger (the port's own rounding is then what a faithful port shows)."""
    if reference is None:
        widened = derived(*port) if port is not None else 0.0
        return (widened, True) if widened > fixed else (fixed, False)
    if port is None:
        return derived(*reference), False
    return derived(max(reference[0], port[0]), max(reference[1], port[1])), port[0] > reference[0]


def table(columns: Sequence[Column], rows: Iterable[tuple[Sequence[str], str]]) -> list[str]:
    """The header, the rule (a right-aligned column's ends in ':') and one line per row, (cells,
    suffix): each cell padded to its column's width (a longer one widens its line only), then the
    suffix (a marker, a note) after the last bar. Empty cells make a blank line of the table."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(f"{cell:{align}{width}}" for cell, (_, width, align) in zip(cells, columns)) + " |"

    rule = "|" + "|".join("-" * (width + 2) if align == "<" else "-" * (width + 1) + ":" for _, width, align in columns) + "|"
    return [line([header for header, _, _ in columns]), rule, *(line(cells) + suffix for cells, suffix in rows)]
