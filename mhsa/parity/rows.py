"""The rows of a parity report: which backends are compared with which, and one comparison per
row with the tolerance it is held to and, where the tolerance is derived, the reference's own
float32 error it is derived from (shared.tolerances)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from mhsa import registry
from mhsa.comparison import Comparison


def pairs() -> list[tuple[str, str]]:
    """The compared pairs: every backend against the reference (the registry's first,
    numpy_ref), then every other pair, e.g. torch-numpy, jax-numpy, torch-jax."""
    reference, *others = registry.names()
    return [(name, reference) for name in others] + list(itertools.combinations(others, 2))


def pair_key(a: str, b: str) -> str:
    return f"{a}-{b}"


def reference() -> str:
    """The reference backend (the registry's first, numpy_ref): its own float32 error, against
    itself in float64, is what the float32 tolerances are derived from."""
    return registry.names()[0]


FD = "finite difference"  # the extra column: the reference backend's float64 gradient against a float64 finite difference


@dataclass
class Row(Comparison):
    """A row of `mhsa parity`: a gap per pair of backends (and the finite difference's column),
    each held to `tol` or a tolerance of its own."""

    section: str  # "stage", "gradient", "trajectory", "decode" or "data-parallel"
    name: str
    diffs: Mapping[str, float | None]  # pair -> max |a - b|, None where a pair does not apply
    tols: Mapping[str, float] = field(default_factory=dict)  # a column held to a tolerance of its own (the finite difference's)
    step: int | None = None  # a row over steps: the step it shows (stepwise_row), counted from 0
    at: str = ""  # a row over steps and tensors: the tensor it shows at that step
    derived_elsewhere: bool = False  # derived, but not from the reference's error (its note says from what)
    problems: tuple[str, ...] = ()  # what fails the row besides its gaps (a setting that differs), one line each

    def gaps(self) -> Mapping[str, float | None]:
        return self.diffs

    def tol_of(self, key: str) -> float:
        return self.tols.get(key, self.tol)

    @property
    def passed(self) -> bool:
        return not self.problems and super().passed


def stepwise_row(section: str, name: str, gaps: Mapping[str, np.ndarray | None], tolerances, errors=None, note: str = "") -> Row:
    """One row for a comparison made at every step: gaps, key -> (steps,) max |a - b| at each
    step (None where a key does not apply), held to tolerances (steps,), derived from the
    reference's errors (steps,) (None: fixed tolerances).

    The row shows one step, row.step, so that its numbers read as one comparison: the first step
    beyond tolerance where the row fails (where the runs part: the caller names it), or else the
    step closest to its tolerance."""
    found = {key: np.asarray(gap, dtype=np.float64) for key, gap in gaps.items() if gap is not None}
    steps = next(iter(found.values())).shape if found else np.shape(tolerances)
    tolerances = np.broadcast_to(np.asarray(tolerances, dtype=np.float64), steps)
    if tolerances.ndim != 1 or not tolerances.size:
        raise ValueError(f"stepwise_row {name!r}: need one value per step for at least one step, got shape {tolerances.shape}")
    beyond = np.zeros(tolerances.shape, dtype=bool)
    closeness = np.zeros(tolerances.shape)
    for gap in found.values():
        beyond |= ~(gap <= tolerances)
        with np.errstate(divide="ignore", invalid="ignore"):
            closeness = np.maximum(closeness, np.where(gap == 0, 0.0, gap / tolerances))
    step = int(np.argmax(beyond)) if beyond.any() else int(np.argmax(closeness))
    shown = {key: None if gap is None else float(np.asarray(gap)[step]) for key, gap in gaps.items()}
    error = None if errors is None else float(np.asarray(errors)[step])
    return Row(section, name, shown, tol=float(tolerances[step]), note=note, reference_error=error, step=step)


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
