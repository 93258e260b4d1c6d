"""`mhsa parity`: load one set of weights into every registered backend and show,
stage by stage, gradient by gradient and step by step, where they agree and where they part.

The intermediates come from each implementation's real forward pass (its `trace`); the
gradients from each backend's own loss_and_grads (torch autograd, jax.grad, numpy_ref's
hand-written backward pass), the reference's also held against a fourth-order finite
difference of its loss in float64 on a sample of coordinates; the trajectories from every real
trainer. Tolerances are docs/DESIGN.md's (shared.tolerances).

Over 300 lines on purpose: the report's own sections, its tables and its command; the decode and
data-parallel sections live in decode_parity.py and dp_parity.py.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from shared.config import DTYPES, ModelConfig, TrainConfig
from shared.tolerances import max_abs_diff, stage_kind, tolerance
from shared.tools import registry
from shared.tools.lanes import Lanes
from shared.tools.threads import add_threads_argument
from shared.trace import STAGES


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


def inputs(config: ModelConfig, seed: int, batch: int = 3):
    """Random tokens and targets (batch, max_len): every id and position is exercised."""
    rng = np.random.default_rng(seed)
    shape = (batch, config.max_len)
    return rng.integers(0, config.vocab_size, shape), rng.integers(0, config.vocab_size, shape)


def padding_mask(config: ModelConfig, batch: int = 3) -> np.ndarray:
    """(B, 1, 1, T): sequence b may attend to its first T - b keys (the others are padding)."""
    keep = np.ones((batch, 1, 1, config.max_len), dtype=bool)
    for row in range(batch):
        keep[row, ..., config.max_len - row :] = False
    return keep


def stage_and_gradient_rows(config, dtype, seed, mask=None, samples=6, adapters=None) -> list[Row]:
    """One row per named stage and the loss, then one per parameter gradient.

    Gradients come from each backend's own loss_and_grads (autodiff, or numpy_ref's
    hand-written backward); the reference backend's gradient is also held against a
    fourth-order finite difference of numpy_ref's loss in float64 at `samples` coordinates
    of every parameter, an independent check that no backend's gradient can share a bug with.
    A backend without gradients is compared through the finite difference alone."""
    return stage_and_gradient_section(config, dtype, seed, mask=mask, samples=samples, adapters=adapters)()


def stage_and_gradient_section(config, dtype, seed, mask=None, samples=6, adapters=None, lanes: Lanes | None = None) -> Callable[[], list[Row]]:
    """stage_and_gradient_rows in two steps: each backend's forward and gradients, and the
    finite differences, are submitted to `lanes` (one lane per backend) now; the returned
    function waits for them and builds the rows."""
    from shared.tools.backends import ADAPTERS
    from shared.weights import init_weights

    adapters = adapters or ADAPTERS
    lanes = lanes or Lanes(inline=True)
    names = registry.names()
    reference = names[0]
    with_grads = registry.names("grads")
    arrays = init_weights(config, seed, dtype)
    tokens, targets = inputs(config, seed)
    outputs = {
        name: lanes.submit(name, _forward_and_grads, adapters[name], name in with_grads, tokens, targets, arrays, config, mask) for name in names
    }

    # the coordinates in backward order (read-out first, embeddings last), the order the
    # gradients are computed in: the first row that fails is the parameter nearest to where
    # the backward passes part
    rng = np.random.default_rng(seed)
    coords = {name: [tuple(int(rng.integers(0, size)) for size in value.shape) for _ in range(samples)] for name, value in reversed(arrays.items())}
    estimates = lanes.submit(reference, _finite_differences, arrays, coords, tokens, targets, config, mask)

    def rows() -> list[Row]:
        traces, losses, grads = {}, {}, {}
        for name, future in outputs.items():
            traces[name], loss_and_grads = future.result()
            if loss_and_grads is not None:
                losses[name], grads[name] = loss_and_grads
        return _stage_rows(traces, losses, dtype) + _gradient_rows(grads, coords, estimates.result(), reference, samples, dtype)

    return rows


def _forward_and_grads(adapter, with_grads: bool, tokens, targets, arrays, config, mask):
    """One backend's trace of every named stage (name -> array) and, if it has them, its
    (loss, gradients) from its own loss_and_grads."""
    trace: dict[str, np.ndarray] = {}
    adapter.forward(tokens, arrays, config, mask=mask, trace=trace)
    return trace, adapter.loss_and_grads(tokens, targets, arrays, config, mask=mask) if with_grads else None


def _finite_differences(arrays, coords, tokens, targets, config, mask) -> dict[str, np.ndarray]:
    """name -> (samples,): the reference loss's float64 finite difference at each coordinate."""
    from shared.tools.backends import central_difference

    arrays64 = {name: value.astype(np.float64) for name, value in arrays.items()}
    return {name: np.array([central_difference(arrays64, name, c, tokens, targets, config, mask) for c in at]) for name, at in coords.items()}


