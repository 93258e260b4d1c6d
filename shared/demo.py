"""`mhsa demo`: train the default copy task with every backend, one after the other."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys

BACKENDS = {"torch": "torch_impl.train", "jax": "jax_impl.train"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=sorted(BACKENDS), action="append",
                        help="run only this backend (repeatable); default: every backend")


def available() -> list[str]:
    return [name for name, module in BACKENDS.items() if importlib.util.find_spec(module) is not None]


def run(args) -> int:
    names = args.backend or available()
    missing = sorted(set(BACKENDS) - set(available()))
    if missing:
        print(f"backends not written yet: {', '.join(missing)}; running: {', '.join(names) or 'none'}")
    for name in names:
        print(f"\n=== {name}: python -m {BACKENDS[name]} ===", flush=True)
        # a fresh process per backend, exactly what a user runs (and timed the same way)
        code = subprocess.call([sys.executable, "-m", BACKENDS[name]])
        if code != 0:
            return code
    return 0
