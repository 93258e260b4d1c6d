"""`mhsa parity`: its flags, the settings the report runs under, and the command."""

from __future__ import annotations

import argparse
import contextlib
import sys

from mhsa import registry
from mhsa.parity import data_parallel
from mhsa.parity.report import build_report, format_report
from mhsa.parity.runs import padding_mask
from mhsa.parity.table import MIN_WIDTH, WIDTH, wrap
from mhsa.threads import add_threads_argument, apply_threads
from shared.config import DTYPES, ModelConfig, TrainConfig


def full_precision(stack: contextlib.ExitStack) -> list[str]:
    """float32 parity on a GPU needs TF32 off: JAX uses TF32 for float32 matmuls on Ampere and
    later by default, torch's cuDNN does too. Every backend with the "device" capability computes
    its float32 matmuls at full precision until `stack` closes; returns a note for each one that
    found an accelerator (on a CPU float32 matmuls are always full precision)."""
    notes = []
    for name in registry.names("device"):
        device = registry.get(name).module("device")
        stack.enter_context(device.full_precision())
        accelerator = device.accelerator()
        if accelerator is not None:
            notes.append(f"{name}: {accelerator} present, float32 matmuls at full precision (no TF32 or bf16 passes)")
    return notes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mhsa.flags import add_model_arguments, int_at_least, int_flag

    add_threads_argument(parser, default="1 in every library: the report's models are tiny, and its digits then hold in any shell")
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
    parser.add_argument(
        "--width",
        type=int_at_least(MIN_WIDTH, f"a width of at least {MIN_WIDTH}"),
        default=WIDTH,
        help=f"the longest line the report prints, at least {MIN_WIDTH} (default {WIDTH}): tables take short headers and wrap long names, notes wrap",
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
        itemsize = 8  # a float32 report runs the reference again in float64, the twin its tolerances are derived from
        checks.check_training_fits(
            config.vocab_size, config.d_model, config.n_heads, config.max_len, TrainConfig.batch_size, TrainConfig.n_sequences, itemsize
        )
    except (ValueError, TypeError) as error:
        args.parser.error(str(error))
    if args.dp == 1:
        args.parser.error("--dp 1 compares a run with itself: give 2 or more, or 0 to skip the data-parallel section")
    if args.threads is None:
        # the report's models are tiny: a second thread only waits for work, and with the other
        # lanes' work on the cores it spins; one thread in torch, NumPy's BLAS and XLA also fixes
        # the order of every reduction, so the report prints the same digits whatever the shell's
        # OMP_NUM_THREADS or the machine's core count (before JAX starts: XLA reads it then)
        apply_threads(1)
    if args.dp:
        data_parallel.prepare(args.dp)  # before JAX starts: it fixes its CPU device count then
    cache_note = None
    if not args.no_jax_cache:
        from mhsa.compile_cache import enable_jax_cache

        cache_note = enable_jax_cache()  # the same programs every run: a second run reads them compiled
    mask = padding_mask(config) if args.mask == "padding" else None
    with contextlib.ExitStack() as stack:
        notes = full_precision(stack)
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
    print(format_report(report, args.width))
    for note in notes + ([cache_note] if cache_note else []):
        print("\n".join(wrap(f"note: {note}", args.width, indent=" " * 6)))
    return 0 if report.passed else 1


def _progress(index: int, total: int, section: str) -> None:
    print(f"\rparity [{index + 1}/{total}] {section} ...\033[K", end="\n" if index + 1 == total else "", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m mhsa.parity`: the same flags and report as `mhsa parity`."""
    from mhsa.cli import interrupt_status, interrupts_restored, leave_busy_threads, run_guarded

    parser = argparse.ArgumentParser(prog="python -m mhsa.parity", description=(__doc__ or "").split("\n\n")[0])
    add_arguments(parser)
    with interrupts_restored(own_process=argv is None):
        status = run_guarded(run, parser.parse_args(argv), prefix="python -m mhsa.parity: error")
        if argv is None and status == interrupt_status():
            leave_busy_threads(status)
        return status


if __name__ == "__main__":
    sys.exit(main())
