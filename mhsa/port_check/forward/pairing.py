"""Which of the port's arrays hold each of the reference's parameters: the pairing, as groups of
core/transforms.py. The rules run in the order of RULES, each on what the ones before it left:

| rule | pairs | how |
|---|---|---|
| map | what the user's name map says | prefixes and {i} patterns rename; a list splits, `a, b` concatenates, `a + b` sums |
| name | the same name (through the map) | as it is, transposed (a layer's (in, out) weight), its head axes split or merged |
| list index | Linen's `blocks_0` for torch's `blocks.0` | the same name once a part's `_N` is read as `.N` |
| convention | `weight`, `kernel`, `scale`, `embedding`, `gamma`; `bias`, `beta` | the one of that kind in the module whose shape fits |
| cells | torch's LSTM, GRU, RNN against a JAX library's cells | the cells' layouts: per-gate kernels, packed gates, biases (CELLS) |
| structure | modules left on both sides, in call order | one against one (renamed), one split into several (q, k, v), several into one |
| values | a parameter the names leave ambiguous, in a converted port | the one candidate holding its values |

A transform is chosen by structure (names, their conventions, layer types, shapes, call order), never
by the port's values: a converter that forgot a transpose must be named, not explained away. Only
which of several same-shaped candidates a parameter is may be read off a converted port's values,
laid out as the names say. Where structure leaves several choices, or none, the parameter stays
unpaired and the check stops.
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from mhsa.port_check.core import transforms
from mhsa.port_check.core.chunks import within
from mhsa.port_check.core.findings import Unheld
from mhsa.port_check.core.records import Mismatched, Paired, Transfer, map_name
from mhsa.port_check.core.transforms import Group, View
from shared.tolerances import max_abs_diff, tolerance

# the layer types whose layouts the readers convert: a pair of these that fits only transposed is a bug of the port
STANDARD = ("Linear", "Embedding", "Conv", "LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm")
# the names one kind of parameter goes by: torch's weight, Flax's kernel, scale and embedding, the
# gamma and beta of older code; weight norm's two factors
CONVENTIONAL = (("weight", "kernel", "scale", "embedding", "gamma"), ("bias", "beta"), ("weight_g", "g"), ("weight_v", "v"))
# a leaf name's layout convention: a Flax kernel's input axes come first, a torch weight's output axes
INPUT_FIRST = {"kernel": True, "weight": False}
# names that say which of a split's parts a module is (q, k, v in that order)
ROLES = (
    {"q", "query", "wq", "to_q", "q_proj", "query_proj"},
    {"k", "key", "wk", "to_k", "k_proj", "key_proj"},
    {"v", "value", "wv", "to_v", "v_proj", "value_proj"},
)
# words that name one thing in two libraries' styles, for telling modules apart by name
SYNONYMS = (
    {"out", "output", "o"},
    {"proj", "projection", "dense", "linear", "fc"},
    {"norm", "ln", "layernorm", "layer_norm", "rmsnorm"},
    {"attn", "attention", "self_attn", "selfattention"},
    {"mlp", "ffn", "feed_forward", "feedforward"},
    {"emb", "embed", "embedding", "embeddings"},
    {"q", "query"},
    {"k", "key"},
    {"v", "value"},
)
SPLIT_MOST = 4  # the most modules one parameter is split into (q, k, v; four gates), or concatenated from


def _module(name: str) -> str:
    return name.rpartition(".")[0]


def _leaf(name: str) -> str:
    return name.rpartition(".")[2]


def _kind(leaf: str) -> tuple[str, ...] | None:
    return next((names for names in CONVENTIONAL if leaf in names), None)


def canonical(path: str) -> str:
    """Linen's naming of a list's items read as torch's: 'down_blocks_0.resnets_1' -> 'down_blocks.0.resnets.1'."""
    return ".".join(re.sub(r"^(.+?)_(\d+)$", r"\1.\2", part) for part in path.split(".")) if path else path


def _convention(leaf: str) -> bool | None:
    """Whether a parameter's name says its input axes come first: a Flax `kernel` (True); a torch
    `weight`, `in_proj_weight`, `weight_ih_l0`, an `embedding` (False); None for any other name."""
    if leaf in INPUT_FIRST:
        return INPUT_FIRST[leaf]
    return False if _role_of(leaf) == "weight" else None


def input_first(reference_leaf: str, port_leaf: str) -> bool | None:
    """Whether the port's array is transposed against the reference's by the names' conventions
    (a `kernel` against a `weight`); None where a name says nothing of it."""
    a, b = _convention(reference_leaf), _convention(port_leaf)
    return None if a is None or b is None else a != b


@dataclass
class Sides:
    """What the pairing reads of both models: parameters (neutral names -> arrays, in each reader's
    order), module types, and the module paths in call order (first calls; `order()` computes them
    on demand: the structure rules need them, most pairings do not)."""

    reference: dict
    port: dict
    reference_types: dict[str, str]
    port_types: dict[str, str]
    order: Callable[[], tuple[list[str], list[str]]]
    _orders: tuple[list[str], list[str]] | None = field(default=None, repr=False)

    def orders(self) -> tuple[list[str], list[str]]:
        if self._orders is None:
            self._orders = self.order()
        return self._orders


def pair_parameters(sides: Sides, name_map=None, names=("torch", "jax")) -> Transfer:
    """Every reference parameter paired with the port's arrays that hold it, by the rules of the
    module docstring; what stays unpaired is listed (Transfer.reference_left and _target)."""
    report = Transfer(sides=names)
    left = Left(list(sides.reference), list(sides.port))
    plain, entries = _aliased(*split_map(name_map), sides)
    _check_plain(plain, sides)
    for rule in RULES:
        rule.run(report, sides, left, plain, entries)
    order = {name: n for n, name in enumerate(sides.reference)}
    report.groups.sort(key=lambda group: (order[group.reference[0]], group.index or 0))  # in the reference's order, whatever rule found them
    # each parameter left over is said once, with the most telling reason: a shape that fits no
    # transform, several candidates, or none at all
    paired = set(report.paired)
    report.mismatched = [pair for pair in report.mismatched if pair.reference not in paired]
    report.transposed_only = [pair for pair in report.transposed_only if pair.reference not in paired]
    report.ambiguous = [(name, options) for name, options in report.ambiguous if name not in paired]
    said = (
        {pair.reference for pair in report.mismatched} | {pair.reference for pair in report.transposed_only} | {name for name, _ in report.ambiguous}
    )
    report.reference_left = [name for name in left.reference if name not in said]
    misfits = {pair.port for pair in report.mismatched} | {pair.port for pair in report.transposed_only}
    report.port_left = [name for name in left.port if name not in misfits]
    report.port_left = _unstacked(report, sides, report.port_left)
    report.renamed = {**renamed_modules(report.groups, sides, {**plain, **report.renamed}), **report.renamed}
    return report


def _unstacked(report: Transfer, sides: Sides, left: list[str]) -> list[str]:
    """The port's parameters left over, a stacked array whose every slice some group pairs not among
    them, one with some slices paired named by the slices left (`h.attn.kernel[3]`)."""
    covered: dict[str, set[int]] = {}
    for group in report.groups:
        if group.index is not None:
            for name in group.port:
                covered.setdefault(name, set()).add(group.index)
    found = []
    for name in left:
        if name not in covered:
            found.append(name)
        else:
            found += [f"{name}[{index}]" for index in range(sides.port[name].shape[0]) if index not in covered[name]]
    return found


