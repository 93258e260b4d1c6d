"""The optimizer lint of the port check through training: read torch's settings, infer optax's by
probing, and name every difference in the user's terms.

Both optimizers run on the same probes (train_torch.probe, the port's trainer's probe): every
element of every parameter set to p0 and every gradient element at step t to g_t, on the model's own
parameters (so param groups, masks and labels apply per parameter). One inference reads each side's
settings per parameter from what it does, its updates and its moments:

    probe        p0   gradients                exposes
    constant     0    G every step             b1, b2 (moment ratios), the learning rate of every step
    varying      0    G x (1, -0.5, 2, ...)    momentum against dampening, nesterov
    zero         1    0                        weight decay: L2 (in the moments) or decoupled (in the update)
    tiny a, b    0    1e4 eps, eps             eps outside the square root against eps_root inside it
    large        0    1000                     gradient clipping and its max norm

The learning rates of the two sides are compared step by step: equal, one step apart (a schedule off
by one), a constant factor, or the factor of a missing bias correction or of Nesterov momentum.
Torch's optimizers other than SGD, Adam and AdamW are not read: the trainings are then compared by
trajectory only, and the lint says so.
"""

from __future__ import annotations

import math
from dataclasses import replace

from mhsa.port_check.core.findings import Inferred, OptimizerDifference, OptimizerNote, OptimizerSetting
from mhsa.port_check.core.records import map_name
from mhsa.port_check.readers import trainer_of
from mhsa.port_check.readers.torch import training as train_torch

G, LARGE = 0.5, 1000.0
VARYING = (1.0, -0.5, 2.0, 0.25, -1.0, 1.5)
RTOL = 1e-4  # optax computes Adam's bias correction in float32: its updates are 7e-6 off torch's
OPTAX_ADAMW_DECAY, TORCH_ADAMW_DECAY = 1e-4, 1e-2  # the two libraries' defaults


def scenarios(steps: int, tiny: float) -> list[tuple[float, list[float]]]:
    n = min(max(steps, len(VARYING)), 100)
    return [(0.0, [G] * n), (0.0, [G * c for c in VARYING]), (1.0, [0.0] * 3), (0.0, [1e4 * tiny]), (0.0, [tiny]), (0.0, [LARGE])]


def infer(runs: list[list[dict]], name: str, size: int, tiny: float) -> Inferred:
    """What the probes' runs (scenarios(...)'s order) say about the optimizer of parameter
    `name`; size: the number of elements of all parameters (the clip's norm is over all)."""
    moments = runs[0][0]["moment"]
    if ("exp_avg", name) in moments and ("exp_avg_sq", name) in moments:
        found = _adam(runs, name)
    elif ("momentum_buffer", name) in moments:
        found = _momentum(runs, name)
    else:
        found = _plain(runs, name)
    found.clip = _clip(found, runs, name, size, tiny)
    return found


def _get(run, t, kind, name) -> float:
    return run[t][kind][name]


def _ratio(a: float, b: float) -> float:
    return a / b if b != 0 else float("nan")


def _adam(runs, name) -> Inferred:
    const, _, zero, tiny_a, tiny_b, _ = runs
    m = [_get(run, 0, "moment", ("exp_avg", name)) for run in (const, zero)] + [_get(const, 1, "moment", ("exp_avg", name))]
    v = [_get(const, t, "moment", ("exp_avg_sq", name)) for t in range(2)]
    found = Inferred("adam", amsgrad=("max_exp_avg_sq", name) in const[0]["moment"])
    # m_1 = (1 - b1) g, m_2 = b1 m_1 + (1 - b1)(g + l2 p_1) and the zero probe's m = (1 - b1) l2
    # (L2 decay of p0 = 1) give b1 in closed form; then v_2 = b2 v_1 + (1 - b2) g_2**2 gives b2
    found.b1 = _ratio(m[2] - m[0] - m[1] * _get(const, 0, "param", name), m[0])
    found.l2 = m[1] / (1 - found.b1)
    g2 = (m[0] + m[1] * _get(const, 0, "param", name)) / (1 - found.b1)
    found.b2 = _ratio(v[1] - g2**2, v[0] - g2**2)

    def gradient(run):  # the gradient the moments saw at step 1 (clipped, L2 added)
        return _get(run, 0, "moment", ("exp_avg", name)) / (1 - found.b1)

    # the tiny probes at step 1 (bias-corrected): -update / lr = g / (sqrt(g**2 + eps_root) + eps)
    lr1 = -_get(const, 0, "update", name)
    q = [gradient(run) / _ratio(-_get(run, 0, "update", name), lr1) for run in (tiny_a, tiny_b)]
    found.eps, found.eps_root = _eps(q, [gradient(run) for run in (tiny_a, tiny_b)])

    def direction(run, t):  # m_hat / (sqrt(v_hat + eps_root) + eps), from the moments
        m_hat = _get(run, t, "moment", ("exp_avg", name)) / (1 - found.b1 ** (t + 1))
        v_hat = _get(run, t, "moment", ("exp_avg_sq", name)) / (1 - found.b2 ** (t + 1))
        denominator = math.sqrt(max(v_hat + found.eps_root, 0.0)) + found.eps
        return m_hat / denominator if denominator > 0 else 0.0

    return _decays_and_rates(found, const, zero, name, direction)