def _stage_rows(traces, losses, dtype) -> list[Row]:
    """One row per named stage, then the loss: every pair's max |a - b|."""
    rows = []
    for stage in STAGES:
        diffs: dict[str, float | None] = {pair_key(a, b): max_abs_diff(traces[a][stage], traces[b][stage]) for a, b in pairs()}
        rows.append(Row("stage", stage, diffs, tolerance(stage_kind(stage), dtype)))
    rows.append(
        Row(
            "stage",
            "loss",
            {pair_key(a, b): abs(losses[a] - losses[b]) if a in losses and b in losses else None for a, b in pairs()},
            tolerance("stage", dtype),
        )
    )
    return rows


def _gradient_rows(grads, coords, estimate, reference, samples, dtype) -> list[Row]:
    """One row per parameter in `coords`' (backward) order: every pair's max |a - b| of the
    gradients, and the reference's gradient against the finite difference at the coordinates."""
    rows = []
    for name, at in coords.items():
        diffs: dict[str, float | None] = {}
        for a, b in pairs():
            if a in grads and b in grads:
                diffs[pair_key(a, b)] = max_abs_diff(grads[a][name], grads[b][name])
            else:  # one side has no gradient of its own: both against the finite difference
                known = grads.get(a, grads.get(b))
                diffs[pair_key(a, b)] = max_abs_diff([known[name][c] for c in at], estimate[name]) if known else None
        if reference in grads:
            diffs[FD] = max_abs_diff([grads[reference][name][c] for c in at], estimate[name])
            note = f"{FD}: {reference}'s gradient against a float64 finite difference at {samples} coords per parameter"
        else:
            note = f"{reference} has no gradient of its own: the others are held against a float64 finite difference at {samples} coords"
        rows.append(Row("gradient", name, diffs, tolerance("grad", dtype), note=note))
    return rows


def lane(name: str, dp: int = 1) -> str:
    """The lane of a backend's jobs: its own, and another for its data-parallel runs."""
    return name if dp == 1 else f"{name} dp"


def trained(name: str, config: ModelConfig, train_config: TrainConfig, dp: int = 1, cache: dict | None = None, lanes: Lanes | None = None) -> Future:
    """A Future of the History of one backend's real trainer, submitted to `lanes` (run at once
    without); `cache` keeps each run for the sections that read the same one (the trajectories
    and the data-parallel dp=1 runs), so that it is trained once."""
    key = (name, config, train_config, dp)
    if cache is not None and key in cache:
        return cache[key]
    future = (lanes or Lanes(inline=True)).submit(
        lane(name, dp), registry.get(name).train.train, config, train_config, **({"dp": dp} if dp != 1 else {})
    )
    if cache is not None:
        cache[key] = future
    return future


def trajectory_rows(config, dtype, seed, epochs, cache: dict | None = None) -> list[Row]:
    """The loss at every step of every backend's trainer, from the same init and batches; in
    float64 also the final weights."""
    return trajectory_section(config, dtype, seed, epochs, cache=cache)()


