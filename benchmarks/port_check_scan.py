"""What reading a scanned stack of layers costs the port check: `mhsa port-check` on GPT-2 small's
shape (12 layers, 124M parameters), the torch reference against the same fresh Flax NNX port
written two ways, its blocks in an nnx.List (examples/zoo/gpt2_flax.py) and stacked on a leading
layer axis run by nnx.scan (examples/zoo/gpt2_scan.py). The check reads the scanned port's calls one
layer at a time (mhsa/port_check/readers/marks.py), so its program holds the 12 layers unrolled,
as the list's does: the ratio says what that costs beyond the list. Each run is a process of its
own (benchmarks/port_check_scale.py's measure: wall time and peak resident memory), the two kinds
interleaved, in a new order each round; the table gives the medians and the scan's ratio to the list.

    python benchmarks/port_check_scan.py                     # 3 rounds of 1 x 128 tokens, with --grads too
    python benchmarks/port_check_scan.py --rounds 5 --length 256
"""

from __future__ import annotations

import argparse
import random
import sys

import bench_common  # noqa: F401  (puts the repository on sys.path)
from bench_common import header, median, table
from port_check_scale import CHECK, gib, measure

from mhsa.flags import int_in  # noqa: E402  (after bench_common puts the repository on sys.path)

REFERENCE = "examples.zoo.gpt2_torch:small"
PORTS = {"nnx.List": "examples.zoo.gpt2_flax:small", "nnx.scan": "examples.zoo.gpt2_scan:small"}


def argv_of(port: str, batch: int, length: int, grads: bool) -> list[str]:
    argv = ["-c", CHECK, "port-check", REFERENCE, PORTS[port], "--no-probes", "--input-shape", f"{batch},{length}", "--int-range", "50257"]
    return argv + (["--grads"] if grads else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int_in(1, 64), default=1)
    parser.add_argument("--length", type=int_in(1, 1024), default=128, help="tokens per row (default 128)")
    parser.add_argument("--rounds", type=int_in(1, 100), default=3, help="interleaved rounds (default 3)")
    bench_common.add_write_flag(parser)
    args = parser.parse_args(argv)
    kinds = [(port, grads) for port in PORTS for grads in (False, True)]
    results: dict[tuple[str, bool], list[tuple[float, int]]] = {kind: [] for kind in kinds}
    verdicts: dict[tuple[str, bool], set[str]] = {kind: set() for kind in kinds}
    for round_ in range(args.rounds):
        order = random.Random(round_).sample(kinds, len(kinds))
        for port, grads in order:
            bench_common.progress(f"round {round_ + 1}/{args.rounds}: {port}{' --grads' if grads else ''}")
            seconds, peak, status, stdout = measure(argv_of(port, args.batch, args.length, grads))
            results[(port, grads)].append((seconds, peak))
            verdicts[(port, grads)].add(stdout.strip().splitlines()[-1].split(":")[0] if stdout.strip() else f"exit {status}")
    bench_common.progress(None)
    rows = []
    for grads in (False, True):
        suffix = " --grads" if grads else ""
        base_s, base_b = (median([r[i] for r in results[("nnx.List", grads)]]) for i in (0, 1))
        for port in PORTS:
            seconds, peak = (median([r[i] for r in results[(port, grads)]]) for i in (0, 1))
            verdict = "/".join(sorted(verdicts[(port, grads)]))
            rows.append(
                [
                    f"port-check{suffix}, port's blocks in {port}",
                    verdict,
                    f"{seconds:.1f}",
                    gib(peak),
                    f"{seconds / base_s:.2f}x",
                    f"{peak / base_b:.2f}x",
                ]
            )
    columns = ["process", "verdict", "wall s (median)", "peak RSS GiB (median)", "time / list's", "memory / list's"]
    text = f"\n\n### GPT-2-small pair, batch {args.batch} x {args.length} tokens, float32 ({args.rounds} rounds, interleaved)\n\n" + table(
        columns, rows
    )
    shown = bench_common.shown_command("benchmarks/port_check_scan.py", argv if argv is not None else sys.argv[1:])
    with bench_common.recorded(" ".join(["python", *shown]) if args.write else None):
        print(header("Port check on a scanned stack of layers", shown) + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