def _eps(q: list[float], g: list[float]) -> tuple[float, float]:
    """(eps, eps_root) from q = sqrt(g**2 + eps_root) + eps at a gradient g_a = 1e4 g_b and at
    g_b: the rule, eps alone or eps_root alone, that from g_b's q best predicts g_a's."""
    outside, inside = q[1] - g[1], q[1] ** 2 - g[1] ** 2
    miss_outside = abs(g[0] + outside - q[0])
    miss_inside = abs(math.sqrt(max(g[0] ** 2 + inside, 0.0)) - q[0])
    return (max(outside, 0.0), 0.0) if miss_outside <= miss_inside else (0.0, max(inside, 0.0))


def _decays_and_rates(found: Inferred, const, zero, name, direction) -> Inferred:
    """The decoupled decay (the zero probe's update beyond its direction) and the learning rate
    of each step: update_t = -lr_t (direction_t + decoupled p_(t-1))."""
    rate1 = -_get(const, 0, "update", name) / direction(const, 0)
    found.decoupled = _ratio(-_get(zero, 0, "update", name), rate1) - direction(zero, 0)
    before = 0.0
    for t in range(len(const)):
        found.lr.append(_ratio(-_get(const, t, "update", name), direction(const, t) + found.decoupled * before))
        before = _get(const, t, "param", name)
    return found


def _momentum(runs, name) -> Inferred:
    const, varying, zero, _, _, _ = runs
    trace = [[_get(run, t, "moment", ("momentum_buffer", name)) for t in range(2)] for run in (const, varying)]
    found = Inferred("momentum", l2=_get(zero, 0, "moment", ("momentum_buffer", name)))
    # each probe's second gradient: clipped as the first was (the first trace is that gradient),
    # plus the L2 decay of the first update
    scale = trace[0][0] / G
    second = [trace[0][0], -0.5 * G * min(1.0, 2 * scale)]
    second = [g + found.l2 * _get(run, 0, "param", name) for g, run in zip(second, (const, varying))]
    # trace_2 = momentum trace_1 + (1 - dampening) g_2 in both probes: two equations, two unknowns
    det = trace[0][0] * second[1] - second[0] * trace[1][0]
    found.momentum = (trace[0][1] * second[1] - second[0] * trace[1][1]) / det
    found.dampening = 1 - (trace[0][0] * trace[1][1] - trace[0][1] * trace[1][0]) / det

    def rate(run, gradient, nesterov):  # the second step's learning rate, under each hypothesis
        buffer = _get(run, 1, "moment", ("momentum_buffer", name))
        return _ratio(-_get(run, 1, "update", name), gradient + found.momentum * buffer if nesterov else buffer)

    # the right hypothesis gives both probes one learning rate
    spread = {n: abs(_ratio(rate(const, second[0], n), rate(varying, second[1], n)) - 1) for n in (False, True)}
    found.nesterov = spread[True] < spread[False]

    def direction(run, t):
        buffer = _get(run, t, "moment", ("momentum_buffer", name))
        if not found.nesterov:
            return buffer
        gradient = _get(run, 0, "moment", ("momentum_buffer", name)) if t == 0 else trace[0][0] + found.l2 * _get(run, t - 1, "param", name)
        return gradient + found.momentum * buffer

    return _decays_and_rates(found, const, zero, name, direction)


def _plain(runs, name) -> Inferred:
    const, _, zero, _, _, _ = runs
    found = _decays_and_rates(Inferred("plain"), const, zero, name, lambda run, t: G if run is const else 0.0)
    found.l2, found.decoupled = found.decoupled, 0.0  # plain SGD: L2 and decoupled decay are one rule
    return found


