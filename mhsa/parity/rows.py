"""The rows of a parity report: which backends are compared with which, and one comparison per
row with the tolerance it is held to."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from mhsa import registry


def pairs() -> list[tuple[str, str]]:
    """The compared pairs: every backend against the reference (the registry's first,
    numpy_ref), then every other pair, e.g. torch-numpy, jax-numpy, torch-jax."""
    reference, *others = registry.names()
    return [(name, reference) for name in others] + list(itertools.combinations(others, 2))


def pair_key(a: str, b: str) -> str:
    return f"{a}-{b}"


FD = "finite difference"  # the extra column: the reference backend's gradient against a float64 finite difference


@dataclass
class Row:
    section: str  # "stage", "gradient" or "trajectory"
    name: str
    diffs: Mapping[str, float | None]  # pair -> max |a - b|, None where a pair does not apply
    tol: float
    note: str = ""

    @property
    def passed(self) -> bool:
        return all(diff <= self.tol for diff in self.diffs.values() if diff is not None)

    def failing_pair(self) -> str | None:
        return next((pair for pair, diff in self.diffs.items() if diff is not None and not diff <= self.tol), None)


@dataclass
class Report:
    title: str
    rows: list[Row] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)  # column headers of a section with its own columns

    @property
    def first_failure(self) -> Row | None:
        return next((row for row in self.rows if not row.passed), None)

    @property
    def passed(self) -> bool:
        return self.first_failure is None
