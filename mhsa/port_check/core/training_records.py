"""What the port check through training records: one step of one side, one compared row, the
report. Framework-neutral: every array is NumPy, named and laid out in the exchange convention
(torch state_dict names and layouts), every optimizer moment under torch's name for it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mhsa.comparison import Comparison
from mhsa.port_check.core.findings import LintDifference, OneSided, OptimizerDifference, OptimizerNote, OptimizerSetting, Summed, Unheld
from mhsa.port_check.core.records import PortReport, Transfer

# torch's name for each optimizer moment -> optax's (the rows say both)
MOMENTS = {"exp_avg": "mu", "exp_avg_sq": "nu", "max_exp_avg_sq": "nu_max", "momentum_buffer": "trace"}


@dataclass
class StepRecord:
    """One training step of one side: the loss and gradients at the weights before the update,
    the parameters and the optimizer moments after it."""

    loss: float
    grads: dict[str, np.ndarray]
    params: dict[str, np.ndarray]
    moments: dict[tuple[str, str], np.ndarray]  # (torch moment name, parameter name) -> array


@dataclass
class TrainRow(Comparison):
    """A row of the training check: the reference against the port at one value of one step."""

    step: int  # 1-based
    kind: str  # "loss", "grad", "moment" or "param": a step's rows in the order a training step computes them
    name: str  # the reference's parameter name ("" for the loss)
    moment: str  # torch's name of the moment ("" unless kind == "moment")
    abs_diff: float

    def gaps(self) -> dict[str, float | None]:
        return {"max abs": self.abs_diff}

    @property
    def label(self) -> str:
        if self.kind == "moment":
            return f"{self.moment} {self.name} (optax {MOMENTS[self.moment]})"
        return {"loss": "loss", "grad": f"grad {self.name}"}.get(self.kind, self.name)


@dataclass
class StepSummary:
    """One step of the check, kept whatever the number of steps: its losses, its first failing
    row, and the row closest to (or furthest beyond) its tolerance."""

    step: int
    losses: tuple[float, float]  # (reference, port)
    worst: TrainRow
    first_failure: TrainRow | None
    compared: int
    failing: int

    @classmethod
    def of(cls, step: int, losses: tuple[float, float], rows: list[TrainRow]) -> StepSummary:
        worst = max(rows, key=lambda row: row.closeness)
        first = next((row for row in rows if not row.passed), None)
        return cls(step, losses, worst, first, len(rows), sum(not row.passed for row in rows))


@dataclass
class TrainReport:
    title: str
    sides: tuple[str, str]  # backend names: reference, port
    dtype: str
    steps: int
    transfer: Transfer
    tolerance_note: str
    # module settings, as in the forward check, and what the port's layers hold otherwise
    config_lint: list[LintDifference | Unheld | Summed] = field(default_factory=list)
    lint: list[OptimizerDifference] = field(default_factory=list)  # optimizer settings that differ
    lint_notes: list[OptimizerNote] = field(default_factory=list)  # what the optimizer lint read and could not read
    settings: list[OptimizerSetting] = field(default_factory=list)  # the optimizer settings of both sides
    summaries: list[StepSummary] = field(default_factory=list)  # one per step
    rows: list[TrainRow] = field(default_factory=list)  # every row of step 1 and of the first failing step
    only_one_side: list[OneSided] = field(default_factory=list)  # moments the other side lacks
    forward: PortReport | None = None  # at the first failing step: the forward and gradient rows

    @property
    def first_failure(self) -> TrainRow | None:
        return next((summary.first_failure for summary in self.summaries if summary.first_failure is not None), None)

    @property
    def uncompared(self) -> int:
        """Parameters on either side that were not copied, so not compared: two trainings that
        agree without them prove nothing about them."""
        t = self.transfer
        return len(t.reference_left) + len(t.port_left) + len(t.mismatched) + len(t.transposed_only)

    @property
    def passed(self) -> bool:
        return self.first_failure is None and not self.lint and not self.config_lint and not self.uncompared