def _clip(found: Inferred, runs, name, size, tiny) -> float | None:
    """The max global norm, from the large probe's first gradient against the unclipped one."""
    large = runs[5]
    if found.family == "adam":
        factor = _get(large, 0, "moment", ("exp_avg", name)) / (1 - found.b1) / LARGE
    elif found.family == "momentum":
        factor = _get(large, 0, "moment", ("momentum_buffer", name)) / LARGE
    else:
        factor = _ratio(_get(large, 0, "update", name) / LARGE, _get(runs[4], 0, "update", name) / tiny)
    return factor * LARGE * math.sqrt(size) if factor < 1 - 1e-3 else None


def _differ(a: float, b: float, rtol: float = RTOL, atol: float = 0.0) -> bool:
    return not abs(a - b) <= atol + rtol * max(abs(a), abs(b))


def _g(x: float | None, digits: int) -> float | None:
    """x rounded to the significant digits the finding shows: findings read alike are equal."""
    return None if x is None else float(f"{x:.{digits}g}")


def _found(setting: str, t: float | None, o: float | None, digits: int, **more) -> OptimizerDifference:
    return OptimizerDifference(setting, _g(t, digits), _g(o, digits), **more)


def differences(t: Inferred, o: Inferred, cls: str) -> list[OptimizerDifference]:
    """Each setting in which optax's optimizer `o` differs from torch's `t` (class `cls`)."""
    if t.family != o.family:
        return [OptimizerDifference("family", t.family, o.family, cls)]
    found = []
    rates = _rate_difference(t, o)
    if t.family == "adam":
        # without the second moment's correction, eps meets sqrt(v) where torch's meets sqrt(v / (1 - b2)):
        # the probes read it 1 / sqrt(1 - b2) times larger at step 1, where they read eps
        uncorrected = rates is not None and rates.setting == "adam factor" and rates.torch in ("neither", "second")
        found += _adam_differences(t, o, math.sqrt(1 - o.b2) if uncorrected else 1.0)
    if t.family == "momentum":
        if _differ(t.momentum, o.momentum):
            found.append(_found("momentum", t.momentum, o.momentum, 6))
        if _differ(t.dampening, o.dampening, atol=1e-6):
            found.append(_found("dampening", t.dampening, 0.0 if abs(o.dampening) < 1e-6 else o.dampening, 6, extra=_g(1 - t.dampening, 6)))
        if t.nesterov != o.nesterov:
            found.append(OptimizerDifference("nesterov", t.nesterov, o.nesterov))
    found += _decay_differences(t, o, cls)
    if (t.clip is None) != (o.clip is None) or (t.clip is not None and o.clip is not None and _differ(t.clip, o.clip, 1e-3)):
        found.append(_found("clip", t.clip or None, o.clip or None, 4))
    return found + ([rates] if rates else [])


def _adam_differences(t: Inferred, o: Inferred, eps_scale: float) -> list[OptimizerDifference]:
    found = [_found(name, getattr(t, name), getattr(o, name), 6) for name in ("b1", "b2") if _differ(getattr(t, name), getattr(o, name))]
    if o.eps_root and not t.eps_root:
        found.append(_found("eps_root", t.eps, o.eps_root, 3, extra=_g(o.eps, 3)))
    elif _differ(t.eps, o.eps * eps_scale, 1e-2, atol=1e-3 * max(t.eps, o.eps * eps_scale, 1e-12)):
        found.append(_found("eps", t.eps, o.eps, 3))
    if t.amsgrad != o.amsgrad:
        found.append(OptimizerDifference("amsgrad", t.amsgrad, o.amsgrad))
    return found


def _decay_differences(t: Inferred, o: Inferred, cls: str) -> list[OptimizerDifference]:
    """Weight decay, in the user's terms: the classic defaults and L2 against decoupled. A decay
    under 1e-6 counts as none: in float32 the decoupled part is read beside an L2 direction of
    about 1, to some 1e-7."""
    atol = 1e-6
    t_l2, o_l2 = abs(t.l2) > atol, abs(o.l2) > atol
    t_dec, o_dec = abs(t.decoupled) > atol, abs(o.decoupled) > atol
    if t_l2 and o_dec and not o_l2 and not t_dec:
        return [_found("l2 against decoupled", t.l2, o.decoupled, 3, cls=cls)]
    if t_dec and o_l2 and not o_dec and not t_l2:
        return [_found("decoupled against l2", t.decoupled, o.l2, 3, cls=cls)]
    found = []
    if (t_dec or o_dec) and _differ(t.decoupled, o.decoupled, 1e-3, atol):
        if abs(o.decoupled - OPTAX_ADAMW_DECAY) < 1e-3 * OPTAX_ADAMW_DECAY and t_dec:
            found.append(OptimizerDifference("adamw default", _g(t.decoupled, 3), OPTAX_ADAMW_DECAY, extra=TORCH_ADAMW_DECAY))
        else:
            found.append(_found("decoupled", t.decoupled, o.decoupled, 3))
    if (t_l2 or o_l2) and _differ(t.l2, o.l2, 1e-3, atol):
        found.append(_found("l2", t.l2, o.l2, 3))
    return found


