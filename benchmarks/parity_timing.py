"""Whole-process timings of `mhsa parity`, interleaved: a checkout of another commit (the round
start, 49fb4ce, in issue 19) against this tree on a first run (empty JAX cache), a next run, and
with --no-jax-cache. Usage: python benchmarks/parity_timing.py OTHER_CHECKOUT [ROUNDS]."""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

other = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
py = sys.executable
here = str(Path(__file__).resolve().parents[1])
cache = tempfile.mkdtemp()
variants = {
    f"{other}: mhsa parity": (
        ["env", f"PYTHONPATH={other}", py, "-c", "import sys; from shared.cli import main; sys.exit(main(['parity']))"],
        other,
        None,
    ),
    "now, first run (empty JAX cache)": ([py, "-m", "mhsa.parity"], here, "cold"),
    "now, next run (JAX cache filled)": ([py, "-m", "mhsa.parity"], here, "warm"),
    "now, --no-jax-cache": ([py, "-m", "mhsa.parity", "--no-jax-cache"], here, None),
}
times = {name: [] for name in variants}
for _ in range(rounds):
    for name, (argv, cwd, mode) in variants.items():
        env = dict(os.environ)
        if mode == "cold":
            shutil.rmtree(cache, ignore_errors=True)
        if mode:
            env["XDG_CACHE_HOME"] = cache
        t = time.perf_counter()
        res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
        times[name].append(time.perf_counter() - t)
        assert res.returncode == 0, (name, res.stderr[-2000:])
print(f"load average at the end {os.getloadavg()}\n\n| command | median s | middle half | vs {other} |\n|---|---:|---:|---:|")
base = statistics.median(times[f"{other}: mhsa parity"])
for name, v in times.items():
    q = statistics.quantiles(v, n=4) if len(v) >= 4 else (min(v), 0, max(v))
    print(f"| {name} | {statistics.median(v):.2f} | {q[0]:.2f}-{q[2]:.2f} | {base / statistics.median(v):.2f}x |")
