"""What a port check finds besides its rows, as data: each lint difference, note, precision finding,
hint, probe and optimizer finding is a frozen record of the module path or parameter it is about,
its kind and its numbers. The checks make them; report/findings.py turns each into the line printed
(with the two sides' names, which the records leave to the report), and tests read the fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LintDifference:
    """A paired module whose type ("type") or one setting differs; "bias", "active": the values say which side has it."""

    path: str  # the reference's module path ("" for the model itself)
    kind: str  # the reference's module type
    setting: str
    reference: Any
    port: Any
    same: tuple | None = None  # a 'SAME' padding's (kernel_size, stride, dilation): what it pads depends on the input's size


@dataclass(frozen=True)
class Untied:
    """A tied reference parameter whose counterparts in the port are two parameters."""

    path: str
    tied_to: str


@dataclass(frozen=True)
class Unheld:
    """A part of a reference module's parameters that the port's layer has no room for (torch GRU's
    b_hn in a cell without a bias there): lost when copied, its gradient 0 on the port's side."""

    path: str  # the reference's module
    what: str  # the part, in words
    why: str


@dataclass(frozen=True)
class Summed:
    """Reference parameters the port holds as one array (torch's two RNN biases in one): equal in the
    forward pass and in their gradients, they train apart (each of the reference's moves by its own update)."""

    parameters: tuple[str, ...]
    port: str  # the port's array(s)


@dataclass(frozen=True)
class Note:
    """What was skipped or changed, and why: `kind` names the sentence (report/findings.py's NOTES)."""

    kind: str
    names: tuple = ()  # the paths, parameters or (name, why) pairs it is about
    dtype: str = ""
    side: str = ""  # "reference" or "port"
    error: str = ""  # one line of an error (forward/check.one_line)
    why: str = ""  # "dropout", "random" or "deterministic": why a float64 run is no twin
    also: tuple = ()  # "dropout": the active dropouts


@dataclass(frozen=True)
class Precision:
    """A module of one side computing below the dtype asked for: kind "holds" (an attribute says so), "computes"
    (its output's dtype, no attribute), "rounds" (a cast that converts back), "more" (count more modules)."""

    kind: str
    side: str
    asked: str
    path: str = ""
    dtype: str = ""  # "computes", "rounds": the precision it goes through
    attributes: tuple = ()  # "holds": (name, dtype) pairs
    count: int = 0
    judged_at: str | None = None  # on the first finding: the dtype whose tolerance the rows then take ("": none, not judged)


@dataclass(frozen=True)
class Hint:
    """Where to look: kind "holds" (a differing parameter of the failing module), "enters" (after the last agreeing
    row), "unmatched" (a reference module without counterpart), "rounding" (a float32-sized gap in float64),
    "grows", "probed" (the hints below are read with the closing probes' switches in place)."""

    kind: str
    row: str = ""  # the row it points at
    before: str = ""  # the row before it ("enters", "grows")
    path: str = ""  # a parameter ("holds"), a module ("enters": the common parent; "unmatched")
    how: str = ""  # "holds": how the parameter differs
    module_kind: str = ""
    settings: tuple = ()  # "unmatched": (key, value) pairs
    ratio: float = 0.0  # "grows": the growth; "rounding": the relative gap


@dataclass(frozen=True)
class Switch:
    """One likely cause switched: "precision" (full float32 matmuls), "transpose" (a kernel), "eps", "padding" (to the
    reference's value, was the port's), "load" (`names` get the reference's values), "approximate" (a torch GELU)."""

    kind: str
    path: str = ""
    value: Any = None
    was: Any = None
    names: tuple = ()


@dataclass(frozen=True)
class Probe:
    """A re-run with one switch: outcome "closes", "open" (still `after` at `row`; None: no output) or "error"."""

    switch: Switch
    outcome: str
    row: str = ""  # the first failing row it was run for
    before: float = 0.0
    after: float | None = None
    moves_to: str | None = None  # "closes": the next failing row; None: every output agrees
    error: str = ""  # "error": the exception's type


@dataclass
class Inferred:
    """One side's optimizer for one parameter, as its updates show it (training/lint.py)."""

    family: str  # "adam" (exp_avg, exp_avg_sq), "momentum" (momentum_buffer) or "plain" (no moments)
    lr: list[float] = field(default_factory=list)  # the learning rate of each step of the constant probe
    b1: float = 0.0
    b2: float = 0.0
    eps: float = 0.0
    eps_root: float = 0.0
    l2: float = 0.0  # weight decay added to the gradient (plain SGD: its one weight decay)
    decoupled: float = 0.0  # weight decay applied to the weights, times the learning rate
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    amsgrad: bool = False
    clip: float | None = None  # the max global norm the gradients are clipped to


@dataclass(frozen=True)
class OptimizerDifference:
    """A setting in which optax's optimizer differs from torch's (`setting` names the sentence), its values rounded
    to the digits shown: findings that read alike are equal, and group."""

    setting: str
    torch: Any = None
    optax: Any = None
    cls: str = ""  # torch's optimizer class
    extra: Any = None  # a third number the sentence needs (eps outside beside eps_root; the first differing step)
    rates: tuple = ()  # (torch's first learning rates, optax's): listed after a learning-rate finding
    on: tuple = ()  # the parameters it holds for, where not all


@dataclass(frozen=True)
class OptimizerSetting:
    """One side's optimizer settings: kind "torch" (a param group), "clip", "scheduler", "optax" (as probed)."""

    kind: str
    value: Any = None  # "torch": the group's (key, value) pairs; "clip": the norm; "scheduler": its type; "optax": Inferred
    name: str = ""  # "torch": the class; "optax": the parameter probed
    group: int | None = None  # "torch": the group's index where there are several


@dataclass(frozen=True)
class OptimizerNote:
    """What the optimizer lint could not read: kind "unread" (torch's class `cls`), "skipped" (no probes), "maximize"."""

    kind: str
    cls: str = ""


@dataclass(frozen=True)
class OneSided:
    """A kind of optimizer moment one side keeps and the other does not (torch's name)."""

    moment: str
    side: str