def _rate_difference(t: Inferred, o: Inferred) -> OptimizerDifference | None:
    """The learning rates step by step, explained where a classic explains them."""
    a, b = t.lr, o.lr[: len(t.lr)]
    if not any(_differ(x, y) for x, y in zip(a, b)):
        return None
    if a[0] < 0 < b[0]:
        return OptimizerDifference("maximize")
    rates = tuple(tuple(_g(x, 4) for x in side[:4]) for side in (a, b))
    if len(a) > 2 and not any(_differ(y, x) for y, x in zip(b, a[1:])):
        return OptimizerDifference("ahead", rates=rates)
    if len(a) > 2 and not any(_differ(y, x) for y, x in zip(b[1:], a)):
        return OptimizerDifference("behind", rates=rates)
    ratios = [_ratio(y, x) for x, y in zip(a, b)]
    if t.family == "adam":
        for what, factor in _adam_factors(o).items():
            if not any(_differ(r, f, 1e-3) for r, f in zip(ratios, factor)):
                return OptimizerDifference("adam factor", what, rates=rates)
    if not any(_differ(r, ratios[0]) for r in ratios):
        return OptimizerDifference("factor", optax=_g(ratios[0], 6), rates=rates)
    first = next(i for i, (x, y) in enumerate(zip(a, b)) if _differ(x, y))
    return _found("rate", a[first], b[first], 4, extra=first + 1, rates=rates)


def _adam_factors(o: Inferred) -> dict[str, list[float]]:
    """Optax's apparent learning rate over torch's where its Adam differs in one rule (report/findings.py's ADAM_FACTORS)."""
    b1, b2, n = o.b1, o.b2, len(o.lr)
    steps = range(1, n + 1)
    return {
        "neither": [(1 - b1**t) / math.sqrt(1 - b2**t) for t in steps],
        "first": [1 - b1**t for t in steps],
        "second": [1 / math.sqrt(1 - b2**t) for t in steps],
        "nesterov": [b1 * (1 - b1**t) / (1 - b1 ** (t + 1)) + (1 - b1) / (1 - b1**t) for t in steps],
    }


def optimizer_lint(
    reference: dict, port: dict, port_model, steps: int, name_map=None, probes: bool = True
) -> tuple[list[OptimizerDifference], list[OptimizerNote], list[OptimizerSetting]]:
    """(differences, notes, settings) for the two factories' optimizers."""
    cls, read_as, groups = train_torch.settings(reference["optimizer"])
    settings = [OptimizerSetting("torch", tuple(group.items()), cls, i if len(groups) > 1 else None) for i, group in enumerate(groups)]
    if reference.get("clip") is not None:
        settings.append(OptimizerSetting("clip", reference["clip"]))
    if reference.get("scheduler") is not None:
        settings.append(OptimizerSetting("scheduler", type(reference["scheduler"]).__name__))
    if read_as is None:
        return [], [OptimizerNote("unread", cls)], settings
    if not probes:
        return [], [OptimizerNote("skipped")], settings
    tiny = float(groups[0].get("eps") or 1e-8)
    plan = scenarios(steps, tiny)
    torch_runs, torch_size = train_torch.probe(reference, plan)
    optax_runs, optax_size = trainer_of(port["model"])[1].probe(port, port_model, plan)
    if any(group.get("maximize") for group in groups):  # torch climbs: the same as optax only with a negative learning rate
        climbs = infer(optax_runs, next(iter(optax_runs[0][0]["param"])), optax_size, tiny).lr[0] < 0
        return [] if climbs else [OptimizerDifference("maximize only")], [OptimizerNote("maximize")], settings
    found: dict[str, tuple[OptimizerDifference, list[str]]] = {}  # by the record's repr: NaN never equals itself
    names = [name for name in torch_runs[0][0]["param"] if map_name(name, name_map) in optax_runs[0][0]["param"]]
    for name in names:
        theirs = infer(optax_runs, map_name(name, name_map), optax_size, tiny)
        for difference in differences(infer(torch_runs, name, torch_size, tiny), theirs, cls):
            found.setdefault(repr(difference), (difference, []))[1].append(name)
        if name == names[0]:
            settings.append(OptimizerSetting("optax", theirs, name))
    return [difference if len(on) == len(names) else replace(difference, on=tuple(on)) for difference, on in found.values()], [], settings
