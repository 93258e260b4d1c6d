"""`mhsa bench`: run the benchmarks of benchmarks/ (a folder of the repository, not an
installed package) and print their markdown tables; with --write each script also replaces its
own section of benchmarks/RESULTS.md."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import shared
from mhsa.exit_status import TROUBLE
from mhsa.flags import int_flag

SCRIPTS = {"attention": "attention.py", "train": "train.py", "generate": "generate.py"}


def benchmarks_folder() -> Path:
    """benchmarks/ beside the shared package: present in a checkout, absent from a wheel."""
    return Path(shared.__file__).resolve().parent.parent / "benchmarks"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("which", nargs="?", choices=["all", *SCRIPTS], default="all", help="which benchmark to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few runs: seconds, checks that they run")
    parser.add_argument("--repeats", type=int_flag("--repeats"), help="runs per median, in [1, 1000] (default 7, 3 with --quick)")
    parser.add_argument("--write", action="store_true", help="also write each script's tables into its own section of benchmarks/RESULTS.md")


def run(args) -> int:
    if args.write and args.quick:
        print("mhsa bench: --write records the full tables; --quick's are too small to mean anything", file=sys.stderr)
        return TROUBLE
    folder = benchmarks_folder()
    names = list(SCRIPTS) if args.which == "all" else [args.which]
    missing = [SCRIPTS[name] for name in names if not (folder / SCRIPTS[name]).is_file()]
    if missing:
        print(
            f"mhsa bench: {', '.join(missing)} not found in {folder}; the benchmarks live in the "
            "repository's benchmarks/ folder, which is not installed with the package: run it from a checkout",
            file=sys.stderr,
        )
        return TROUBLE
    argv = (["--quick"] if args.quick else []) + (["--repeats", str(args.repeats)] if args.repeats else []) + (["--write"] if args.write else [])
    sys.path.insert(0, str(folder))  # the scripts import bench_common beside them
    try:
        for index, name in enumerate(names):
            if index:
                print()
            spec = importlib.util.spec_from_file_location(f"mhsa_benchmarks_{name}", folder / SCRIPTS[name])
            if spec is None or spec.loader is None:  # a script the table names but the folder lacks
                raise FileNotFoundError(f"benchmark script {folder / SCRIPTS[name]} cannot be loaded")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            code = module.main(argv)
            if code:
                return code
    finally:
        sys.path.remove(str(folder))
    return 0