def trajectory_section(config, dtype, seed, epochs, cache: dict | None = None, lanes: Lanes | None = None) -> Callable[[], list[Row]]:
    """trajectory_rows in two steps: every trainer is submitted to `lanes` now; the returned
    function waits for the runs and builds the rows."""
    train_config = TrainConfig(epochs=epochs, seed=seed, dtype=dtype)
    futures = {name: trained(name, config, train_config, cache=cache, lanes=lanes) for name in registry.names("train")}

    def rows() -> list[Row]:
        runs = {name: future.result() for name, future in futures.items()}
        final = {name: registry.get(name).model.to_exchange(run.model) for name, run in runs.items()}
        steps = len(next(iter(runs.values())).losses)

        def compare(measure) -> dict[str, float | None]:
            return {pair_key(a, b): measure(a, b) if a in runs and b in runs else None for a, b in pairs()}

        found = [
            Row(
                "trajectory",
                f"loss at each of {steps} steps",
                compare(lambda a, b: max_abs_diff(runs[a].losses, runs[b].losses)),
                tolerance("trajectory", dtype),
            )
        ]
        if dtype == "float64":
            found.append(
                Row(
                    "trajectory",
                    f"weights after {steps} steps",
                    compare(lambda a, b: max(max_abs_diff(final[a][name], final[b][name]) for name in final[a])),
                    tolerance("stage", dtype),
                )
            )
        return found

    return rows


def build_report(
    config: ModelConfig,
    dtype="float32",
    seed=0,
    mask=None,
    epochs=3,
    samples=6,
    adapters=None,
    progress=None,
    decode=True,
    dp=0,
    runs: dict | None = None,
) -> Report:
    """Every section of the report in order. progress(index, total, section), if given, is
    called as each section starts (`mhsa parity` shows it on stderr in a terminal).

    Every section's work is submitted at the start, one lane per backend (shared.tools.lanes):
    the sections are then put together in order, each as its jobs finish.
    dp >= 2 adds the data-parallel section (needs epochs > 0, and shared.tools.dp_parity.prepare(dp)
    called before JAX starts). runs: trained runs (see trained()) to reuse and add to, shared by
    the sections that need the same one, and by the caller's other reports if it passes its own."""
    runs = {} if runs is None else runs
    title = (
        f"mhsa parity · {dtype} · seed {seed} · vocab_size={config.vocab_size} d_model={config.d_model} "
        f"n_heads={config.n_heads} max_len={config.max_len} bias={config.bias} · "
        f"{'padding mask (B, 1, 1, T) and causal' if mask is not None else 'causal mask only'}"
    )
    report = Report(title)
    with Lanes() as lanes:
        sections = [
            ("stages and gradients", stage_and_gradient_section(config, dtype, seed, mask=mask, samples=samples, adapters=adapters, lanes=lanes))
        ]
        if epochs > 0:
            sections.append((f"trajectories ({epochs} epochs per trainer)", trajectory_section(config, dtype, seed, epochs, cache=runs, lanes=lanes)))
        if decode:
            from shared.tools.decode_parity import decode_section  # it builds on this module's Row

            sections.append(("decode with the KV cache", decode_section(config, dtype, seed, lanes=lanes)))
        if dp >= 2 and epochs > 0:
            from shared.tools import dp_parity  # it builds on this module's Row

            report.headers.update(dp_parity.columns(registry.names("dp"), dp))
            sections.append((f"data-parallel (dp={dp} against dp=1)", dp_parity.start(config, dtype, seed, epochs, dp, cache=runs, lanes=lanes)))
        for index, (section, rows) in enumerate(sections):
            if progress is not None:
                progress(index, len(sections), section)
            report.rows += rows()
    return report


