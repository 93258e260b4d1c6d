"""Which precision each comparison can be held to: the dtype asked for, unless a module computes
below it (a Flax layer with dtype=float32 whose parameters are float64, a cast in the code).

Two kinds of evidence, read after the models are cast to the dtype asked for: each captured output's
dtype, and each module attribute holding a floating dtype below it (the readers' "dtypes": a Linen
field `dtype=float32`, an NNX `compute_dtype`; the casts already raise NNX's `dtype` and a Linen
model's own `dtype`, so what remains is what the check cannot raise). From the first output below
the asked dtype, or the first call inside a module with such an attribute, on either side (in call
order: what runs later may depend on it), rows are held to that precision's tolerance. Below float32
(bfloat16, float16) rows are not judged: their rounding (about 4e-3 relative for bfloat16) exceeds
the differences this check exists to find (a LayerNorm eps, a tanh GELU), so a tolerance that passes
it would pass those bugs too. The report names each module responsible and its attribute, or says
that none has one (a cast in its code). A cast that converts back before its module returns shows
only in the dataflow (`rounding`) or, where a reader cannot follow it, as a float32-sized difference
in a float64 run (a hint).
"""

from __future__ import annotations

from mhsa.port_check.core.findings import Precision
from mhsa.port_check.core.structure import RANKS, Output
from mhsa.port_check.readers.protocol import ModuleInfo

NAMES = {3: "float64", 2: "float32"}  # the ranks with tolerances (shared/tolerances.py)
SHOWN = 4  # modules named per side; the rest are counted


def inside(path: str, module: str) -> bool:
    """Whether the module at `path` is `module` or one of its submodules ("": the model, every one)."""
    return module == "" or path == module or path.startswith(module + ".")


def lowered(desc: dict[str, ModuleInfo], asked: str) -> dict[str, dict[str, str]]:
    """module path -> {attribute: dtype} for the attributes that hold a floating dtype below `asked`."""
    below = ({name: value for name, value in info.dtypes.items() if RANKS.get(value, 3) < RANKS[asked]} for info in desc.values())
    return {path: low for path, low in zip(desc, below) if low}


def floors(outputs: list[Output], asked: str, desc: dict) -> dict[int, int]:
    """call index -> the lowest precision rank reached up to and including that call: an output's
    dtype, or a call inside a module whose attributes hold a lower dtype."""
    modules = {path: min(RANKS[value] for value in attributes.values()) for path, attributes in lowered(desc, asked).items()}
    floor, found = RANKS[asked], {}
    for output in outputs:
        if output.value is not None:
            floor = min(floor, RANKS.get(output.dtype, floor))
        floor = min([floor] + [rank for module, rank in modules.items() if inside(output.path, module)])
        found[output.call] = floor
    return found


def leaf_floor(output: Output) -> int:
    """The lowest precision rank one output leaf's own computation reached (Output.floor, from the
    dataflow: a float32 step that converts back leaves no other trace); 3 where it is unknown."""
    return 3 if output.floor is None else output.floor


def rounding(outputs: list[Output], asked: str, side: str) -> list[Precision]:
    """One finding per module where a precision below `asked` enters the dataflow while its output
    dtype says `asked` (a cast in its code that converts back): the first outputs computed through
    it, each once, not those computed from an earlier one nor a parent returning its child's."""
    low = {output.call: output for output in outputs if output.value is not None and leaf_floor(output) < RANKS[asked]}
    entries: list[Output] = []
    for call, output in low.items():
        upstream = output.upstream if output.upstream >= 0 else 0
        inner = any(inside(entry.path, output.path) for entry in entries)  # a parent returning its child's value
        if RANKS.get(output.dtype, 3) >= RANKS[asked] and not inner and not any(upstream >> other & 1 for other in low if other != call):
            entries.append(output)
    lowest = {path: min(leaf_floor(output) for output in entries if output.path == path) for path in dict.fromkeys(output.path for output in entries)}
    return _shown(
        [Precision("rounds", side, asked, path, dtype_of(rank) or "a precision below float32") for path, rank in lowest.items()], side, asked
    )


def _shown(found: list[Precision], side: str, asked: str) -> list[Precision]:
    """The first SHOWN findings of one side, the rest counted."""
    return found[:SHOWN] + ([Precision("more", side, asked, count=len(found) - SHOWN)] if len(found) > SHOWN else [])


def dtype_of(rank: int) -> str | None:
    """The dtype whose tolerances a row of this rank is held to; None: not judged."""
    return NAMES.get(min(rank, 3))


def findings(outputs: list[Output], asked: str, desc: dict, side: str) -> list[Precision]:
    """One finding per module of one side that computes below `asked`, in call order: every module
    with an attribute that says so, and the first module whose output is below it without one."""
    attributes = lowered(desc, asked)
    named: dict[str, Precision] = {}  # path -> finding, in the order their first calls return
    cast_seen = False
    for output in outputs:
        holder = next((module for module in attributes if inside(output.path, module) and module not in named), None)
        if holder is not None:
            named[holder] = Precision("holds", side, asked, holder, attributes=tuple(attributes[holder].items()))
        below = output.value is not None and RANKS.get(output.dtype, 3) < RANKS[asked]
        if below and not cast_seen and not any(inside(output.path, module) for module in attributes):
            cast_seen = True
            named[output.path] = Precision("computes", side, asked, output.path, output.dtype)
    return _shown(list(named.values()), side, asked)
