"""`mhsa bind NAME.safetensors`: bind an Adam companion saved before checkpoints were bound to
its weights file (shared.checkpoint.bind), so that --resume accepts the pair."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shared import checkpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("weights", metavar="NAME.safetensors", type=Path, help="the weights file; its companion is NAME.adam.safetensors")


def run(args) -> int:
    try:
        companion = checkpoint.bind(args.weights)
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"mhsa bind: error: {error}", file=sys.stderr)
        return 1
    print(f"bound {companion} to {args.weights}")
    return 0