def columns(report: Report) -> list[str]:
    """The pair columns, then the finite-difference column where some row has it."""
    keys = [pair_key(a, b) for a, b in pairs()]
    return keys + ([FD] if any(FD in row.diffs for row in report.rows) else [])


def header(key: str) -> str:
    return f"{registry.names()[0]} vs {FD}" if key == FD else key.replace("-", " vs ")


def format_report(report: Report) -> str:
    """The report as markdown: one table for the sections compared pair by pair, then one per
    section with columns of its own (data-parallel), the notes and the verdict."""
    first = report.first_failure
    main = columns(report)
    tables: list[tuple[list[str], list[Row]]] = []
    for row in report.rows:
        keys = main if set(row.diffs) <= set(main) else list(row.diffs)
        if tables and tables[-1][0] == keys:
            tables[-1][1].append(row)
        else:
            tables.append((keys, [row]))
    lines = [report.title]
    for keys, rows in tables:
        lines += [""] + _table(keys, rows, first, lambda key: report.headers.get(key) or header(key))
    lines.append("")
    notes = sorted({row.note for row in report.rows if row.note})
    lines += [f"note: {note}" for note in notes]
    if first is None:
        lines.append(f"PASS: all {len(report.rows)} comparisons within the tolerances of docs/DESIGN.md")
    else:
        pair = first.failing_pair()
        assert pair is not None  # a row that fails has a failing pair
        failures = sum(not row.passed for row in report.rows)
        lines.append(
            f"FAIL: first difference at {first.section} '{first.name}': {report.headers.get(pair) or header(pair)} "
            f"{first.diffs[pair]:.2e} > {first.tol:.0e} ({failures} of {len(report.rows)} comparisons fail)"
        )
    return "\n".join(lines)


def _table(keys: list[str], rows: list[Row], first: Row | None, header_of) -> list[str]:
    # one markdown table; a blank row between sections
    widths = [max(14, len(header_of(key))) for key in keys]
    width = max(len(_row_name(row)) for row in rows)
    head = f"| {'compared':<{width}} | " + " | ".join(f"{header_of(key):>{w}}" for key, w in zip(keys, widths)) + " | tolerance | result |"
    rule = "|" + "-" * (width + 2) + "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|----------:|--------|"
    lines = [head, rule]
    section = None
    for row in rows:
        if row.section != section and section is not None:
            lines.append(f"| {'':<{width}} | " + " | ".join(" " * w for w in widths) + " |           |        |")
        section = row.section
        cells = " | ".join(f"{_cell(row.diffs.get(key)):>{w}}" for key, w in zip(keys, widths))
        result = "PASS" if row.passed else "FAIL"
        marker = "  <- the implementations part here" if row is first else ""
        lines.append(f"| {_row_name(row):<{width}} | {cells} | {row.tol:>9.0e} | {result}   |{marker}")
    return lines


def _row_name(row: Row) -> str:
    return f"grad {row.name}" if row.section == "gradient" else row.name


def _cell(diff: float | None) -> str:
    return "—" if diff is None else f"{diff:.2e}"