@dataclass
class Left:
    """The parameters no rule has paired yet, each side's in its own order."""

    reference: list[str]
    port: list[str]

    def take(self, group: Group, report: Transfer) -> None:
        report.groups.append(group)
        self.reference = [name for name in self.reference if name not in group.reference]
        if group.index is None:  # a stacked array stays open for the other layers' slices
            self.port = [name for name in self.port if name not in group.port]


@dataclass(frozen=True)
class Rule:
    """One row of RULES: a name, what it pairs, and the function that pairs it."""

    name: str
    pairs: str
    run: Callable[[Transfer, Sides, Left, dict, list], None]


# --- the user's map ---


def split_map(name_map: dict | None) -> tuple[dict[str, str], list[tuple[tuple[str, ...], tuple[str, ...], str]]]:
    """(the plain entries {reference prefix or pattern: port prefix}, which map_name reads, and the
    transform entries [(reference names, port names, combine)]): a list value splits ("a": ["b", "c"]),
    a key "a, b" concatenates, a key "a + b" sums (into one port array or a list)."""
    plain: dict[str, str] = {}
    entries = []
    for key, value in (name_map or {}).items():
        ports = tuple(value) if isinstance(value, list) else (value,)
        combine = "sum" if " + " in key else "concat"
        references = tuple(part.strip() for part in re.split(r" \+ |,", key))
        if isinstance(value, list) or len(references) > 1 or value.endswith(".T"):  # a transform, or a layout forced: a group of its own
            entries.append((references, ports, combine))
        else:
            plain[key] = value
    return plain, entries


def check_map(name_map: dict) -> None:
    """Raise ValueError naming the first entry of a name map that is not one (docs/port-check.md,
    "Name maps"): a key a name, a pattern with {fields}, or names joined by ", " or " + "; a value a
    name or a non-empty list of names, using only the key's {fields}, with at most one [index]."""
    for key, value in name_map.items():
        values = value if isinstance(value, list) else [value]
        if not isinstance(key, str) or not key.strip() or not values or not all(isinstance(item, str) and item.strip() for item in values):
            raise ValueError(f"the entry {key!r}: {value!r} is not a name to a name (or to a list of names)")
        fields = set(re.findall(r"\{(\w+)\}", key))
        if re.search(r"\{(?!\w+\})|(?<!\{\w)\}", re.sub(r"\{\w+\}", "", key)):
            raise ValueError(f"the key {key!r} has a brace that is no {{field}}")
        for item in values:
            unknown = set(re.findall(r"\{(\w+)\}", item)) - fields
            if unknown:
                raise ValueError(f"the entry {key!r}: {item!r} uses {{{sorted(unknown)[0]}}}, which the key does not match")
            if len(re.findall(r"\[", item)) > 1 or re.search(r"\[(?!(\{\w+\}|\d+)\])", item):
                raise ValueError(f"the entry {key!r}: {item!r} may hold one index, [{{i}}] or [3], the layer of a stacked array")
        if isinstance(value, list) and (" + " in key or ", " in key) and len(values) == 1:
            raise ValueError(f"the entry {key!r}: a list of one name; give the name itself")


def _check_plain(plain: dict[str, str], sides: Sides) -> None:
    """Raise ValueError naming a renaming entry that pairs nothing: its key no reference parameter
    or module, or, naming a reference parameter, its value no port parameter. A module's entry may
    name a module whose parameters other rules pair (a fused projection's), so its value is not
    held to the port's parameter names."""
    modules = set(sides.reference_types) | {".".join(name.split(".")[:n]) for name in sides.reference for n in range(1, name.count(".") + 1)}
    held = {canonical(re.sub(r"\[\d+\]", "", name)) for name in sides.port}
    for key, value in plain.items():
        parameters = [name for name in sides.reference if _names(key, name)]
        if not parameters and not any(_names(key, module) for module in modules):
            raise ValueError(f"the map's entry {key!r} -> {value!r}: the reference has no parameter or module {key!r}")
        landed = [map_name(name, {key: value}) for name in parameters]
        if parameters and not any(canonical(re.sub(r"\[\d+\]", "", name)) in held for name in landed):
            raise ValueError(f"the map's entry {key!r} -> {value!r}: the port has no parameter {landed[0]!r}")


def _names(key: str, name: str) -> bool:
    """Whether the map's key (a name or a pattern with {fields}) is the whole of `name`."""
    return map_name(name, {key: "*"}) == "*"  # no name is "*": the key matched all of it


OWN_NAMES = ("kernel", "scale", "embedding")  # a JAX library's leaf names that the readers give as torch's `weight`


def _aliased(plain: dict, entries: list, sides: Sides) -> tuple[dict, list]:
    """The map with each port name that ends in a JAX library's own leaf name (`h.attn.c_attn.kernel[{i}]`,
    `ln_f.scale`) given as the readers name that array (`...weight`), where the port has no array
    of the name as written and one of the neutral name: the same array, its layout read as the reader reads it."""
    held = [canonical(re.sub(r"\[\d+\]", "", name)) for name in sides.port]

    def known(name: str) -> bool:
        pattern = re.escape(canonical(re.sub(r"\[[^\]]*\]", "", name))).replace(r"\{", "{").replace(r"\}", "}")
        pattern = re.sub(r"\{\w+\}", r"\\d+", pattern)
        return any(re.fullmatch(pattern, other) for other in held)

    def alias(name: str) -> str:
        found = re.fullmatch(rf"(.*)\.({'|'.join(OWN_NAMES)})((?:\[[^\]]*\])?(?:\.T)?)", name)
        if found is None or known(name.removesuffix(".T")):
            return name
        neutral = f"{found.group(1)}.weight{found.group(3)}"
        return neutral if known(neutral.removesuffix(".T")) else name

    plain = {key: alias(value) for key, value in plain.items()}
    entries = [(references, tuple(alias(port) for port in ports), combine) for references, ports, combine in entries]
    return plain, entries


def _indexed(name: str) -> tuple[str, int | None]:
    """'h.attn.c_proj.kernel[1]' or 'h[1].attn.c_proj.kernel' -> ('h.attn.c_proj.kernel', 1)."""
    found = re.findall(r"\[(\d+)\]", name)
    if len(found) > 1:
        raise ValueError(f"the map gives '{name}' more than one index; expected at most one [i], the layer of a stacked array")
    return re.sub(r"\[\d+\]", "", name), int(found[0]) if found else None


def _expanded(entries, names) -> list[tuple[tuple[str, ...], tuple[str, ...], str]]:
    """The transform entries with their {fields} filled in, once for each way the reference's names
    match every pattern of an entry ("h.{i}.attn.in_proj_weight": [...] for every layer i)."""
    found = []
    for references, ports, combine in entries:
        if not any("{" in name for name in references):
            found.append((references, ports, combine))
            continue
        first = re.escape(references[0]).replace(r"\{", "{").replace(r"\}", "}")
        pattern = re.compile(re.sub(r"\{(\w+)\}", lambda field: f"(?P<{field.group(1)}>\\d+)", first))
        matches = [match.groupdict() for name in names if (match := pattern.fullmatch(name))]
        if not matches:
            raise ValueError(f"the map's entry {references[0]!r} matches none of the reference's parameters")
        for fields in matches:
            found.append((tuple(name.format(**fields) for name in references), tuple(name.format(**fields) for name in ports), combine))
    return found


