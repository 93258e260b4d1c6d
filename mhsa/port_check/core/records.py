"""What a port check records: the transfer, the rows, the report."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from mhsa.comparison import Comparison
from mhsa.port_check.core.findings import Hint, LintDifference, Note, Precision, Probe, Unheld, Untied
from mhsa.port_check.core.transforms import Group

NORMS = ("LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm")
# what the lint says about a setting beyond the two values
WHY = {
    ("LayerNorm", "eps"): "torch's default is 1e-5, Flax's 1e-6",
    ("RMSNorm", "eps"): "torch's default (None) is the dtype's machine epsilon, Flax's 1e-6",
    ("BatchNorm", "momentum"): "in torch's convention (weight of the new batch): torch 0.1 = Flax momentum 0.9",
    ("Dropout", "active"): "train mode in torch / deterministic=False in Flax",
    ("GELU", "approximate"): "jax.nn.gelu defaults to approximate=True (tanh), torch to 'none' (erf)",
    ("Embedding", "padding_idx"): "torch keeps that row's gradient at zero; Flax's Embed has no padding index",
}


def map_name(name: str, name_map: dict | None) -> str:
    """The port's name for a reference module path or parameter name: the longest prefix of `name`
    (whole dot-separated parts) that a key of name_map matches is replaced by its value; a key's
    `{i}` matches one part of digits, which the value may repeat ("h.{i}": "h[{i}]": h.1.attn ->
    h[1].attn). Entries that join several parameters (a list value, a key "a, b" or "a + b") are
    the pairing's (forward/pairing.py), not names. Otherwise the same name."""
    for key, value in _plain(name_map):
        found = _match(key, name)
        if found is not None:
            length, fields = found
            return value.format(**fields) + name[length:]
    return name


def _plain(name_map: dict | None) -> list[tuple[str, str]]:
    """The map's renaming entries, the longest key (its literal text) first."""
    entries = [(key, value) for key, value in (name_map or {}).items() if isinstance(value, str) and ", " not in key and " + " not in key]
    return sorted(entries, key=lambda entry: len(re.sub(r"\{\w+\}", "", entry[0])), reverse=True)


def _match(key: str, name: str) -> tuple[int, dict[str, str]] | None:
    """(the length of `name` that `key` matches, the values of its {fields}), where it matches a
    prefix of whole parts; None where it does not."""
    if "{" not in key:
        if name == key or name.startswith(key + ".") or name.startswith(key + "["):
            return len(key), {}
        return None
    pattern = re.escape(key).replace(r"\{", "{").replace(r"\}", "}")
    pattern = re.sub(r"\{(\w+)\}", lambda field: f"(?P<{field.group(1)}>\\d+)", pattern)
    found = re.match(pattern + r"(?=$|[.\[])", name)
    return None if found is None else (found.end(), found.groupdict())


class PortCheckError(ValueError):
    """The check cannot run as asked: a factory, the inputs or the models do not allow it. One
    line that says what and why; the command prints it and exits 2."""


class Paired(NamedTuple):
    """A reference parameter and the port's that it pairs with: the reference's shape, and whether
    it is taken transposed (a Linear's (out, in) weight as a (in, out) kernel)."""

    reference: str
    port: str
    shape: tuple
    transposed: bool = False


class Mismatched(NamedTuple):
    """A reference parameter paired by name with a port parameter of another shape."""

    reference: str
    port: str
    shape: tuple  # the reference's, as the port would take it
    port_shape: tuple
    layouts: int = 0  # how many layouts fit where the shapes do not say which (a square weight as (N, D, H) or (D, N, H)); 0: none fits


class Differing(NamedTuple):
    """A port parameter kept as the port holds it that differs from the reference's."""

    name: str  # the reference's parameter (its names, joined, for a group of several)
    largest: float  # max abs difference
    how: str  # "transposed", "scaled by 0.5", ...
    group: Group | None = None  # the pairing's group (core/transforms.py)


