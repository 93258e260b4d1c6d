"""Whole-process timings of `mhsa parity`, interleaved: another checkout's (its own .venv/bin/mhsa)
against this tree's, each run in turn, with JAX's compilation cache warm (a first run of each
fills it and is not counted): wall time, and the CPU time of the process and its children (the
work, which a machine shared with other jobs stretches less than the wall time). Each checkout
needs its own .venv (`make install` there). Usage:
python benchmarks/parity_vs_checkout.py OTHER_CHECKOUT [ROUNDS] [-- FLAGS].

    python benchmarks/parity_vs_checkout.py /work/main 7                  # the default report
    python benchmarks/parity_vs_checkout.py /work/main 5 -- --dtype float64 --mask padding --n-heads 8
"""

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

args = sys.argv[1:]
flags = args[args.index("--") + 1 :] if "--" in args else []
args = args[: args.index("--")] if "--" in args else args
other = Path(args[0]).resolve()
rounds = int(args[1]) if len(args) > 1 else 5
here = Path(__file__).resolve().parents[1]
variants = {f"{other}": other, "this tree": here}
times: dict[str, list[float]] = {name: [] for name in variants}
cpu: dict[str, list[float]] = {name: [] for name in variants}
for round_ in range(rounds + 1):
    for name, root in variants.items():
        before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        result = subprocess.run([str(root / ".venv" / "bin" / "mhsa"), "parity", *flags], cwd=root, capture_output=True, text=True)
        elapsed, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
        assert result.returncode == 0, (name, result.stdout[-2000:], result.stderr[-2000:])
        if round_:  # the first round fills JAX's cache
            times[name].append(elapsed)
            cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
base, cpu_base = statistics.median(times[f"{other}"]), statistics.median(cpu[f"{other}"])
print(f"mhsa parity {' '.join(flags)} · {rounds} rounds · load average at the end {os.getloadavg()}\n")
print(f"| checkout | median s | fastest-slowest | vs {other} | CPU s (median) | CPU vs {other} |\n|---|---:|---:|---:|---:|---:|")
for name, values in times.items():
    median, work = statistics.median(values), statistics.median(cpu[name])
    print(f"| {name} | {median:.2f} | {min(values):.2f}-{max(values):.2f} | {median / base:.2f}x | {work:.2f} | {work / cpu_base:.2f}x |")
