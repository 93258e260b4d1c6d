"""The one launcher of `python -m torch_impl.train`, `python -m jax_impl.train` and
`python -m numpy_ref.train`: the top of each train.py hands its command line here before the
library part of the file, and its framework, is imported (mhsa.train_cli parses the flags)."""

from __future__ import annotations

import sys


def main(backend: str) -> None:
    """Run mhsa.train_cli.main(backend) and exit with its status."""
    try:  # Ctrl-C while the command line is still being imported: one line and 130, as at any later moment
        from mhsa.train_cli import main as train_command
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(train_command(backend))