def _transposed_suffix(name: str) -> tuple[str, bool]:
    return (name[:-2], True) if name.endswith(".T") else (name, False)


def _map_rule(report: Transfer, sides: Sides, left: Left, plain: dict, entries: list) -> None:
    """The map's transform entries, each a group (its layout the one that fits, by the names'
    conventions where several do; `.T` after a port name takes it transposed)."""
    for references, ports, combine in _expanded(entries, sides.reference):
        where = f"the map's entry {', '.join(references)} -> {', '.join(ports)}"
        missing = [name for name in references if name not in sides.reference]
        if missing:
            raise ValueError(f"{where}: the reference has no parameter {missing[0]!r}")
        named = [(_indexed(_transposed_suffix(port)[0]), _transposed_suffix(port)[1]) for port in ports]
        indices = {index for (_, index), _ in named}
        if len(indices) > 1:
            raise ValueError(f"{where}: its port names give different indices {sorted(map(str, indices))}")
        port_names = tuple(name for (name, _), _ in named)
        absent = [name for name in port_names if name not in sides.port]
        if absent:
            raise ValueError(f"{where}: the port has no parameter {absent[0]!r}")
        index = indices.pop()
        group = _group(references, port_names, combine, sides, index, forced=[transposed for _, transposed in named], found="map")
        if group is None:
            shapes = ", ".join(f"{name} {sides.reference[name].shape}" for name in references)
            held = ", ".join(f"{name} {_shape(sides.port[name], index)}" for name in port_names)
            raise ValueError(f"{where}: {shapes} cannot be laid out as {held} (no layout fits, or several do)")
        left.take(group, report)


def _interleavings(options: list[View]) -> bool:
    """Whether the first layout of `options` is one of several that interleave the rows and columns:
    the shapes do not say which the port holds, and neither does a name's convention (an Einsum's
    `kernel` (N, D, H) keeps no input axis first), so none is taken."""
    return bool(options[0].order) and len(options) > 1


def _shape(array, index) -> tuple:
    return tuple(array.shape[1:]) if index is not None else tuple(array.shape)


