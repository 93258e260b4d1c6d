"""`mhsa demo`: train the default copy task with every backend that trains, one after the other."""

from __future__ import annotations

import argparse
import subprocess
import sys

from mhsa import registry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", choices=registry.names("train"), action="append", help="run only this backend (repeatable); default: every backend that trains"
    )


def run(args) -> int:
    for name in args.backend or registry.names("train"):
        module = f"{registry.get(name).package}.train"
        print(f"\n=== {name}: python -m {module} ===", flush=True)
        # a fresh process per backend, exactly what a user runs (and timed the same way)
        code = subprocess.call([sys.executable, "-m", module])
        if code != 0:
            return code
    return 0
