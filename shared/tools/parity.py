"""`mhsa parity`: load one set of weights into numpy_ref, torch_impl and jax_impl and show,
stage by stage, gradient by gradient and step by step, where they agree and where they part.

The intermediates come from each implementation's real forward pass (its `trace`), the
gradients from torch autograd and jax.grad, checked against a fourth-order finite difference
of numpy_ref's loss in float64 on a sample of coordinates, and the trajectories from the two
real trainers. Tolerances are DESIGN.md's (shared.tolerances).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

import numpy as np

from shared.config import DTYPES, ModelConfig, TrainConfig
from shared.tolerances import max_abs_diff, stage_kind, tolerance
from shared.trace import STAGES

PAIRS = ("torch-numpy", "jax-numpy", "torch-jax")
HEADERS = {"torch-numpy": "torch vs numpy", "jax-numpy": "jax vs numpy", "torch-jax": "torch vs jax"}


@dataclass
class Row:
    section: str  # "stage", "gradient" or "trajectory"
    name: str
    diffs: dict[str, float | None]  # pair -> max |a - b|, None where a pair does not apply
    tol: float
    note: str = ""

    @property
    def passed(self) -> bool:
        return all(diff <= self.tol for diff in self.diffs.values() if diff is not None)

    def failing_pair(self) -> str | None:
        return next((pair for pair in PAIRS if self.diffs.get(pair) is not None and not self.diffs[pair] <= self.tol), None)


@dataclass
class Report:
    title: str
    rows: list[Row] = field(default_factory=list)

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


def stage_and_gradient_rows(config, dtype, seed, mask=None, samples=6, backends=None) -> list[Row]:
    """One row per named stage and the loss, then one per parameter gradient."""
    from shared.tools.backends import BACKENDS, central_difference
    from shared.weights import init_weights

    backends = backends or BACKENDS
    arrays = init_weights(config, seed, dtype)
    tokens, targets = inputs(config, seed)
    traces = {name: {} for name in ("numpy", "torch", "jax")}
    for name, trace in traces.items():
        backends[name].forward(tokens, arrays, config, mask=mask, trace=trace)
    import numpy_ref

    losses, grads = {"numpy": float(numpy_ref.cross_entropy(traces["numpy"]["logits"], targets))}, {}
    for name in ("torch", "jax"):
        losses[name], grads[name] = backends[name].loss_and_grads(tokens, targets, arrays, config, mask=mask)

    rows = []
    for stage in STAGES:
        diffs = {pair: max_abs_diff(traces[pair.split("-")[0]][stage], traces[pair.split("-")[1]][stage]) for pair in PAIRS}
        rows.append(Row("stage", stage, diffs, tolerance(stage_kind(stage), dtype)))
    rows.append(Row("stage", "loss", {pair: abs(losses[pair.split("-")[0]] - losses[pair.split("-")[1]]) for pair in PAIRS},
                    tolerance("stage", dtype)))

    # numpy_ref has no autodiff: a finite difference in float64 at `samples` coordinates
    arrays64 = {name: value.astype(np.float64) for name, value in arrays.items()}
    rng = np.random.default_rng(seed)
    for name, value in arrays.items():
        coords = [tuple(int(rng.integers(0, size)) for size in value.shape) for _ in range(samples)]
        reference = np.array([central_difference(arrays64, name, c, tokens, targets, config, mask) for c in coords])
        diffs = {
            "torch-numpy": max_abs_diff([grads["torch"][name][c] for c in coords], reference),
            "jax-numpy": max_abs_diff([grads["jax"][name][c] for c in coords], reference),
            "torch-jax": max_abs_diff(grads["torch"][name], grads["jax"][name]),
        }
        rows.append(Row("gradient", name, diffs, tolerance("grad", dtype), note=f"numpy: finite difference at {samples} coords"))
    return rows


def trajectory_rows(config, dtype, seed, epochs) -> list[Row]:
    """The loss at every step of the default trainer in torch and in JAX, from the same init
    and batches; in float64 also the final weights."""
    import jax_impl.model
    import jax_impl.train
    import torch_impl.model
    import torch_impl.train

    train_config = TrainConfig(epochs=epochs, seed=seed, dtype=dtype)
    runs = {name: trainer.train(config, train_config) for name, trainer in (("torch", torch_impl.train), ("jax", jax_impl.train))}
    steps = len(runs["torch"].losses)
    rows = [Row("trajectory", f"loss at each of {steps} steps",
                {"torch-numpy": None, "jax-numpy": None, "torch-jax": max_abs_diff(runs["torch"].losses, runs["jax"].losses)},
                tolerance("trajectory", dtype))]
    if dtype == "float64":
        torch_weights = torch_impl.model.to_exchange(runs["torch"].model)
        jax_weights = jax_impl.model.to_exchange(runs["jax"].model)
        worst = max(max_abs_diff(torch_weights[name], jax_weights[name]) for name in torch_weights)
        rows.append(Row("trajectory", f"weights after {steps} steps", {"torch-numpy": None, "jax-numpy": None, "torch-jax": worst},
                        tolerance("stage", dtype)))
    return rows


def build_report(config: ModelConfig, dtype="float32", seed=0, mask=None, epochs=3, samples=6, backends=None) -> Report:
    title = (f"mhsa parity · {dtype} · seed {seed} · vocab_size={config.vocab_size} d_model={config.d_model} "
             f"n_heads={config.n_heads} max_len={config.max_len} bias={config.bias} · "
             f"{'padding mask (B, 1, 1, T) and causal' if mask is not None else 'causal mask only'}")
    report = Report(title)
    report.rows += stage_and_gradient_rows(config, dtype, seed, mask=mask, samples=samples, backends=backends)
    if epochs > 0:
        report.rows += trajectory_rows(config, dtype, seed, epochs)
    return report


def format_report(report: Report) -> str:
    first = report.first_failure
    names = {"stage": lambda row: row.name, "gradient": lambda row: f"grad {row.name}", "trajectory": lambda row: row.name}
    width = max(len(names[row.section](row)) for row in report.rows)
    header = f"| {'compared':<{width}} | " + " | ".join(f"{HEADERS[pair]:>14}" for pair in PAIRS) + " | tolerance | result |"
    lines = [report.title, "", header, "|" + "-" * (width + 2) + "|" + "|".join(["-" * 15 + ":"] * 3) + "|----------:|--------|"]
    section = None
    for row in report.rows:
        if row.section != section and section is not None:
            lines.append(f"| {'':<{width}} | " + " | ".join(" " * 14 for _ in PAIRS) + " |           |        |")
        section = row.section
        cells = " | ".join(f"{'—' if row.diffs[pair] is None else f'{row.diffs[pair]:.2e}':>14}" for pair in PAIRS)
        result = "PASS" if row.passed else "FAIL"
        marker = "  <- the implementations part here" if row is first else ""
        lines.append(f"| {names[row.section](row):<{width}} | {cells} | {row.tol:>9.0e} | {result}   |{marker}")
    lines.append("")
    notes = sorted({row.note for row in report.rows if row.note})
    lines += [f"note: {note}" for note in notes]
    if first is None:
        lines.append(f"PASS: all {len(report.rows)} comparisons within DESIGN.md tolerances")
    else:
        pair = first.failing_pair()
        failures = sum(not row.passed for row in report.rows)
        lines.append(f"FAIL: first difference at {first.section} '{first.name}': {HEADERS[pair]} "
                     f"{first.diffs[pair]:.2e} > {first.tol:.0e} ({failures} of {len(report.rows)} comparisons fail)")
    return "\n".join(lines)


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
    from shared.tools.train_cli import non_negative_int, positive_int

    defaults = ModelConfig()
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="weights, inputs and training seed (default 0)")
    parser.add_argument("--mask", choices=("causal", "padding"), default="causal",
                        help="causal only (default), or also a (B, 1, 1, T) padding mask")
    parser.add_argument("--epochs", type=non_negative_int, default=3,
                        help="epochs of the default trainer for the trajectory rows (default 3; 0 skips them)")
    parser.add_argument("--samples", type=positive_int, default=6, help="finite-difference coordinates per parameter (default 6)")
    model = parser.add_argument_group("model config (defaults: the lesson's)")
    model.add_argument("--n-heads", type=positive_int, default=defaults.n_heads)
    model.add_argument("--d-model", type=positive_int, default=defaults.d_model)
    model.add_argument("--seq-len", type=positive_int, default=defaults.max_len)
    model.add_argument("--vocab-size", type=positive_int, default=defaults.vocab_size)
    model.add_argument("--no-bias", action="store_true", help="linear layers without bias")
    parser.set_defaults(parser=parser)


def run(args) -> int:
    try:
        config = ModelConfig(vocab_size=args.vocab_size, d_model=args.d_model, n_heads=args.n_heads,
                             max_len=args.seq_len, bias=not args.no_bias)
    except (ValueError, TypeError) as error:
        args.parser.error(str(error))
    if args.dtype == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)  # off by default: float64 would silently become float32
    notes = configure_accelerators()
    mask = padding_mask(config) if args.mask == "padding" else None
    report = build_report(config, args.dtype, args.seed, mask=mask, epochs=args.epochs, samples=args.samples)
    print(format_report(report))
    for note in notes:
        print(f"note: {note}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(run(argparse.Namespace()))