def _group(references, ports, combine, sides: Sides, index=None, forced=None, found="structure") -> Group | None:
    """The group joining `references` to `ports` (combined by `combine`, cut into one part per port
    array in order), each part's view the first that fits by the names' conventions; None where a
    part fits no view. forced: per port, True to take it transposed (a map's `.T`)."""
    shapes = tuple(tuple(sides.reference[name].shape) for name in references)
    port_shapes = [_shape(sides.port[name], index) for name in ports]
    if index is not None and any(sides.port[name].ndim == 0 or index >= sides.port[name].shape[0] for name in ports):
        return None
    rest = shapes[0][1:]
    if combine == "concat":
        total = sum(shape[0] for shape in shapes) if all(shape[1:] == rest for shape in shapes) else None
    elif combine == "gru":
        total = shapes[0][0] + (shapes[0][0] // 3 if sum(math.prod(shape) for shape in port_shapes) > shapes[0][0] else 0)
    else:
        total = shapes[0][0] if len(set(shapes)) == 1 else None
    if total is None or not shapes[0]:
        return None
    width = math.prod(rest)
    sizes = [math.prod(shape) // width if width and math.prod(shape) % width == 0 else -1 for shape in port_shapes]
    if sum(sizes) != total or min(sizes) <= 0:
        return None
    chosen = []
    for n, (port, size, shape) in enumerate(zip(ports, sizes, port_shapes)):
        options = transforms.views((size, *rest), shape, input_first(_leaf(references[0]), _leaf(port)))
        if forced is not None and forced[n]:
            options = [view for view in options if view.transposed]
        if not options or _interleavings(options):
            return None
        chosen.append(options[0])
    return Group(tuple(references), tuple(ports), tuple(chosen), shapes, combine, index, found)


# --- by name ---


def _name_rule(report: Transfer, sides: Sides, left: Left, plain: dict, entries: list) -> None:
    """Each reference parameter whose name (through the map) is a port parameter's. Its layout:
    as it is; transposed where the port's name is a kernel or the pair of layer types is found to
    keep 2-d weights transposed (a library's Conv1D (in, out)); its head axes split or merged where
    the ranks differ (a LinearGeneral's (D, H, d_head) kernel for a Linear's (H*d_head, D))."""
    _by_name(report, sides, left, plain, lambda name: map_name(name, plain), "name")


def _list_index_rule(report: Transfer, sides: Sides, left: Left, plain: dict, entries: list) -> None:
    """Linen names a list's items `blocks_0` where torch says `blocks.0`: a convention, paired as
    names are, where it leaves one port parameter for each reference one."""
    by_canonical: dict[str, list[str]] = {}
    for name in left.port:
        by_canonical.setdefault(canonical(name), []).append(name)
    unique = {key: names[0] for key, names in by_canonical.items() if len(names) == 1 and key != names[0]}
    _by_name(report, sides, left, plain, lambda name: unique.get(canonical(map_name(name, plain)), ""), "name")


def _by_name(report: Transfer, sides: Sides, left: Left, plain: dict, port_name: Callable[[str], str], found: str) -> None:
    candidates = []
    for name in list(left.reference):
        mapped, index = _indexed(port_name(name))
        if mapped in left.port or (index is not None and mapped in sides.port):
            candidates.append((name, mapped, index))
    transposed_types = _transposed_types(candidates, sides, report)
    for name, mapped, index in candidates:
        value, shape = sides.reference[name], _shape(sides.port[mapped], index)
        kinds = (sides.reference_types.get(_module(name), ""), sides.port_types.get(_module(mapped), ""))
        view = _named_view(name, mapped, value.shape, shape, kinds, transposed_types, report)
        how = found
        if view is None and report.mismatched and report.mismatched[-1].reference == name and report.mismatched[-1].layouts:
            options = transforms.views(value.shape, shape, None)
            port = sides.port[mapped] if index is None else sides.port[mapped][index]
            untransposed = [option for option in options if not option.transposed]
            view, how = _held(value, port, options), "values"
            if view is None and any(_names(key, name) for key in plain) and len(untransposed) == 1:
                view, how = untransposed[0], "map"  # the user's entry for this parameter: untransposed, as `.T` would say otherwise
            if view is not None:
                report.mismatched.pop()
        if view is not None:
            left.take(transforms.one(name, mapped, view, how, index), report)
        else:  # one name, shapes that no transform joins: a misfit, said as such, not for another rule to pair
            left.reference.remove(name)
            if index is None and mapped in left.port:
                left.port.remove(mapped)


def _named_view(name, mapped, source, shape, kinds, transposed_types, report: Transfer) -> View | None:
    """The layout of a pair found by name, or None with the misfit recorded (report.mismatched,
    report.transposed_only)."""
    source, shape = tuple(source), tuple(shape)
    two_d = len(source) == 2 and len(shape) == 2
    if two_d and (kinds in transposed_types or _leaf(mapped) == "kernel" != _leaf(name)):
        if source[::-1] == shape:
            return transforms.transpose(source)
        if kinds in transposed_types:
            report.mismatched.append(Mismatched(name, mapped, source[::-1], shape))
            return None
    if source == shape:
        return transforms.same(source)
    if two_d and source[::-1] == shape:
        report.transposed_only.append(Paired(name, mapped, source, transposed=True))
        return None
    options = transforms.views(source, shape, input_first(_leaf(name), _leaf(mapped)))
    if len(source) != len(shape) and options and (len(options) == 1 or input_first(_leaf(name), _leaf(mapped)) is not None):
        if not _interleavings(options):
            return options[0]
    open_layouts = len(source) != len(shape) and (len(options) > 1 and (input_first(_leaf(name), _leaf(mapped)) is None or _interleavings(options)))
    report.mismatched.append(Mismatched(name, mapped, source, shape, len(options) if open_layouts else 0))
    return None


def _held(value: np.ndarray, port: np.ndarray, options: list[View]) -> View | None:
    """The one layout of `options` under which the port's array holds `value` (a converted port
    says by its values what its shapes leave open); None where none or several do."""
    tol = tolerance("weights", "float64" if value.dtype == np.float64 else "float32")
    holding = [view for view in options if np.ptp(value) > 0 and within(max_abs_diff, tol, view.push(value), port)]
    return holding[0] if len(holding) == 1 else None


def _transposed_types(candidates, sides: Sides, report: Transfer) -> set[tuple[str, str]]:
    """The (reference type, port type) pairs whose 2-d weights are laid out transposed: a pair
    where one side is not a standard layer and a non-square weight fits only transposed."""
    found = set()
    for name, mapped, index in candidates:
        value, expected = sides.reference[name], _shape(sides.port[mapped], index)
        kinds = (sides.reference_types.get(_module(name), ""), sides.port_types.get(_module(mapped), ""))
        standard = kinds[0] in STANDARD and kinds[1] in STANDARD
        if not standard and kinds not in found and value.ndim == 2 and value.shape != expected and value.T.shape == expected:
            found.add(kinds)
            report.layouts.append(
                f"{kinds[0] or '?'} in {report.sides[0]} / {kinds[1] or '?'} in {report.sides[1]}: 2-d weights taken transposed "
                f"('{name}' {value.shape} fits '{mapped}' {expected} only so)"
            )
    return found


# --- conventional renames ---


def _convention_rule(report: Transfer, sides: Sides, left: Left, plain: dict, entries: list) -> None:
    """In the module the map gives (or its list-index reading), the one unpaired port parameter of
    the same kind (CONVENTIONAL) whose shape fits, as it is, transposed or reshaped; where several
    fit, the reference parameter is ambiguous (report.ambiguous), paired by no rule."""
    by_module: dict[str, list[str]] = {}
    for name in left.port:
        by_module.setdefault(canonical(_module(name)), []).append(name)
    found: list[tuple[str, str, View]] = []
    taken: set[str] = set()
    for name in list(left.reference):
        module, leaf = _module(name), _leaf(name)
        kind = _kind(leaf)
        if kind is None:
            continue
        target = canonical(_module(map_name(name, plain))) if module else ""
        options = [other for other in by_module.get(target, []) if _leaf(other) in kind and other not in taken]
        value = sides.reference[name]
        fits = [
            (other, view)
            for other in options
            if (view := _fitting(name, other, value.shape, sides.port[other].shape, (value, sides.port[other]))) is not None
        ]
        siblings = [other for other in left.reference if _module(other) == module and _leaf(other) in kind]
        if len(fits) == 1 and len(options) == 1 and len(siblings) == 1:
            found.append((name, fits[0][0], fits[0][1]))
            taken.add(fits[0][0])
        elif fits:
            report.ambiguous.append((name, sorted(other for other, _ in fits)))
    for name, other, view in found:
        left.take(transforms.one(name, other, view, "convention"), report)


def _fitting(reference: str, port: str, source, shape, values=None) -> View | None:
    """The one layout a conventionally renamed pair takes: a kernel transposed, otherwise as it is;
    reshaped (its head axes) where the ranks differ and the names' conventions, or the shapes, leave
    one; where several interleave the rows and columns, the one the port's values hold (values:
    (the reference's array, the port's), a converted port) or none."""
    source, shape = tuple(source), tuple(shape)
    convention = input_first(_leaf(reference), _leaf(port))
    if len(source) == 2 and len(shape) == 2:
        if _leaf(port) == "kernel" and source[::-1] == shape:
            return transforms.transpose(source)
        return transforms.same(source) if source == shape else (transforms.transpose(source) if source[::-1] == shape else None)
    if source == shape:
        return transforms.same(source)
    options = transforms.views(source, shape, convention)
    if options and _interleavings(options):
        return _held(values[0], values[1], options) if values is not None else None
    return options[0] if options and (len(options) == 1 or convention is not None) else None


# --- stacked layers ---


def _stacked_rule(report: Transfer, sides: Sides, left: Left, plain: dict, entries: list) -> None:
    """A list of layers (torch's `h.0`, `h.1`, ... in a ModuleList) against one stacked array per
    parameter, its leading axis the layer (nnx.vmap at init, run by nnx.scan or jax.lax.scan; Linen's
    nn.scan): `h.1.attn.c_proj.weight` is `h.attn.c_proj.kernel[1]`, each layer's slice laid out as a
    layer's parameter is (transposed, reshaped). Where the port scans a block of g layers, its g
    sub-blocks (`h.layers_0`, `h.layers_1`) each stack every g-th layer: layer i is sub-block i % g,
    slice i // g. Each pairing is a group of one layer (Group.index); the modules pair as
    `h.{i}` -> `h[{i}]` (report.renamed), the port's calls inside its scan recorded so."""
    stacked = {name: int(sides.port[name].shape[0]) for name in left.port if sides.port[name].ndim >= 1}
    if not stacked:
        return
    by_module: dict[str, list[str]] = {}
    for name in stacked:
        by_module.setdefault(canonical(_module(name)), []).append(name)
    layers: dict[tuple[str, int], list[str]] = {}  # (reference prefix, where its layer index sits) -> the reference's parameters there
    for name in left.reference:
        parts = name.split(".")
        for k in range(len(parts) - 1):
            if parts[k].isdigit():
                layers.setdefault((".".join(parts[:k]), k), []).append(name)
    for (prefix, k), names in sorted(layers.items(), key=lambda item: -len(item[1])):
        count = len({int(name.split(".")[k]) for name in names})
        names = [name for name in names if name in left.reference]
        mapped = canonical(map_name(prefix, plain)) if prefix else ""
        found = _stack(names, k, mapped, count, by_module, stacked, sides, report)
        if not found or len(found[0]) < len(names):
            wrapped = [
                found
                for found in (_stack(names, k, inner, count, by_module, stacked, sides, report) for inner in _wrappers(mapped, by_module))
                if found
            ]
            most = max((len(other[0]) for other in wrapped), default=0)
            if most > (len(found[0]) if found else 0):
                best = [other for other in wrapped if len(other[0]) == most]
                found = best[0] if len(best) == 1 else None  # two wrappers that fit alike: the names do not say which
        if found:
            groups, port_prefix, group_size, lines = found
            for group in groups:
                left.take(group, report)
            report.layouts += [line for line in lines if line not in report.layouts]
            # the port's own spelling of a module (Linen's layers_0), every prefix of its parameters' names among them
            modules = {".".join(name.split(".")[:n]) for name in sides.port for n in range(1, name.count(".") + 1)}
            actual = {canonical(path): path for path in [*sides.port_types, *modules]}
            report.renamed.update(_stack_entries(prefix, port_prefix, group_size, count, by_module, actual))


def _stack(names, k, port_prefix: str, count: int, by_module, stacked, sides: Sides, report: Transfer):
    """(groups, port_prefix, block size g, layout lines) of the block size under which the most of
    `names` pair with a slice of a stacked array under `port_prefix`; None where none does."""
    best = None
    for group_size in _group_sizes(port_prefix, by_module, count):
        layouts = Transfer(sides=report.sides)
        found = _layers(names, k, port_prefix, group_size, by_module, stacked, sides, layouts)
        if found and (best is None or len(found) > len(best[0])):
            best = (found, port_prefix, group_size, layouts.layouts)
    return best


def _wrappers(port_prefix: str, by_module: dict) -> list[str]:
    """The modules one level under `port_prefix` that hold stacked arrays, where the port wraps its
    stack in a module of its own (a library's StackedLayers holding `_stacked`): `h._stacked`."""
    start = f"{port_prefix}." if port_prefix else ""
    found = {module[len(start) :].split(".")[0] for module in by_module if module.startswith(start) and module != port_prefix}
    return [f"{start}{word}" for word in sorted(found) if not word.isdigit()]


def _group_sizes(port_prefix: str, by_module: dict, count: int) -> list[int]:
    """1 (each stacked array holds every layer), then the sizes g of blocks of g sub-blocks the
    port's modules under `port_prefix` show (`h.layers_0` ... `h.layers_{g-1}`) that divide `count`."""
    found = [1]
    start = f"{port_prefix}." if port_prefix else ""
    subs: set[tuple[str, int]] = set()
    for module in by_module:
        if module.startswith(start):
            parts = module[len(start) :].split(".")
            if len(parts) >= 2 and parts[1].isdigit():
                subs.add((parts[0], int(parts[1])))
    for word in {word for word, _ in subs}:
        size = 1 + max(index for other, index in subs if other == word)
        if size > 1 and count % size == 0 and {index for other, index in subs if other == word} == set(range(size)):
            found.append(size)
    return found


def _layers(names, k, port_prefix: str, size: int, by_module, stacked, sides: Sides, report: Transfer) -> list[Group]:
    """The groups pairing each reference parameter of a list of layers (`names`, its layer index
    the k-th part of its name) with a slice of a stacked port array, a parameter of the layer (its
    path in it, `attn.q_proj.weight`) paired in every layer or in none (left for the map to say,
    where the port names or shapes it otherwise). A layer's 2-d weights are laid out as the name
    rule lays them out: transposed for a pair of layer types where one is no standard layer and a
    non-square weight fits only transposed (a library's Conv1D against a Linear), square ones included."""
    sub = {}
    if size > 1:  # the sub-blocks' own names: (word, index) -> their module prefix
        start = f"{port_prefix}." if port_prefix else ""
        for module in by_module:
            parts = module[len(start) :].split(".") if module.startswith(start) else []
            if len(parts) >= 2 and parts[1].isdigit() and int(parts[1]) < size:
                sub[int(parts[1])] = f"{start}{parts[0]}.{parts[1]}"
    found, dropped = [], set()
    for name in names:
        parts = name.split(".")
        layer, rest = int(parts[k]), parts[k + 1 :]
        block = port_prefix if size == 1 else sub.get(layer % size, "")
        index = layer if size == 1 else layer // size
        module = canonical(".".join(part for part in [block, *rest[:-1]] if part))
        kind = _kind(rest[-1])
        options = [other for other in by_module.get(module, []) if _leaf(other) == rest[-1]]
        options = options or [other for other in by_module.get(module, []) if kind is not None and _leaf(other) in kind]
        options = [other for other in options if index < stacked[other]]
        if len(options) != 1:
            dropped.add(".".join(rest))
        found.append((name, options[0] if len(options) == 1 else "", index, ".".join(rest)))
    candidates = [(name, other, index) for name, other, index, rest in found if rest not in dropped]
    transposed_types = _transposed_types(candidates, sides, report)
    views: dict[str, View | None] = {}
    for name, other, index in candidates:
        source, shape = tuple(sides.reference[name].shape), tuple(sides.port[other].shape[1:])
        kinds = (sides.reference_types.get(_module(name), ""), sides.port_types.get(_module(other), ""))
        if len(source) == 2 and kinds in transposed_types:
            views[name] = transforms.transpose(source) if source[::-1] == shape else None
        else:
            views[name] = _fitting(name, other, source, shape, (sides.reference[name], sides.port[other][index]))
        if views[name] is None:
            dropped.add(".".join(name.split(".")[k + 1 :]))
    kept = [(name, other, index, views[name]) for name, other, index in candidates if ".".join(name.split(".")[k + 1 :]) not in dropped]
    return [transforms.one(name, other, view, "stacked", index) for name, other, index, view in kept if view is not None]


def _stack_entries(prefix: str, port_prefix: str, size: int, count: int, by_module, actual: dict[str, str]) -> dict[str, str]:
    """The module map of a stack: {"h.{i}": "h[{i}]"}, or one entry per layer where the port scans
    blocks of `size` layers ({"h.3": "h[1].layers_1"}); port modules as the port spells them."""
    head = f"{prefix}." if prefix else ""
    root = actual.get(port_prefix, port_prefix)
    if size == 1:
        return {f"{head}{{i}}": f"{root}[{{i}}]"}
    start = f"{port_prefix}." if port_prefix else ""
    blocks = {}
    for module in by_module:
        parts = module[len(start) :].split(".") if module.startswith(start) else []
        if len(parts) >= 2 and parts[1].isdigit():
            spelled = actual.get(f"{start}{parts[0]}.{parts[1]}", f"{start}{parts[0]}.{parts[1]}")
            blocks[int(parts[1])] = spelled[len(actual.get(port_prefix, port_prefix)) + 1 :] if port_prefix else spelled
    return {f"{head}{layer}": f"{root}[{layer // size}].{blocks[layer % size]}" for layer in range(count)}


# --- recurrent cells ---


@dataclass(frozen=True)
class Cell:
    """How a JAX library's recurrent cell holds one layer (one direction) of torch's nn.LSTM, nn.GRU
    or nn.RNN: `inputs`, `hidden` are its kernels for the input's and the hidden state's gates (one
    each when packed in torch's order, else one per gate in torch's order), `biases` where torch's two
    biases go (combined by `combine`), `exact` whether they train alike."""

    torch: str  # the torch module type it ports
    inputs: tuple[str, ...]
    hidden: tuple[str, ...]
    biases: tuple[str, ...]
    combine: str


CELLS = (
    # Flax NNX: one Linear per gate (torch's order i, f, g, o), the input's without a bias
    Cell(
        "LSTM",
        ("ii.weight", "if_.weight", "ig.weight", "io.weight"),
        ("hi.weight", "hf.weight", "hg.weight", "ho.weight"),
        ("hi.bias", "hf.bias", "hg.bias", "ho.bias"),
        "sum",
    ),
    Cell("LSTM", ("dense_i.weight",), ("dense_h.weight",), ("dense_h.bias",), "sum"),  # nnx.OptimizedLSTMCell: packed as torch packs
    Cell("LSTM", ("weight_ih",), ("weight_hh",), ("bias",), "sum"),  # Equinox's LSTMCell
    Cell("GRU", ("dense_i.weight",), ("dense_h.weight",), ("dense_i.bias",), "gru"),  # nnx.GRUCell: no room for b_hn
    Cell("GRU", ("weight_ih",), ("weight_hh",), ("bias", "bias_n"), "gru"),  # Equinox's GRUCell: bias_n is b_hn
    Cell("RNN", ("dense_i.weight",), ("dense_h.weight",), ("dense_i.bias",), "sum"),  # nnx.SimpleCell
)


def _cells_rule(report: Transfer, sides: Sides, left: Left, plain: dict, entries: list) -> None:
    """Each torch LSTM, GRU or RNN module left unpaired, against the cells the port holds in its
    counterpart (or anywhere, when it has none) in call order, or path order: layer by layer, each
    layer's forward direction before its reverse."""
    for module, kind in sides.reference_types.items():
        if kind not in ("LSTM", "GRU", "RNN"):
            continue
        layers = _torch_layers(module, left.reference)
        if not layers:
            continue
        scope = map_name(module, plain)
        found = _port_cells(kind, scope, left.port, sides)
        if len(found) != len(layers):
            continue
        groups = []
        for (suffix, names), (cell, path) in zip(layers, found):
            prefix = f"{path}." if path else ""
            weights = [f"{module}.weight_ih_{suffix}", f"{module}.weight_hh_{suffix}"]
            groups.append(_group((weights[0],), tuple(prefix + p for p in cell.inputs), "concat", sides, found="cells"))
            groups.append(_group((weights[1],), tuple(prefix + p for p in cell.hidden), "concat", sides, found="cells"))
            biases = (f"{module}.bias_ih_{suffix}", f"{module}.bias_hh_{suffix}")
            if biases[0] in names:
                groups.append(_group(biases, tuple(prefix + p for p in cell.biases if prefix + p in sides.port), cell.combine, sides, found="cells"))
        if all(group is not None for group in groups):
            for group in groups:
                left.take(typing.cast(Group, group), report)
            if kind == "GRU" and any(group is not None and group.combine == "gru" and len(group.port) == 1 for group in groups):
                why = "its GRU cell has no bias inside r * (W_hn h + b_hn)"
                report.lost.append(Unheld(module, "torch's b_hn (the last third of each bias_hh)", why))


def _torch_layers(module: str, names: list[str]) -> list[tuple[str, list[str]]]:
    """[(suffix 'l0', 'l0_reverse', ..., its parameters)] of a torch recurrent module, in torch's order."""
    found: dict[str, list[str]] = {}
    for name in names:
        match = re.fullmatch(re.escape(module + ".") + r"(?:weight|bias)_(?:ih|hh)_(l\d+(?:_reverse)?)", name) if module else None
        if match is None and not module:
            match = re.fullmatch(r"(?:weight|bias)_(?:ih|hh)_(l\d+(?:_reverse)?)", name)
        if match:
            found.setdefault(match.group(1), []).append(name)
    return sorted(found.items(), key=lambda item: (int(item[0][1:].split("_")[0]), item[0].endswith("_reverse")))


def _port_cells(kind: str, scope: str, names: list[str], sides: Sides) -> list[tuple[Cell, str]]:
    """[(its Cell, its path)] of every cell the port holds for a torch module of type `kind`, under
    `scope` when the port has that module, else anywhere; in call order, then path order, each
    layer's reverse direction (a path naming back, backward or reverse) after its forward one."""
    inside = [name for name in names if not scope or name.startswith(scope + ".")] if scope in sides.port_types else names
    found: dict[str, Cell] = {}
    for cell in CELLS:
        if cell.torch != kind:
            continue
        for name in inside:
            for leaf in cell.inputs[:1]:
                if name == leaf or name.endswith("." + leaf):
                    path = name[: -len(leaf)].rstrip(".")
                    if all((f"{path}." if path else "") + p in sides.port for p in cell.inputs + cell.hidden):
                        found.setdefault(path, cell)
    calls = {path: n for n, path in enumerate(sides.orders()[1])}

    def key(path: str):
        parts = path.split(".")
        backward = any(word in part.lower() for part in parts for word in ("back", "reverse"))
        numbers = [int(part) if part.isdigit() else -1 for part in canonical(path).split(".")]
        first = min((calls[p] for p in calls if p == path or p.startswith(path + ".") or path.startswith(p + ".") and p), default=len(calls))
        return (numbers, first, backward, path)

    return [(found[path], path) for path in sorted(found, key=key)]


# --- structure ---


@dataclass
class Unit:
    """The parameters one module holds directly, left unpaired."""

    module: str
    names: list[str]


def _units(names: list[str], order: list[str]) -> list[Unit]:
    """The parameters grouped by module, modules in call order (first calls), those never called after
    them in the order their parameters come."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(_module(name), []).append(name)
    rank = {path: n for n, path in reversed(list(enumerate(order)))}
    listed = list(groups)
    ordered = sorted(groups, key=lambda path: (rank.get(path, len(order) + listed.index(path)),))
    return [Unit(path, groups[path]) for path in ordered]


def _structure_rule(report: Transfer, sides: Sides, left: Left, plain: dict, entries: list) -> None:
    """The modules left on both sides aligned in call order (align), scope by scope: the reference's
    modules under one that the port has too (through the map, or Linen's list index) against the
    port's under it, then whatever is left, model-wide. One module against one where their
    parameters pair by kind and shape, one against several consecutive ones (a fused projection
    split, q, k, v by their names where they have them), or several against one (concatenated).
    A module that could pair several ways stays unpaired: report.ambiguous names its candidates."""
    if not left.reference or not left.port:
        return
    reference_order, port_order = sides.orders()
    by_canonical = {canonical(path): path for path in sides.port_types}
    scopes: dict[str, str] = {}  # reference module -> its port module, for every one the port has
    for unit in _units(left.reference, reference_order):
        path = unit.module
        while True:
            mapped = map_name(path, plain)
            found = mapped if mapped in sides.port_types else by_canonical.get(canonical(mapped))
            if found is not None or not path:
                scopes[unit.module] = path if found is not None else ""
                break
            path = path.rpartition(".")[0]
    port_scopes = {}
    for path in set(scopes.values()):
        mapped = map_name(path, plain)
        port_scopes[path] = mapped if mapped in sides.port_types else by_canonical.get(canonical(mapped), "")
    deepest = sorted(port_scopes.items(), key=lambda item: -len(item[1]))

    def port_scope(name: str) -> str | None:
        return next((scope for scope, path in deepest if not path or name == path or name.startswith(path + ".")), None)

    considered: set[str] = set()  # the units a scope's alignment has seen: the model-wide one is for the rest
    ordered: list[str | None] = [*sorted(set(scopes.values()), key=len, reverse=True), None]
    for scope in ordered:  # each scope, then model-wide
        references = [name for name in left.reference if name not in considered and (scope is None or scopes.get(_module(name)) == scope)]
        ports = [name for name in left.port if name not in considered and (scope is None or port_scope(_module(name)) == scope)]
        if not references or not ports:
            continue
        considered.update(references + ports)
        matches, ambiguous = align(_units(references, reference_order), _units(ports, port_order), sides)
        for groups in matches:
            for group in groups:
                left.take(group, report)
        report.ambiguous += ambiguous


def align(references: list[Unit], ports: list[Unit], sides: Sides) -> tuple[list[list[Group]], list[tuple[str, list[str]]]]:
    """The alignment of the two lists of units that pairs the most reference parameters (then the
    most alike names), by dynamic programming over moves: skip a unit, pair one with one, one with
    up to SPLIT_MOST consecutive ones (split) or those with one (concatenated). Returns the groups
    of the pairs that every best alignment makes, and [(reference module, the port modules it pairs
    with in some best alignment)] for the reference modules that best alignments pair otherwise."""
    n, m = len(references), len(ports)
    sizes = [sum(sides.reference[name].size for name in unit.names) for unit in references]
    port_sizes = [sum(sides.port[name].size for name in unit.names) for unit in ports]
    largest = [max(sides.reference[name].size for name in unit.names) for unit in references]
    port_largest = [max(sides.port[name].size for name in unit.names) for unit in ports]
    cache: dict[tuple, list[Group] | None] = {}

    def fit(i: int, a: int, j: int, b: int) -> list[Group] | None:
        key = (i, a, j, b)
        if key not in cache:  # the sizes first: most pairs of modules end there, before any shape is read
            plausible = largest[i] == port_largest[j] if a == b == 1 else sum(sizes[i : i + a]) == sum(port_sizes[j : j + b])
            cache[key] = _fit_units(references[i : i + a], ports[j : j + b], sides) if plausible else None
        return cache[key]

    def moves(i: int, j: int):
        if i < n:
            yield i + 1, j, None
        if j < m:
            yield i, j + 1, None
        for a, b in ((1, 1), *((1, k) for k in range(2, SPLIT_MOST + 1)), *((k, 1) for k in range(2, SPLIT_MOST + 1))):
            if i + a <= n and j + b <= m:
                groups = fit(i, a, j, b)
                if groups is not None:
                    yield i + a, j + b, groups

    best: dict[tuple[int, int], tuple[int, int]] = {}
    after: dict[tuple[int, int], int] = {}  # how many best alignments lead from a state to the end
    edges: dict[tuple[int, int], list] = {}  # each state's best moves
    for i in range(n, -1, -1):
        for j in range(m, -1, -1):
            if (i, j) == (n, m):
                best[(i, j)], after[(i, j)] = (0, 0), 1
                continue
            scored = [(_plus(_score(groups), best[(x, y)]), x, y, groups) for x, y, groups in moves(i, j)]
            top = max(score for score, *_ in scored)
            best[(i, j)] = top
            edges[(i, j)] = [(x, y, groups) for score, x, y, groups in scored if score == top]
            after[(i, j)] = sum(after[(x, y)] for x, y, _ in edges[(i, j)])
    before: dict[tuple[int, int], int] = {(0, 0): 1}  # how many best alignments reach a state from the start
    for i in range(n + 1):
        for j in range(m + 1):
            for x, y, _ in edges.get((i, j), []) if (i, j) in before else []:
                before[(x, y)] = before.get((x, y), 0) + before[(i, j)]
    total = after[(0, 0)]
    matches: list[list[Group]] = []
    options: dict[int, set[str]] = {}
    for (i, j), moved in edges.items():
        for x, y, groups in moved if (i, j) in before else []:
            if groups is None:
                continue
            if before[(i, j)] * after[(x, y)] == total:  # in every best alignment
                matches.append(groups)
            else:
                for k in range(i, x):
                    options.setdefault(k, set()).add(", ".join(unit.module or "(the model)" for unit in ports[j:y]))
    decided = {name for groups in matches for group in groups for name in group.reference}
    ambiguous = [
        (references[k].module or "(the model)", sorted(found)) for k, found in sorted(options.items()) if references[k].names[0] not in decided
    ]
    return matches, ambiguous


def _score(groups: list[Group] | None) -> tuple[int, int]:
    if groups is None:
        return (0, 0)
    return (sum(len(group.reference) for group in groups), sum(_alike(group) for group in groups))


def _plus(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0] + b[0], a[1] + b[1])


def _tokens(path: str) -> set[str]:
    words = set()
    for part in re.split(r"[._]", path.lower()):
        if not part or part.isdigit():
            continue
        words.add(part)
        words.update(w for group in SYNONYMS if part in group for w in group)
    return words


def _alike(group: Group) -> int:
    """How alike the two sides' module names are: the words they share, synonyms counted (second to
    the parameters paired: names only break ties between pairings of as many parameters)."""
    reference = _tokens(_module(group.reference[0]).rpartition(".")[2])
    port = set().union(*(_tokens(_module(name).rpartition(".")[2]) for name in group.port))
    return len(reference & port)


def _fit_units(references: list[Unit], ports: list[Unit], sides: Sides) -> list[Group] | None:
    """The groups pairing these reference units with these port units, every reference parameter
    paired, or None: one with one by kind and shape; one with several (split: each kind's array cut
    into the ports' in order, q, k, v by their names where they have them); several with one."""
    if len(references) == 1 and len(ports) == 1:
        return _one_to_one(references[0], ports[0], sides)
    if len(references) == 1:
        ports = _by_role(ports)
        return _split(references[0], ports, sides)
    return _concatenated(_by_role(references), ports[0], sides)


def _by_role(units: list[Unit]) -> list[Unit]:
    """The units in q, k, v order where each names one of the three (ROLES), else as they are."""
    roles = [next((n for n, names in enumerate(ROLES) if unit.module.rpartition(".")[2].lower() in names), None) for unit in units]
    if None in roles or len(set(roles)) != len(roles):
        return units
    return [unit for _, unit in sorted(zip(roles, units), key=lambda item: item[0] or 0)]


def _one_to_one(reference: Unit, port: Unit, sides: Sides) -> list[Group] | None:
    """One module's parameters against another's, each by its name or its kind, its shape fitting:
    the groups of those that pair (a bias the port has not stays unpaired, for the check to name),
    None where the weight does not pair or a parameter could pair several ways."""
    groups = []
    free = list(port.names)
    for name in reference.names:
        kind = _kind(_leaf(name))
        same = [other for other in free if _leaf(other) == _leaf(name)]
        options = same or [other for other in free if kind is not None and _leaf(other) in kind]
        shape = sides.reference[name].shape
        fits = [
            (other, view)
            for other in options
            if (view := _fitting(name, other, shape, sides.port[other].shape, (sides.reference[name], sides.port[other]))) is not None
        ]
        if len(fits) > 1:
            return None
        if not fits:
            if _role_of(_leaf(name)) == "weight":
                return None
            continue
        other, view = fits[0]
        free.remove(other)
        groups.append(transforms.one(name, other, view, "structure"))
    return groups or None


def _role_of(leaf: str) -> str | None:
    """The kind of parameter a leaf name says: 'weight' (weight, kernel, scale, ..., in_proj_weight,
    weight_ih_l0), 'bias' (bias, beta, in_proj_bias, bias_hh_l0), weight norm's two; None otherwise."""
    kind = _kind(leaf)
    if kind is not None:
        return kind[0]
    for role in ("weight", "bias"):
        if leaf.endswith("_" + role) or leaf.startswith(role + "_"):
            return role
    return None


def _of_role(units: list[Unit], role: str | None) -> list[str] | None:
    """Each unit's one parameter of `role` (weight, bias), in order; None where a unit has none or several."""
    found = []
    for unit in units:
        of_role = [name for name in unit.names if _role_of(_leaf(name)) == role]
        if len(of_role) != 1:
            return None
        found.append(of_role[0])
    return found


def _split(reference: Unit, ports: list[Unit], sides: Sides) -> list[Group] | None:
    """One module's weight and bias (say a fused qkv) cut into several modules' (q, k, v)."""
    groups = []
    for name in reference.names:
        parts = _of_role(ports, _role_of(_leaf(name)))
        group = None if parts is None else _group((name,), tuple(parts), "concat", sides)
        if group is None:
            return None
        groups.append(group)
    covered = {other for group in groups for other in group.port}
    if any(other not in covered for unit in ports for other in unit.names if _role_of(_leaf(other)) is not None):
        return None  # a port module holding a kind the reference's has not (a bias on the port only)
    return groups


def _concatenated(references: list[Unit], port: Unit, sides: Sides) -> list[Group] | None:
    """Several modules' weights and biases (q, k, v) held concatenated in one port module's."""
    groups = []
    for other in port.names:
        parts = _of_role(references, _role_of(_leaf(other)))
        group = None if parts is None else _group(tuple(parts), (other,), "concat", sides)
        if group is None:
            return None
        groups.append(group)
    covered = {name for group in groups for name in group.reference}
    return groups if all(name in covered for unit in references for name in unit.names) else None


def _values_rule(report: Transfer, sides: Sides, left: Left, plain: dict, entries: list) -> None:
    """A reference parameter that conventions leave ambiguous (a norm holding both `scale` and
    `gamma`), paired with the one candidate that holds its values, laid out as the names say: a
    converted port says by its values which it is. A fresh port's random values match none, and
    the parameter stays ambiguous: the check stops. The outputs of a converted port are its own
    whichever it is paired with, so no verdict rests on this choice, only which array a gradient
    row or a differing weight is named by."""
    still = []
    for name, options in report.ambiguous:
        if name not in sides.reference or name not in left.reference:
            still.append((name, options))
            continue
        value = sides.reference[name]
        tol = tolerance("weights", "float64" if value.dtype == np.float64 else "float32")
        matching = []
        for other in options:
            view = _fitting(name, other, value.shape, sides.port[other].shape) if other in left.port else None
            if view is not None and within(max_abs_diff, tol, view.push(value), sides.port[other]) and np.ptp(value) > 0:
                matching.append((other, view))
        if len(matching) == 1:
            left.take(transforms.one(name, matching[0][0], matching[0][1], "values"), report)
        else:
            still.append((name, options))
    report.ambiguous = still


RULES = (
    Rule("map", "the name map's transform entries", _map_rule),
    Rule("name", "the same name through the map", _name_rule),
    Rule("list index", "Linen's blocks_0 for torch's blocks.0", _list_index_rule),
    Rule("convention", "weight / kernel / scale / embedding / gamma, bias / beta, in the module's counterpart", _convention_rule),
    Rule("stacked", "a list of layers against arrays stacked on a leading layer axis (scanned)", _stacked_rule),
    Rule("cells", "torch's LSTM, GRU, RNN against a JAX library's cells (CELLS)", _cells_rule),
    Rule("structure", "modules in call order: one with one, one split into several, several concatenated", _structure_rule),
    Rule("values", "a parameter the names leave ambiguous, with the one candidate holding its values (a converted port)", _values_rule),
)


# --- the modules the pairing renames ---


def renamed_modules(groups: Sequence[Group], sides: Sides, plain: dict) -> dict[str, str]:
    """{reference module path: port module path} for every module that the pairing found under
    another name (list index, conventions, structure), shortened to the renamed prefix where that
    changes nothing else: with the user's map, what the rows and the lint pair modules by."""
    entries: dict[str, str] = {}
    for group in groups:
        if len(group.reference) != 1 or len(group.port) != 1 or group.found in ("cells", "map") or group.index is not None:
            continue  # a recurrent layer's cells, a layer's slice of a stack (however paired: its own entry), what a map pairs
        reference, port = _module(group.reference[0]), _module(group.port[0])
        if map_name(reference, plain) != port:
            entries[reference] = port
    for path in sides.port_types:  # modules without parameters of their own (a list's items, activations)
        key = canonical(path)
        if key != path and key in sides.reference_types and map_name(key, {**plain, **entries}) not in sides.port_types:
            entries[key] = path
    return _shortened(entries, plain)


def _shortened(entries: dict[str, str], plain: dict) -> dict[str, str]:
    """Module entries that rename the same leading parts, shortened to that prefix where every
    entry still maps as it did."""
    prefixes: dict[str, set[str]] = {}
    for source, target in entries.items():
        s, t = source.split("."), target.split(".")
        common = 0
        while common < min(len(s), len(t)) - 1 and s[-1 - common] == t[-1 - common]:
            common += 1
        prefixes.setdefault(".".join(s[: len(s) - common]), set()).add(".".join(t[: len(t) - common]))
    short = {source: targets.pop() for source, targets in prefixes.items() if len(targets) == 1}
    if all(map_name(source, {**plain, **short}) == target for source, target in entries.items()):
        return short
    return entries


def pull(groups: Sequence[Group], arrays: dict[str, np.ndarray], exact_only: bool = False) -> dict[str, np.ndarray]:
    """The port's arrays ({port name: array}) in the reference's names and layouts, every group whose
    port arrays are all given; exact_only: leave out the groups whose values do not pull back (a sum:
    only gradients do)."""
    found: dict[str, np.ndarray] = {}
    taker = Pulling(groups, found.__setitem__, exact_only, copy_slices=False)  # all of `arrays` held already: slices stay views
    for name, value in arrays.items():
        taker(name, value)
    return {name: found[name] for group in groups for name in group.reference if name in found}


class Pulling:
    """pull for arrays handed over one at a time (`self(port name, array)`, as a reader's
    each_gradient hands them): each group pulled back into the reference's names once all its port
    arrays have come, every result handed to `each(reference name, array)`, and each port array let
    go once no group waits for it. A stacked layer's slice is copied out (copy_slices), so that the
    stacked array goes with its last layer, not with the last of its slices to be let go."""

    def __init__(self, groups: Sequence[Group], each: Callable[[str, np.ndarray], None], exact_only: bool = False, copy_slices: bool = True):
        self.each, self.copy_slices = each, copy_slices
        self.waiting: dict[str, list[Group]] = {}  # port name -> the groups that read it
        for group in groups:
            if not exact_only or group.exact:
                for name in group.port:
                    self.waiting.setdefault(name, []).append(group)
        self.left = {name: len(waiting) for name, waiting in self.waiting.items()}  # groups not yet pulled, per port array
        self.held: dict[str, np.ndarray] = {}

    def __call__(self, name: str, array: np.ndarray) -> None:
        if not self.left.get(name) or name in self.held:  # no group reads it, or all have (handed over twice)
            return
        self.held[name] = array
        del array
        for group in self.waiting[name]:
            if any(port not in self.held for port in group.port):
                continue
            values = group.pull([self.held[port] for port in group.port])
            for reference, value in zip(group.reference, values):
                self.each(reference, np.array(value) if self.copy_slices and group.index is not None else value)
            del values
            for port in group.port:
                self.left[port] -= 1
                if self.left[port] == 0:
                    del self.held[port]  # its groups are all pulled: let go


def push(groups: Sequence[Group], arrays: dict[str, np.ndarray], shapes: dict[str, tuple]) -> dict[str, np.ndarray]:
    """The reference's arrays ({reference name: array}) as the port holds them: {port name: array},
    a stacked array assembled from its layers' groups (shapes: the port arrays' full shapes)."""
    found: dict[str, np.ndarray] = {}
    for group in groups:
        values = group.push([arrays[name] for name in group.reference])
        for name, value in zip(group.port, values):
            if group.index is None:
                found[name] = value
            else:
                if name not in found:
                    found[name] = np.zeros(shapes[name], value.dtype)
                found[name][group.index] = value
    return found
