"""`mhsa parity`, whole process from start to exit, interleaved: a first run (JAX's compilation
cache empty), a next run (the cache holds the report's programs) and --no-jax-cache, against
their floor, a process that only imports the libraries the report compares.

    python benchmarks/parity_timing.py               # 5 interleaved rounds (a few minutes on 2 cores)
    python benchmarks/parity_timing.py --rounds 2    # fewer rounds
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import bench_common
from bench_common import median, middle_half, table

from mhsa.flags import int_flag  # noqa: E402  (after bench_common puts the repository on sys.path)

FLOOR = "import torch, jax, flax.nnx, optax"


def variants(cache: str) -> dict[str, tuple[list[str], str | None]]:
    """name -> (argv, what to do with the JAX cache folder first: 'empty', 'keep' or None)."""
    python = sys.executable
    return {
        f"floor: python -c '{FLOOR}'": ([python, "-c", FLOOR], None),
        "mhsa parity, first run (JAX cache empty)": ([python, "-m", "mhsa.parity"], "empty"),
        "mhsa parity, next run (JAX cache filled)": ([python, "-m", "mhsa.parity"], "keep"),
        "mhsa parity --no-jax-cache": ([python, "-m", "mhsa.parity", "--no-jax-cache"], None),
    }


def measure(rounds: int) -> dict[str, list[float]]:
    """Seconds of each variant in `rounds` interleaved rounds, each in a fresh process."""
    cache = tempfile.mkdtemp(prefix="mhsa-parity-timing-")
    seconds: dict[str, list[float]] = {}
    try:
        for round_ in range(rounds):
            bench_common.progress(f"round {round_ + 1}/{rounds}")
            for name, (argv, mode) in variants(cache).items():
                env = dict(os.environ, XDG_CACHE_HOME=cache)
                if mode == "empty":
                    shutil.rmtree(cache, ignore_errors=True)
                start = time.perf_counter()
                result = subprocess.run(argv, env=env, capture_output=True, text=True)
                seconds.setdefault(name, []).append(time.perf_counter() - start)
                if result.returncode != 0:
                    raise RuntimeError(f"{name} exited {result.returncode}: {result.stderr[-2000:]}")
    finally:
        bench_common.progress(None)
        shutil.rmtree(cache, ignore_errors=True)
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int_flag("--repeats"), default=5, help="interleaved rounds, in [1, 1000] (default 5)")
    bench_common.add_write_flag(parser)
    args = parser.parse_args(argv)
    shown = bench_common.shown_command("benchmarks/parity_timing.py", argv if argv is not None else sys.argv[1:])
    with bench_common.recorded(" ".join(["python", *shown]) if args.write else None):
        print(bench_common.header("mhsa parity, whole process", shown))
        seconds = measure(args.rounds)
        floor = median(seconds[next(iter(seconds))])
        rows = []
        for name, values in seconds.items():
            low, high = middle_half(values)
            rows.append([name, f"{median(values):.2f}", f"{low:.2f}-{high:.2f}", f"{median(values) / floor:.2f}x"])
        print(f"\n### Process start to exit, median of {args.rounds} interleaved rounds, in seconds\n")
        print(table(["command", "median s", "middle half", "vs floor"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
