"""`mhsa compare A.json B.json [B2.json ...]`: how far apart two training runs' losses are, step
by step, and whether they agree within the trajectory tolerance of docs/DESIGN.md
(shared.tolerances): exit 0 when they do, 1 when they do not, naming the first step beyond it.
Several B files are the parts of one run handed between backends (--save, then --resume),
joined in step order."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mhsa.exit_status import DIFFERENT, OK, TROUBLE
from shared import checks
from shared.history import History
from shared.tolerances import tolerance
from shared.words import plural


@dataclass
class Comparison:
    steps: np.ndarray  # the steps both runs recorded
    a: np.ndarray  # run A's loss at those steps
    b: np.ndarray
    gaps: np.ndarray  # |a - b| per step

    @property
    def worst_step(self) -> int:
        return int(self.steps[np.argmax(self.gaps)])

    def beyond(self, tol: float) -> np.ndarray:
        """The indices of the steps whose gap exceeds `tol` (a NaN on one side only counts as inf)."""
        return np.flatnonzero(~(self.gaps <= tol))


def every_step(count: int) -> str:
    """ "every one of the 5 steps", or "the 1 step"."""
    return "the 1 step" if count == 1 else f"every one of the {count} steps"


def trajectory_tolerance(first: History, second: History) -> tuple[float, str]:
    """docs/DESIGN.md's trajectory tolerance for two runs, and the dtype it is for: the looser of
    their dtypes' (a float32 run against a float64 one is held to float32's)."""
    return max((tolerance("trajectory", run.train_config.dtype), run.train_config.dtype) for run in (first, second))


def verdict(result: Comparison, tol: float, dtype: str) -> tuple[bool, str]:
    """(agree, the line that says so): within `tol` at every step compared, or the first step beyond it."""
    where = f"the trajectory tolerance {tol:.0e} ({dtype}, docs/DESIGN.md)"
    beyond = result.beyond(tol)
    if beyond.size == 0:
        return True, f"agree: within {where} at {every_step(result.steps.size)} compared"
    first = beyond[0]
    return False, (
        f"differ: beyond {where} first at step {result.steps[first]}: |A - B| = {result.gaps[first]:.3e} "
        f"(A {result.a[first]:.6g}, B {result.b[first]:.6g}); {beyond.size} of {plural(result.steps.size, 'step')} beyond it"
    )


def compare(first: History, second: History) -> Comparison:
    """Align two histories on the steps both recorded (a resumed run starts at first_step)."""
    steps_a = np.arange(first.first_step, first.first_step + len(first.losses))
    steps_b = np.arange(second.first_step, second.first_step + len(second.losses))
    steps = np.intersect1d(steps_a, steps_b)
    if steps.size == 0:
        raise ValueError(f"the runs share no step: A covers steps {steps_a[0]}..{steps_a[-1]}, B {steps_b[0]}..{steps_b[-1]}")
    a = np.asarray(first.losses)[steps - first.first_step]
    b = np.asarray(second.losses)[steps - second.first_step]
    with np.errstate(invalid="ignore"):
        gaps = np.where(a == b, 0.0, np.abs(a - b))
    return Comparison(steps, a, b, np.nan_to_num(gaps, nan=np.inf))


def join(parts: list[History]) -> History:
    """One history from the pieces of a run handed between backends (--save, then --resume)."""
    parts = sorted(parts, key=lambda part: part.first_step)
    for before, after in zip(parts, parts[1:]):
        if before.first_step + len(before.losses) != after.first_step:
            raise ValueError(
                f"cannot join: one part ends at step {before.first_step + len(before.losses) - 1}, the next starts at step {after.first_step}"
            )
    joined = parts[0]
    if len(parts) == 1:
        return joined
    return History(
        "+".join(part.backend for part in parts),
        joined.model_config,
        parts[-1].train_config,
        [loss for part in parts for loss in part.losses],
        [loss for part in parts for loss in part.epoch_losses],
        sum(part.seconds for part in parts),
        first_step=joined.first_step,
        init=joined.init,
        source=joined.source,
        source_sha256=joined.source_sha256,
    )


def describe(history: History, path) -> str:
    m, t = history.model_config, history.train_config
    return (
        f"{path}: {history.backend}, {t.dtype}, H={m.n_heads} D={m.d_model} T={m.max_len} V={m.vocab_size}, "
        f"seed {t.seed}, lr {t.lr:g}, steps {history.first_step}..{history.first_step + len(history.losses) - 1}, "
        f"final loss {history.final_loss:.6g}"
    )


def differences(first: History, second: History) -> list[str]:
    """Every config field and every start that differs between two runs, one line each; the
    dtype may differ on purpose (float32 against float64) and is named like any other."""
    lines = []
    for section in ("model_config", "train_config"):
        a, b = getattr(first, section).to_dict(), getattr(second, section).to_dict()
        changed = [f"{name} {a[name]!r} vs {b[name]!r}" for name in a if a[name] != b.get(name)]
        if changed:
            lines.append(f"{section} differs: {', '.join(changed)}; the losses are not expected to match")
    starts = [(first.init, first.source_sha256), (second.init, second.source_sha256)]
    if starts[0] != starts[1] or "native" in (first.init, second.init) or "unknown" in (first.init, second.init):
        lines.append(
            f"the runs' initial weights differ or are unknown (A: {_start(first)}, B: {_start(second)}): "
            f"their gap measures the init as much as the ports; it is not a parity check"
        )
    return lines


def _start(history: History) -> str:
    if history.init == "file":
        return f"file {history.source} sha256 {(history.source_sha256 or '?')[:12]}"
    return history.init


def comparison_figure(result: Comparison, labels: tuple[str, str], bound: tuple[float, str] | None = None):
    """Both loss curves (log axis) above their per-step absolute difference (log axis).
    labels name the runs (file, backend, dtype); runs identical at every step get a note
    instead of an empty difference panel. bound: (the bound the gap is held to, its dtype),
    trajectory_tolerance's, drawn as a dashed line across the difference panel."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 6), dpi=100, layout="constrained")
    curves, gaps = figure.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    curves.plot(result.steps, result.a, label=labels[0], linewidth=1.6)
    curves.plot(result.steps, result.b, label=labels[1], linewidth=1.0, linestyle="--")
    curves.set_yscale("log")
    curves.set_ylabel("loss (cross-entropy)")
    curves.legend()
    curves.grid(alpha=0.3)
    gaps.set_xlabel("step")
    if not (result.gaps > 0).any():  # nothing to draw on a log axis: say so instead
        gaps.set_yticks([])
        gaps.text(
            0.5,
            0.5,
            f"A and B are identical at {every_step(result.steps.size)} compared",
            transform=gaps.transAxes,
            ha="center",
            va="center",
        )
        gaps.set_title("|A - B| = 0" + (f" (trajectory tolerance {bound[0]:.0e}, {bound[1]})" if bound else ""), fontsize=10)
    else:
        shown = np.where(result.gaps > 0, result.gaps, np.nan)  # exact agreement has no place on a log axis
        gaps.plot(result.steps, shown, color="tab:red", linewidth=1.0)
        gaps.set_yscale("log")
        if bound is not None:  # the line the verdict holds every step's gap under
            gaps.axhline(bound[0], color="black", linestyle="--", linewidth=1.0, label=f"trajectory tolerance {bound[0]:.0e} ({bound[1]})")
            gaps.legend(loc="best", fontsize=9)
        gaps.set_ylabel("|A - B|")
        gaps.grid(alpha=0.3)
        exact = int((result.gaps == 0).sum())
        gaps.set_title(
            f"max {result.gaps.max():.2e} at step {result.worst_step}, mean {result.gaps.mean():.2e}"
            + (f"; {plural(exact, 'step')} identical (not drawn)" if exact else ""),
            fontsize=10,
        )
    figure.suptitle(f"loss per step: {labels[0]} vs {labels[1]}")
    return figure


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mhsa.flags import png_path

    parser.add_argument("a", metavar="A.json", type=Path, help="a --history file: the run compared against")
    parser.add_argument(
        "b",
        metavar="B.json",
        type=Path,
        nargs="+",
        help="one or more --history files (two or more files in all): several are joined in step order, "
        "the parts of one run handed between backends with --save and --resume",
    )
    parser.add_argument("--plot", metavar="FILE.png", type=png_path, help="draw both curves and their difference")