def configure_accelerators() -> list[str]:
    """float32 parity on a GPU needs TF32 off: JAX uses TF32 for float32 matmuls on Ampere and
    later by default, torch's cuDNN does too. Turn both off when an accelerator is present."""
    notes = []
    import jax
    import torch

    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        notes.append("torch: CUDA present, TF32 off for matmul and cuDNN")
    if jax.default_backend() != "cpu":
        jax.config.update("jax_default_matmul_precision", "highest")
        notes.append(f"jax: {jax.default_backend()} present, default matmul precision 'highest' (no TF32/bf16 passes)")
    return notes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from shared.tools.flags import add_model_arguments, int_flag

    add_threads_argument(parser, default="one torch thread, the other libraries' own")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="float32 (default) or float64 in every backend")
    parser.add_argument("--seed", type=int_flag("--seed"), default=0, help="weights, inputs and training seed, in [0, 2**32 - 1] (default 0)")
    parser.add_argument(
        "--dp", type=int_flag("parity --dp"), default=2, help="ranks or devices of the data-parallel section, in [0, 64] (default 2; 0 skips it)"
    )
    parser.add_argument("--no-decode", action="store_true", help="skip the decode (KV cache) section")
    parser.add_argument(
        "--no-jax-cache",
        action="store_true",
        help="compile every JAX program afresh instead of keeping them in JAX's persistent compilation cache "
        "(default: on, in $XDG_CACHE_HOME/mhsa/jax or ~/.cache/mhsa/jax, unless JAX_COMPILATION_CACHE_DIR names another)",
    )
    parser.add_argument("--mask", choices=("causal", "padding"), default="causal", help="causal only (default), or also a (B, 1, 1, T) padding mask")
    parser.add_argument(
        "--epochs",
        type=int_flag("parity --epochs"),
        default=3,
        help="epochs of the default trainer for the trajectory rows, in [0, 1000] (default 3; 0 skips them)",
    )
    parser.add_argument(
        "--samples", type=int_flag("--samples"), default=6, help="finite-difference coordinates per parameter, in [1, 1000] (default 6)"
    )
    model = add_model_arguments(parser, "model config (defaults: the lesson's)")
    model.add_argument("--no-bias", action="store_true", help="linear layers without bias")
    parser.set_defaults(parser=parser)


def run(args) -> int:
    from shared import checks

    try:
        config = ModelConfig(
            vocab_size=args.vocab_size,
            d_model=args.d_model,
            n_heads=args.n_heads,
            max_len=args.seq_len,
            bias=not args.no_bias,
            attn_impl=args.attn_impl,
        )
        itemsize = 8 if args.dtype == "float64" else 4
        checks.check_training_fits(
            config.vocab_size, config.d_model, config.n_heads, config.max_len, TrainConfig.batch_size, TrainConfig.n_sequences, itemsize
        )
    except (ValueError, TypeError) as error:
        args.parser.error(str(error))
    if args.dp == 1:
        args.parser.error("--dp 1 compares a run with itself: give 2 or more, or 0 to skip the data-parallel section")
    if args.dp:
        from shared.tools import dp_parity

        dp_parity.prepare(args.dp)  # before JAX starts: it fixes its CPU device count then
    cache_note = None
    if not args.no_jax_cache:
        from shared.tools.compile_cache import enable_jax_cache

        cache_note = enable_jax_cache()  # the same programs every run: a second run reads them compiled
    if args.dtype == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)  # off by default: float64 would silently become float32
    notes = configure_accelerators()
    if args.threads is None:
        import torch

        # the report's models are tiny: torch's second thread only waits for work, and with the
        # other lanes' work on the cores it spins (benchmarks/RESULTS.md, "Busy machine"); the
        # default report prints the same numbers with one thread or two
        torch.set_num_threads(1)
    mask = padding_mask(config) if args.mask == "padding" else None
    report = build_report(
        config,
        args.dtype,
        args.seed,
        mask=mask,
        epochs=args.epochs,
        samples=args.samples,
        progress=_progress if sys.stderr.isatty() else None,
        decode=not args.no_decode,
        dp=args.dp,
    )
    print(format_report(report))
    for note in notes + ([cache_note] if cache_note else []):
        print(f"note: {note}")
    return 0 if report.passed else 1


def _progress(index: int, total: int, section: str) -> None:
    print(f"\rparity [{index + 1}/{total}] {section} ...\033[K", end="\n" if index + 1 == total else "", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m shared.tools.parity`: the same flags and report as `mhsa parity`."""
    from shared.tools.cli import run_guarded

    parser = argparse.ArgumentParser(prog="python -m shared.tools.parity", description=(__doc__ or "").split("\n\n")[0])
    add_arguments(parser)
    return run_guarded(run, parser.parse_args(argv), prefix="python -m shared.tools.parity: error")


if __name__ == "__main__":
    sys.exit(main())
