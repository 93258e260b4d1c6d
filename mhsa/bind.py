"""`mhsa bind NAME.safetensors`: bind an Adam companion saved before checkpoints were bound to
its weights file (shared.checkpoint.bind), so that --resume accepts the pair. A companion already
bound to other weights is refused: rebinding it would continue these weights with another run's
moments. --force does it anyway and says what it overrode."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mhsa.exit_status import TROUBLE
from shared import checkpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("weights", metavar="NAME.safetensors", type=Path, help="the weights file; its companion is NAME.adam.safetensors")
    parser.add_argument(
        "--force",
        action="store_true",
        help="rebind a companion that is already bound to other weights (it then continues these weights with its moments)",
    )


def run(args) -> int:
    try:
        companion, before, digest = checkpoint.bind(args.weights, force=args.force)
    except (ValueError, TypeError, FileNotFoundError) as error:
        print(f"mhsa bind: error: {error}", file=sys.stderr)
        return TROUBLE
    if before == digest:
        print(f"{companion} is already bound to {args.weights}: nothing to do")
    elif before is not None:
        print(f"bound {companion} to {args.weights} (--force: it was bound to other weights, sha256 {before[:12]}...; now {digest[:12]}...)")
    else:
        print(f"bound {companion} to {args.weights}")
    return 0
