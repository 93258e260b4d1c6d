"""The line printed for each finding of a port check (core/findings.py): `line(finding, sides)`,
sides the names of the reference's and the port's frameworks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mhsa.port_check.core import findings as f
from mhsa.port_check.core.padding import explain_same
from mhsa.port_check.core.records import WHY
from mhsa.port_check.core.training_records import MOMENTS
from mhsa.port_check.forward.derived import NOT_A_TWIN


def line(finding, sides: tuple[str, str] = ("torch", "jax")) -> str:
    return RENDERERS[type(finding)](finding, sides)


def differences(what: str, findings: list[str]) -> list[str]:
    """A lint's lines in either report: 'what: no differences' or 'what: 2 difference(s)', then each finding."""
    return [f"{what}: " + ("no differences" if not findings else f"{len(findings)} difference(s)")] + [f"  {finding}" for finding in findings]


def some(names, shown: int = 4) -> str:
    """ "'a', 'b' and 3 more": the first few of a list of row names, each once."""
    names = list(dict.fromkeys(names))
    return ", ".join(f"'{name}'" for name in names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _lint(d: f.LintDifference, sides) -> str:
    where = d.path or "(the model)"
    if d.setting == "type":
        return f"{where}: {d.kind} in {sides[0]}, {d.port} in {sides[1]}"
    if (d.kind, d.setting) == ("BatchNorm", "momentum") and isinstance(d.port, float):  # read in torch's convention: say both
        return (
            f"{where}: BatchNorm momentum {d.reference!r} in {sides[0]}, {d.port!r} in {sides[1]} in {sides[0]}'s convention "
            f"({sides[1]}'s own setting {round(1 - d.port, 12)!r}: torch weighs the new batch by momentum, Flax and Equinox "
            f"the running statistics; {sides[0]}'s {d.reference!r} is their {round(1 - d.reference, 12)!r})"
        )
    why = explain_same(*d.same) if d.same is not None else WHY.get((d.kind, d.setting), "")
    if d.setting in ("bias", "active"):
        return f"{where}: {d.kind} {d.setting} in {sides[0] if d.reference else sides[1]} only" + (f" ({why})" if why else "")
    return f"{where}: {d.kind} {d.setting} {d.reference!r} in {sides[0]}, {d.port!r} in {sides[1]}" + (f" ({why})" if why else "")


def _listed(pairs) -> str:
    return ", ".join(f"'{name}' ({why})" for name, why in pairs[:4]) + (f" and {len(pairs) - 4} more" if len(pairs) > 4 else "")


APART = {
    "dropout": lambda n: f"its dropout {some(n.also)} is active (train mode), so each run draws other numbers",
    "random": lambda n: "two float32 runs of it on the same inputs differ too, so it draws random numbers (a layer in train mode)",
    "deterministic": lambda n: (
        "two float32 runs of it agree, so it is deterministic: a branch on a value (a comparison, an argmax, a top-k), "
        "a cancellation that float32 rounding dominates, or code that computes otherwise in float64"
    ),
}
NOTES = {
    "inputs cast": lambda n, s: f"inputs: {', '.join(n.names)} arrays cast to {n.dtype} (exactly: every such value is a {n.dtype} value)",
    "dtype set": lambda n, s: f"compute dtype set to {n.dtype} as asked: " + ", ".join(n.names),
    "unread": lambda n, s: (
        f"{len(n.names)} variable(s) of the {n.side} ({s[n.side == 'port']}) are never read by its forward pass, and not checked: {some(n.names)}"
    ),
    "tied": lambda n, s: f"tied in {s[0]}: " + ", ".join(f"{a} is {b}" for a, b in n.names) + " (one parameter, paired once)",
    "left out": lambda n, s: "the gradients' direction leaves out the port's output " + ", ".join(n.names),
    "frozen": lambda n, s: f"gradients not compared, as {s[0]} does not train them (frozen): {some(n.names)}",
    "not floats": lambda n, s: f"not compared, as they are not floating-point arrays: {_listed(n.names)}",
    "none": lambda n, s: f"not compared, as one side returns None there: {_listed(n.names)}",
    "no float64": lambda n, s: f"the reference cannot run in float64 ({n.error}): its float32 rows hold the fixed tolerances of docs/DESIGN.md",
    "fixed": lambda n, s: (
        f"the reference computes {some(n.names)} in float32 even in float64, from float32 the twin cannot widen (computed outside "
        "the framework, through NumPy say, by a JAX model run untraced, or in a JAX operation the twin cannot rebuild): "
        "those rows hold the fixed tolerance"
    ),
    "apart": lambda n, s: (
        f"the reference's float64 run differs from its float32 run by more than rounding (over {NOT_A_TWIN:g} of the largest "
        f"value) at {some(n.names)}: {APART[n.why](n)}; those rows hold the fixed tolerance"
    ),
    "no float32": lambda n, s: f"the reference cannot run in float32 ({n.error}): its rows judged at float32 hold the fixed tolerance",
    "port alone": lambda n, s: f"the port cannot run in {n.dtype} ({n.error}): its rows hold the reference's error alone",
}


def _where(path: str) -> str:
    return f"'{path}'" if path else "the model itself"


def _precision(p: f.Precision, sides) -> str:
    if p.kind == "more":
        return f"and {p.count} more module(s) of {p.side}"
    if p.kind == "holds":
        shown = ", ".join(f"{name}={value}" for name, value in p.attributes)
        text = f"{_where(p.path)} in {p.side} holds {shown}, below the {p.asked} asked for"
    elif p.kind == "computes":
        text = (
            f"{_where(p.path)} computes in {p.dtype} in {p.side}, below the {p.asked} asked for "
            "(none of its attributes says so: a cast in its code, or in code it calls)"
        )
    else:
        text = (
            f"in {p.side}, the code rounds through {p.dtype} before or inside {_where(p.path)} (the first output computed through it), "
            f"below the {p.asked} asked for: a cast that converts back"
        )
    if p.judged_at is None:
        return text
    if p.kind == "rounds":
        return text + f"; the rows computed through it are compared at {p.judged_at or 'no'} tolerance"
    if p.judged_at:
        return text + f"; from its first call on, the rows are compared at {p.judged_at}'s tolerance, not {p.asked}'s"
    return text + (
        "; from its first call on, the rows are not judged: rounding at that precision (about 4e-3 relative for bfloat16) "
        "is larger than the differences this check looks for; set that dtype to float32 (or leave it unset) to check them"
    )


def _hint(h: f.Hint, sides) -> str:
    if h.kind == "holds":
        return f"'{h.path}' {h.how}, and the difference enters at '{h.row or '(the model)'}', which holds it (weights above)"
    if h.kind == "enters":
        return f"the difference enters between '{h.before}' (last agreeing output) and '{h.row}'" + (
            f": look at the code of '{h.path}' that runs between those calls" if h.path else ""
        )
    if h.kind == "unmatched":
        settings = ", ".join(f"{key}={value!r}" for key, value in h.settings)
        why = next((text for (kind, _), text in WHY.items() if kind == h.module_kind), "")
        return (
            f"'{h.path}' ({h.module_kind}{': ' + settings if settings else ''}) ran in {sides[0]} "
            f"just before '{h.row}' and has no counterpart in {sides[1]}" + (f"; {why}" if why else "")
        )
    if h.kind == "rounding":
        return (
            f"the difference at '{h.row}' is the size of float32 rounding ({h.ratio:.1e} relative, float64 asked for): "
            "one side may compute in float32 there without saying so (a cast in its code, a float32 constant or buffer)"
        )
    if h.kind == "grows":
        return (
            f"the difference grows {h.ratio:.0f}x at '{h.row}' over the largest of the outputs it is computed from ('{h.before}'): "
            f"a second cause may sit in '{h.row}' or in the code that feeds it"
        )
    return "read with the switches of the probes that close a gap (below) in place:"


def switch_text(s: f.Switch, sides) -> str:
    if s.kind == "precision":
        return "matmul precision 'highest' (TF32 off) in both"
    if s.kind == "transpose":
        return f"the kernel of '{s.path}' transposed in {sides[1]}"
    if s.kind in ("eps", "padding"):
        return f"the {s.kind} of '{s.path}' set to {sides[0]}'s {s.value!r} (was {s.was!r})"
    if s.kind == "load":
        return ", ".join(f"'{name}'" for name in s.names) + f" given the reference's values in {sides[1]}"
    return f"'{s.path}' (GELU, no counterpart in {sides[1]}) switched to approximate={s.value!r} in {sides[0]}"


def _probe(p: f.Probe, sides) -> str:
    what = switch_text(p.switch, sides)
    if p.outcome == "error":
        return f"probe: {what}: could not run ({p.error})"
    if p.outcome == "open":
        return f"probe: {what}: does not close the gap ('{p.row}' still {_gap(p.after)})"
    after = "every output then agrees" if p.moves_to is None else f"the first failure moves to '{p.moves_to}'"
    return f"probe: {what}: closes the gap at '{p.row}' ({_gap(p.before)} -> {_gap(p.after)}); {after}"


def _gap(value: float | None) -> str:
    """A row's max abs difference as a probe says it: '3.12e-01', 'NaN' (a NaN in an output), 'no output' (None)."""
    if value is None:
        return "no output"
    return "NaN" if value != value else "not comparable (shapes)" if value == float("inf") else f"{value:.2e}"


FAMILIES = {
    "adam": "keeps two moments (exp_avg, exp_avg_sq: optax.ScaleByAdamState)",
    "momentum": "keeps a momentum buffer (optax.TraceState)",
    "plain": "keeps no moment the lint knows (plain SGD, or a state of another kind)",
}
_SHIFT = (
    ": optax evaluates a schedule at the count of earlier updates (0 at the first step), a torch "
    "scheduler gives step 1 its initial rate and moves after each optimizer.step()"
)
# the Adam rules whose absence in optax scales its apparent learning rate by a known factor of torch's
ADAM_FACTORS = {
    "neither": "bias correction: optax corrects neither moment (torch divides m by 1 - b1^t and v by 1 - b2^t)",
    "first": "bias correction: optax does not correct the first moment (torch divides m by 1 - b1^t)",
    "second": "bias correction: optax does not correct the second moment (torch divides v by 1 - b2^t)",
    "nesterov": "nesterov: optax's Adam uses Nesterov momentum (optax.nadam, adam(nesterov=True)); torch's Adam does not",
}


def _clipping(d: f.OptimizerDifference) -> str:
    torch = (
        f"torch clips the gradients' global norm to {d.torch:.4g} (the factory's clip)" if d.torch else "torch does not clip (no clip in the factory)"
    )
    optax = f"optax clips it to {d.optax:.4g} (optax.clip_by_global_norm in the chain)" if d.optax else "optax does not clip"
    return f"gradient clipping: {torch}; {optax}"


OPTIMIZER = {
    "family": lambda d: f"update rule: torch {d.cls} {FAMILIES[d.torch]}; the optax transformation {FAMILIES[d.optax]}",
    "momentum": lambda d: f"momentum: torch momentum={d.torch:.6g}, optax {d.optax:.6g} (optax.sgd's momentum, optax.trace's decay)",
    "dampening": lambda d: (
        f"dampening: torch dampening={d.torch:.6g} scales every gradient after the first by {1 - d.torch:.6g} in the momentum buffer; "
        + ("optax's trace has no dampening (trace = g + momentum * trace)" if abs(d.optax) < 1e-6 else f"optax {d.optax:.6g}")
    ),
    "nesterov": lambda d: f"nesterov: torch nesterov={d.torch}, optax nesterov={d.optax}",
    "clip": _clipping,
    "b1": lambda d: f"b1: torch betas[0]={d.torch:.6g}, optax b1={d.optax:.6g}",
    "b2": lambda d: f"b2: torch betas[1]={d.torch:.6g}, optax b2={d.optax:.6g}",
    "eps_root": lambda d: (
        f"eps: torch adds eps={d.torch:.3g} outside the square root; optax adds eps_root={d.optax:.3g} inside it, "
        + (f"and eps={d.extra:.3g} outside" if d.extra else "and eps=0 outside")
    ),
    "eps": lambda d: f"eps: torch eps={d.torch:.3g}, optax eps={d.optax:.3g} (both outside the square root)",
    "amsgrad": lambda d: (
        "amsgrad: the maximum of the second moment is kept in " + ("torch (amsgrad=True)" if d.torch else "optax (optax.amsgrad)") + " only"
    ),
    "l2 against decoupled": lambda d: (
        f"weight decay: torch {d.cls}(weight_decay={d.torch:.3g}) adds {d.torch:.3g} * p to the gradient (L2: it goes through the moments); "
        f"optax decays the weights directly (decoupled, weight_decay={d.optax:.3g}, as optax.adamw does): "
        "optax.chain(optax.add_decayed_weights(w), optax.adam(...)) is torch's rule, torch.optim.AdamW is optax's"
    ),
    "decoupled against l2": lambda d: (
        f"weight decay: torch {d.cls} decays the weights directly (decoupled, weight_decay={d.torch:.3g}); "
        f"optax adds {d.optax:.3g} * p to the gradient before its moments (L2: optax.add_decayed_weights before the moments, not after)"
    ),
    "adamw default": lambda d: (
        f"weight decay: optax.adamw's default weight_decay is {d.optax:g}, torch AdamW's {d.extra:g}; "
        f"torch decays by {d.torch:.3g} here: give optax.adamw weight_decay={d.torch:.3g}"
    ),
    "decoupled": lambda d: f"decoupled weight decay: torch {d.torch:.3g}, optax {d.optax:.3g}",
    "l2": lambda d: f"weight decay added to the gradient (L2): torch {d.torch:.3g}, optax {d.optax:.3g}",
    "maximize": lambda d: "maximize: torch maximizes (maximize=True), optax minimizes: negate the loss or optax's learning rate",
    "maximize only": lambda d: "maximize: torch maximizes (maximize=True), optax minimizes: negate the loss, or optax's learning rate",
    "ahead": lambda d: "learning-rate schedule one step ahead in optax: its step t has torch's step t+1 rate" + _rates(d) + _SHIFT,
    "behind": lambda d: "learning-rate schedule one step behind in optax: its step t+1 has torch's step t rate" + _rates(d) + _SHIFT,
    "adam factor": lambda d: ADAM_FACTORS[d.torch] + _rates(d),
    "factor": lambda d: f"learning rate: optax's is {d.optax:.6g} x torch's at every step" + _rates(d),
    "rate": lambda d: f"learning rate differs from step {d.extra}: torch {d.torch:.4g}, optax {d.optax:.4g}" + _rates(d),
}


def _rates(d: f.OptimizerDifference) -> str:
    torch, optax = (" ".join(f"{x:.4g}" for x in rates) for rates in d.rates)
    return f" (torch from step 1: {torch} ...; optax: {optax} ...)"


def _setting(s: f.OptimizerSetting, sides) -> str:
    if s.kind == "torch":
        group = f" (param group {s.group})" if s.group is not None else ""
        return f"torch {s.name}{group}: " + " ".join(f"{key}={value!r}" for key, value in s.value)
    if s.kind == "clip":
        return f"torch gradient clipping: global norm {s.value:g} (clip)"
    if s.kind == "scheduler":
        return f"torch scheduler: {s.value}, stepped after optimizer.step()"
    return f"optax (probed, as {s.name} sees it): {_inferred(s.value)}"


def _inferred(o: f.Inferred) -> str:
    rates = sorted(set(f"{r:.4g}" for r in o.lr))
    parts = [{"adam": "Adam", "momentum": "SGD with momentum", "plain": "SGD"}[o.family]]
    parts.append(f"lr={o.lr[0]:.4g}" if len(rates) == 1 else f"lr from {o.lr[0]:.4g} to {o.lr[-1]:.4g} over {len(o.lr)} steps")
    if o.family == "adam":
        parts += [f"b1={o.b1:.4g}", f"b2={o.b2:.4g}", f"eps={o.eps:.3g}", f"eps_root={o.eps_root:.3g}", f"amsgrad={o.amsgrad}"]
    if o.family == "momentum":
        dampening = "dampening=0" if abs(o.dampening) < 1e-6 else f"dampening={o.dampening:.4g}"
        parts += [f"momentum={o.momentum:.4g}", dampening, f"nesterov={o.nesterov}"]
    parts += [f"decoupled weight decay={o.decoupled:.3g}", f"L2 weight decay={o.l2:.3g}"]
    return " ".join(parts) + (f" clip={o.clip:.4g}" if o.clip else "")


OPTIMIZER_NOTES = {
    "unread": "torch {} is not one the lint reads (SGD, Adam, AdamW): the optimizers are compared by trajectory only",
    "skipped": "optimizer probes skipped: the optimizers are compared by trajectory only",
    "maximize": "torch maximizes: the lint reads no further settings, the trajectories compare them",
}

RENDERERS: dict[type, Callable[[Any, tuple[str, str]], str]] = {
    f.LintDifference: _lint,
    f.Untied: lambda u, sides: (
        f"{u.path}: tied to {u.tied_to} in {sides[0]}, a parameter of its own in {sides[1]} "
        "(untied: equal once copied, they part as soon as either is trained; --grads shows it)"
    ),
    f.Unheld: lambda u, sides: f"{u.path}: {sides[1]} has no room for {u.what} ({u.why}): copied it is lost, and its gradient is 0 there",
    f.Summed: lambda s, sides: (
        f"{', '.join(s.parameters)}: held as one array in {sides[1]} ({s.port}): equal in the forward pass and its gradients, "
        f"but {sides[0]}'s optimizer moves each by its own update, so the trainings part there"
    ),
    f.Note: lambda n, sides: NOTES[n.kind](n, sides),
    f.Precision: _precision,
    f.Hint: _hint,
    f.Probe: _probe,
    f.OptimizerDifference: lambda d, sides: OPTIMIZER[d.setting](d) + (f" (on {', '.join(d.on)})" if d.on else ""),
    f.OptimizerSetting: _setting,
    f.OptimizerNote: lambda n, sides: OPTIMIZER_NOTES[n.kind].format(n.cls),
    f.OneSided: lambda o, sides: f"{o.moment} (optax {MOMENTS[o.moment]}): kept in {o.side} only, not compared",
}