def run(args) -> int:
    import sys

    try:
        checks.check_outputs({"A.json": args.a, **{f"B.json #{n + 1}": path for n, path in enumerate(args.b)}}, {"--plot": args.plot})
        first, second = History.load(args.a), join([History.load(path) for path in args.b])
        result = compare(first, second)
    except (ValueError, FileNotFoundError) as error:
        print(f"mhsa compare: error: {error}", file=sys.stderr)
        return TROUBLE
    print(f"A  {describe(first, args.a)}")
    print(f"B  {describe(second, ' + '.join(str(path) for path in args.b))}")
    for line in differences(first, second):
        print(f"note: {line}")
    print(f"compared {plural(result.steps.size, 'common step')} ({result.steps[0]}..{result.steps[-1]})")
    print(
        f"max |A - B|  {result.gaps.max():.3e} at step {result.worst_step} "
        f"(A {result.a[np.argmax(result.gaps)]:.6g}, B {result.b[np.argmax(result.gaps)]:.6g})"
    )
    print(f"mean |A - B| {result.gaps.mean():.3e}")
    agree, line = verdict(result, *trajectory_tolerance(first, second))
    print(line)
    if args.plot is not None:
        from mhsa.plots import save_figure

        names = (args.a.name, " + ".join(path.name for path in args.b))
        label_a, label_b = (f"{key} = {name} ({run.backend}, {run.train_config.dtype})" for key, name, run in zip("AB", names, (first, second)))
        save_figure(comparison_figure(result, (label_a, label_b), trajectory_tolerance(first, second)), args.plot)
        print(f"saved plot to {args.plot}")
    return OK if agree else DIFFERENT
