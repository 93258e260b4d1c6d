"""Command-line flags shared by every command: one parser for integers with one documented
range per flag, and the model flags (defined here once, used by train, parity and heads).

The ranges (the same in every backend, since every backend is reached through these flags):

    flag              range              why
    --n-heads         [1, 1024]
    --d-model         [1, 65536]
    --seq-len         [1, 65536]         T = max_len
    --vocab-size      [1, 1048576]
    --epochs          [1, 1000000]       train: the total, also when resuming
    --batch-size      [1, 1048576]
    --n-sequences     [1, 2147483647]
    --seed            [0, 4294967295]    what NumPy, torch and JAX all accept (2**32 - 1)
    --heatmap-head    [0, 1023]          and below the model's n_heads
    --samples         [1, 1000]          parity: finite-difference coordinates
    parity --epochs   [0, 1000]          0 skips the trajectory rows
    --threads         [1, 1024]          threads of torch, NumPy's BLAS and XLA (mhsa.threads)
    --max-new-tokens  [0, 65536]         generate: also bounded by max_len
    --int-range       [1, 2147483647]    port-check: integer ids in [0, N)
    --repeats         [1, 1000]          bench and the benchmark scripts: runs per median
    --demo-runs       [1, 100]           benchmarks/train.py: process runs of each command in the start-up table
    --dp              [1, 64]            train: ranks (torch processes) or devices (JAX) on one machine
    parity --dp       [0, 64]            0 skips the data-parallel section; 1 is refused (a run against itself)
    port-check --train [1, 100000]       steps of the check through training

Within these ranges a size that cannot fit in memory is refused before any allocation by
shared.checks.check_training_fits, with the estimated memory in the message.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mhsa.exit_status import TROUBLE
from shared.checks import SEED_RANGE
from shared.config import ATTN_IMPLS, ModelConfig

RANGES = {
    "--n-heads": (1, 1024),
    "--d-model": (1, 65536),
    "--seq-len": (1, 65536),
    "--vocab-size": (1, 2**20),
    "--epochs": (1, 10**6),
    "--batch-size": (1, 2**20),
    "--n-sequences": (1, 2**31 - 1),
    "--seed": SEED_RANGE,
    "--heatmap-head": (0, 1023),
    "--samples": (1, 1000),
    "parity --epochs": (0, 1000),
    "--threads": (1, 1024),
    "--max-new-tokens": (0, 65536),
    "--int-range": (1, 2**31 - 1),
    "--repeats": (1, 1000),
    "--demo-runs": (1, 100),
    "--dp": (1, 64),
    "parity --dp": (0, 64),
    "port-check --train": (1, 100_000),
}
# ModelConfig field -> its flag
MODEL_FLAGS = {"vocab_size": "--vocab-size", "d_model": "--d-model", "n_heads": "--n-heads", "max_len": "--seq-len"}


def int_in(low: int, high: int | None = None, description: str | None = None):
    """An argparse type: an int in [low, high] (no upper bound if None), else an
    argparse-style error naming the value and the range."""
    description = description or (f"an integer in [{low}, {high}]" if high is not None else f"an integer >= {low}")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {description}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {description}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in some errors
    return parse


def int_flag(flag: str):
    """The parser of an integer flag, with its documented range from RANGES."""
    return int_in(*RANGES[flag])


def int_at_least(minimum: int, description: str):
    """An int >= minimum described in words (a flag without an upper bound, e.g. diff --width)."""
    return int_in(minimum, None, description)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text}")
    return value


def refuse(parser: argparse.ArgumentParser, error: Exception | str) -> int:
    """A value the command can check only once it has read its input (a head the model lacks, a
    prompt longer than the context): the flag was well formed, so no usage, only the one line
    `PROG: error: MESSAGE` on stderr, returned as exit status 2 (docs/exit-status.md)."""
    print(f"{parser.prog}: error: {error}", file=sys.stderr)
    return TROUBLE


def png_path(text: str) -> Path:
    if not text.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"expected a file name ending in .png, got {text!r}")
    return Path(text)


def add_model_arguments(parser, title: str, defaults: bool = True):
    """--n-heads, --d-model, --seq-len, --vocab-size and --attn-impl, in one group.

    defaults=False: every flag defaults to None (train: a loaded file's config fills them)."""
    model = ModelConfig()
    group = parser.add_argument_group(title)
    for field, flag, text in (
        ("n_heads", "--n-heads", "attention heads H"),
        ("d_model", "--d-model", "model width D"),
        ("max_len", "--seq-len", "context length T = max_len"),
        ("vocab_size", "--vocab-size", "vocabulary size V"),
    ):
        low, high = RANGES[flag]
        group.add_argument(
            flag,
            type=int_flag(flag),
            default=getattr(model, field) if defaults else None,
            help=f"{text}, in [{low}, {high}] (default {getattr(model, field)})",
        )
    group.add_argument(
        "--attn-impl",
        choices=ATTN_IMPLS,
        default=model.attn_impl if defaults else None,
        help=f"explicit: every step on its own; fused: the framework's attention kernel where weights are not asked for (default {model.attn_impl})",
    )
    return group


def model_flags_given(args) -> dict:
    """The ModelConfig fields the user set on the command line (flags left at None omitted)."""
    given = {field: getattr(args, flag[2:].replace("-", "_")) for field, flag in MODEL_FLAGS.items()}
    if getattr(args, "attn_impl", None) is not None:
        given["attn_impl"] = args.attn_impl
    return {field: value for field, value in given.items() if value is not None}