@dataclass
class Transfer:
    """What happened to every parameter: paired (then copied, or compared as the port holds it),
    and what did not fit."""

    groups: list[Group] = field(default_factory=list)  # every pairing: reference parameters and the port arrays holding them (core/transforms.py)
    transposed_only: list[Paired] = field(default_factory=list)  # standard layers that fit only transposed: not paired
    mismatched: list[Mismatched] = field(default_factory=list)
    reference_left: list[str] = field(default_factory=list)  # the reference's parameters paired with none of the port's
    port_left: list[str] = field(default_factory=list)  # the port's paired with none of the reference's
    port_unread: list[str] = field(default_factory=list)  # the port's variables its forward pass never reads (copy_weights)
    differing: list[Differing] = field(default_factory=list)  # kept as the port holds them
    layouts: list[str] = field(default_factory=list)  # the transposed layouts inferred, one line each
    ambiguous: list[tuple[str, list[str]]] = field(default_factory=list)  # reference parameters or modules that pair with several of the port's
    renamed: dict[str, str] = field(default_factory=dict)  # reference module -> the port's, found under another name (forward/pairing.py)
    lost: list[Unheld] = field(default_factory=list)  # what of the reference the port's layers have no room for
    copied: bool = True
    decision: str = ""  # why the weights were copied or kept
    sides: tuple[str, str] = ("torch", "jax")

    @property
    def paired(self) -> list[str]:
        """The reference's parameters that some group pairs."""
        return [name for group in self.groups for name in group.reference]

    @property
    def unpaired(self) -> list[str]:
        """The reference's parameters that no group pairs, whatever the reason (no counterpart, a shape that fits no transform)."""
        return [*self.reference_left, *(pair.reference for pair in self.mismatched), *(pair.reference for pair in self.transposed_only)]


@dataclass
class Row(Comparison):
    """A row of the forward check: the reference against the port at one output leaf of one call,
    or at one parameter's gradient."""

    section: str  # "output" or "gradient"
    name: str  # the reference's module path (with the call number and the leaf's place) or parameter name
    target: str  # the port's name for it
    kind: str  # the module type ("" for gradients)
    abs_diff: float
    rel_diff: float
    position: int = -1  # index of the output in the reference's calls
    module: str = ""  # the reference's module path ("" for the model itself; the parameter for a gradient)
    target_module: str = ""  # the port's
    # "" compared; "shape" (cannot broadcast), "nan" (NaN in an output), "unjudged" (below float32),
    # "dtype" (a float on one side, an int on the other: shown, not judged)
    status: str = ""
    dtype: str = ""  # the precision the row is judged at ("float32", "float64"; "" unjudged)
    scale: float = 0.0  # the largest value of the reference's float64 twin: the floor of a derived tolerance
    key: Any = None  # the reference's (call, leaf label) of this output, or its parameter's name
    target_key: Any = None  # the port's
    zero: bool = False  # a gradient that is 0 in exact arithmetic: both sides' values are rounding
    boundary: str = ""  # why a difference that the next outputs do not carry is no failure (forward/check.py)

    def gaps(self) -> dict[str, float | None]:
        return {"max abs": self.abs_diff}

    @property
    def passed(self) -> bool:
        return self.status == "" and super().passed

    @property
    def failed(self) -> bool:
        return not self.boundary and (self.status in ("shape", "nan") or (self.status == "" and not super().passed))


@dataclass
class PortReport:
    title: str
    sides: tuple[str, str]  # backend names: reference, port
    transfer: Transfer
    lint: list[LintDifference | Untied | Unheld] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    unmatched_source: list[str] = field(default_factory=list)
    unmatched_target: list[str] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)  # what was skipped or changed, and why
    precision: list[Precision] = field(default_factory=list)  # modules computing below the dtype asked for
    hints: list[Hint] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    stopped: str = ""  # why nothing was compared (names that do not correspond); "" when compared
    proposed_map: dict[str, str] = field(default_factory=dict)  # the map found so far, when the check stops: the user's and the modules found renamed
    name_map: dict = field(default_factory=dict)  # the map the rows and the lint pair modules by: the user's and the modules found renamed
    map_lines: list[str] = field(default_factory=list)  # the module pairs behind it, one line each
    port_twin: str = ""  # the dtype the port ran in once more ("float64", or "float32" in a float64 check), its own errors joining the tolerances
    port_sets: int = 0  # how many rows' tolerances the port's own error sets

    @property
    def first_failure(self) -> Row | None:
        return next((row for row in self.rows if row.failed), None)

    @property
    def unjudged(self) -> list[Row]:
        return [row for row in self.rows if row.status == "unjudged"]

    @property
    def passed(self) -> bool:
        """Every comparison agrees (a lint difference that no output or gradient shows is a warning)."""
        return not self.stopped and bool(self.rows) and self.first_failure is None and not self.unjudged
