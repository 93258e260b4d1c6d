"""This tree against another checkout of the project, interleaved: each trainer's steady-state
speed, the default run's start-up, `mhsa parity`, the port check at GPT-2 small's size and the
test suite, each measured in both
checkouts in turn, round after round, so that a machine shared with other work slows both alike.
Each checkout needs its own .venv (`make install` there); every measurement is a process of its
own, run with that checkout's venv and working directory.

    python benchmarks/vs_checkout.py ../base                       # every measurement, 3 rounds
    python benchmarks/vs_checkout.py ../base --only train startup --rounds 5
    python benchmarks/vs_checkout.py ../base --write               # and into RESULTS.md

What each row measures (the median over the rounds; the ratio is this tree's over the other's):
  train BACKEND    seconds per epoch of the default config, epochs 2..6 of one train() (the
                   first epoch holds compilation), the median epoch of the run
  start-up BACKEND `python -m BACKEND.train --quiet`: the default run, process start to exit
  parity           `mhsa parity`, process start to exit, JAX's compilation cache warm
  port-check       `mhsa port-check` on the zoo's GPT-2-small pair (124M parameters, 1024
                   tokens), process start to exit, without and with --grads (PORT_CHECK)
  tests            `python -m pytest -q -n 2 --dist loadscope` (what `make test` runs)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import bench_common
from bench_common import header, median, middle_half, table

from mhsa.flags import int_flag  # noqa: E402  (after bench_common puts the repository on sys.path)

HERE = Path(__file__).resolve().parents[1]
BACKENDS = ("torch_impl", "jax_impl", "numpy_ref")
KINDS = ("train", "startup", "parity", "port-check", "tests")
PORT_CHECK = ["port-check", "examples.zoo.gpt2_torch:small", "examples.zoo.gpt2_flax:small", "--no-probes"]
EPOCHS = 6

# run in the checkout with its venv: the median epoch of epochs 2..EPOCHS of each backend's train()
EPOCH_SPEED = """
import json, sys, time
from shared.config import ModelConfig, TrainConfig
out = {}
for package in sys.argv[2:]:
    train = __import__(package + ".train", fromlist=["train"])
    config = TrainConfig(epochs=int(sys.argv[1]))
    stamps = []
    def on_step(step, loss, stamps=stamps, config=config):
        if step % config.steps_per_epoch == 0 or step == config.epochs * config.steps_per_epoch - 1:
            stamps.append(time.perf_counter())
    train.train(ModelConfig(), config, on_step=on_step)
    epochs = sorted(b - a for a, b in zip(stamps[1:], stamps[2:]))
    out[package] = epochs[len(epochs) // 2]
print(json.dumps(out))
"""


def _run(root: Path, argv: list[str]) -> tuple[float, str]:
    """(wall seconds, stdout) of one process in `root`; a failure stops the benchmark."""
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=root, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"vs_checkout: {' '.join(argv[:4])} failed in {root} (exit {result.returncode}): {result.stderr.strip()[-500:]}")
    return elapsed, result.stdout


def measure_once(root: Path, kinds: list[str]) -> dict[str, float]:
    """One round of every asked measurement in the checkout at `root`."""
    python = str(root / ".venv" / "bin" / "python")
    found: dict[str, float] = {}
    if "train" in kinds:
        _, out = _run(root, [python, "-c", EPOCH_SPEED, str(EPOCHS), *BACKENDS])
        found |= {f"train {name}": seconds for name, seconds in json.loads(out.splitlines()[-1]).items()}
    if "startup" in kinds:
        for name in BACKENDS:
            found[f"start-up {name}"] = _run(root, [python, "-m", f"{name}.train", "--quiet"])[0]
    if "parity" in kinds:
        found["parity"] = _run(root, [str(root / ".venv" / "bin" / "mhsa"), "parity"])[0]
    if "port-check" in kinds:
        mhsa = str(root / ".venv" / "bin" / "mhsa")
        found["port-check GPT-2 small"] = _run(root, [mhsa, *PORT_CHECK])[0]
        found["port-check GPT-2 small --grads"] = _run(root, [mhsa, *PORT_CHECK, "--grads"])[0]
    if "tests" in kinds:
        found["tests"] = _run(root, [python, "-m", "pytest", "-q", "-n", "2", "--dist", "loadscope", "-p", "no:cacheprovider"])[0]
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (with its own .venv)")
    parser.add_argument("--only", nargs="+", choices=KINDS, default=list(KINDS), help="the measurements to make (default all)")
    parser.add_argument("--rounds", type=int_flag("--repeats"), default=3, help="interleaved rounds, in [1, 1000] (default 3)")
    bench_common.add_write_flag(parser)
    args = parser.parse_args(argv)
    other = args.other.resolve()
    if not (other / ".venv" / "bin" / "python").is_file():
        parser.error(f"{other} has no .venv/bin/python: run `make install` there first")
    sides = {"other": other, "this tree": HERE}
    commits = {name: _commit(root) for name, root in sides.items()}
    shown = bench_common.shown_command("benchmarks/vs_checkout.py", argv if argv is not None else sys.argv[1:])
    with bench_common.recorded(" ".join(["python", *shown]) if args.write else None):
        print(header(f"This tree ({commits['this tree']}) against {commits['other']}", shown))
        for root in sides.values():  # bytecode of both sides' modules first, else a shell with
            # PYTHONDONTWRITEBYTECODE has every process compile the modules whose bytecode is stale
            packages = [path.name for path in sorted(root.iterdir()) if (path / "__init__.py").is_file() or path.name in ("examples", "benchmarks")]
            _run(root, [str(root / ".venv" / "bin" / "python"), "-m", "compileall", "-q", "-j", "0", *packages])
        if "parity" in args.only:  # JAX's compilation cache filled once on each side, not counted
            for root in sides.values():
                _run(root, [str(root / ".venv" / "bin" / "mhsa"), "parity"])
        rounds: dict[str, dict[str, list[float]]] = {name: {} for name in sides}
        for round_ in range(args.rounds):
            for name, root in sides.items() if round_ % 2 == 0 else reversed(sides.items()):
                bench_common.progress(f"round {round_ + 1}/{args.rounds}: {name}")
                for key, seconds in measure_once(root, args.only).items():
                    rounds[name].setdefault(key, []).append(seconds)
        bench_common.progress(None)
        rows = []
        for key, theirs in rounds["other"].items():
            ours = rounds["this tree"][key]
            low, high = middle_half(ours)
            rows.append([key, f"{median(theirs):.3f}", f"{median(ours):.3f}", f"{low:.3f}-{high:.3f}", f"{median(ours) / median(theirs):.3f}x"])
        print(f"\n### Seconds, median of {args.rounds} interleaved rounds; load average at the end {_load()}\n")
        print(table(["measurement", commits["other"], "this tree", "this tree's middle half", "this tree / other"], rows))
        print(
            "\n- measured interleaved on a shared machine (other work ran beside both checkouts alike): "
            "read the ratios, not the seconds; a train row's steps per second is the inverse of its ratio"
        )
    return 0


def _commit(root: Path) -> str:
    result = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h"], capture_output=True, text=True)
    return result.stdout.strip() or root.name


def _load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
