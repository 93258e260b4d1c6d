"""The trainers' default thread count on a busy machine: each backend's default run (`python -m
PACKAGE.train --quiet`) beside two busy processes (`python -c "while True: pass"`), against the
same run with `--threads 1` and with `--threads 2` (one thread per core of a 2-core machine,
what every library picks by itself). Runs interleaved (default, 1, 2, default, 1, 2, ...), each
the training seconds the final line reports; the table gives the median of each and the ratios
of the medians to `--threads 1`. docs/performance.md ("Threads") holds its table.

Run it: `python benchmarks/busy_threads.py [--runs N] [--busy N] [--two]`.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

SECONDS = re.compile(r"(\d+(?:\.\d+)?) s of training")
BACKENDS = {"torch": "torch_impl", "jax": "jax_impl", "numpy": "numpy_ref"}
SETTINGS = {"default": [], "--threads 1": ["--threads", "1"], "--threads 2": ["--threads", "2"]}


def training_seconds(package: str, flags: list[str]) -> float:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OMP_", "XLA_FLAGS"))}
    result = subprocess.run(
        [sys.executable, "-m", f"{package}.train", "--quiet", *flags], capture_output=True, text=True, env=env, timeout=600, check=True
    )
    return float(SECONDS.search(result.stdout).group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each backend and setting, interleaved (default 5)")
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside the runs (default 2)")
    parser.add_argument("--two", action="store_true", help="also --threads 2 (slow on a busy machine: the reason for the default)")
    args = parser.parse_args(argv)
    settings = {name: flags for name, flags in SETTINGS.items() if args.two or name != "--threads 2"}
    if not 1 <= args.runs <= 100 or not 0 <= args.busy <= 64:
        parser.error(f"--runs {args.runs} --busy {args.busy}: expected --runs in [1, 100] and --busy in [0, 64]")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        print(f"{args.busy} busy processes beside each run, {os.cpu_count()} cores, median of {args.runs} interleaved runs\n")
        two = " `--threads 2` |" if args.two else ""
        print(f"| backend | default | `--threads 1` |{two} default / `--threads 1` |{two.replace(' |', ' / `--threads 1` |')}")
        print("|---|---:|---:|" + ("---:|" if args.two else "") + "---:|" + ("---:|" if args.two else ""))
        for backend, package in BACKENDS.items():
            times: dict[str, list[float]] = {name: [] for name in settings}
            for _ in range(args.runs):
                for name, flags in settings.items():
                    times[name].append(training_seconds(package, flags))
            median = {name: statistics.median(values) for name, values in times.items()}
            one = median["--threads 1"]
            cells = [f"{median['default']:.2f} s", f"{one:.2f} s"] + ([f"{median['--threads 2']:.2f} s"] if args.two else [])
            cells += [f"{median['default'] / one:.2f}"] + ([f"{median['--threads 2'] / one:.2f}"] if args.two else [])
            print(f"| {backend} | " + " | ".join(cells) + " |", flush=True)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
