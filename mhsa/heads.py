"""`mhsa heads`: look at a saved model's attention heads without training it."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from mhsa import registry
from mhsa.exit_status import TROUBLE
from mhsa.flags import png_path, refuse
from mhsa.heatmap import ascii_heads
from mhsa.threads import add_threads_argument
from mhsa.train_outputs import heatmap_tokens
from shared import checks, weights
from shared.config import ATTN_IMPLS
from shared.words import plural

MAX_ID = 2**31 - 1  # ids beyond int32 are refused here; the model refuses those >= vocab_size


def token_list(text: str) -> list[int]:
    """Comma-separated token ids, parsed strictly: every item a non-negative integer, none empty
    (`3,,3`, `,3` and `3,` are refused, naming the item), each in [0, MAX_ID]."""
    parts, expected = text.split(","), f"expected comma-separated token ids such as 3,3,3, got {text!r}"
    tokens = []
    for position, part in enumerate(parts, start=1):
        item = part.strip()
        if not item:
            where = "no token id" if len(parts) == 1 else f"item {position} of {len(parts)} is empty (a stray comma?)"
            raise argparse.ArgumentTypeError(f"{expected}: {where}")
        if not (item.isascii() and item.isdecimal()):  # "-1", "2.5", "0x3", "+3": not a plain non-negative integer
            raise argparse.ArgumentTypeError(
                f"expected comma-separated token ids such as 3,3,3, got {text!r}: item {position} is {item!r}, not a non-negative integer"
            )
        tokens.append(int(item))
    bad = next((token for token in tokens if not 0 <= token <= MAX_ID), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(f"expected token ids in [0, {MAX_ID}], got {bad}")
    return tokens


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_threads_argument(parser)
    parser.add_argument("--load", metavar="FILE", type=Path, required=True, help="a .safetensors file saved by --save")
    parser.add_argument("--tokens", type=token_list, metavar="IDS", help="comma-separated input ids (default: a copy-task row, id 7 repeated)")
    parser.add_argument("--plot", metavar="FILE.png", type=png_path, help="also write every head as an image")
    parser.add_argument(
        "--backend", choices=registry.names(), default="numpy", help="which implementation computes the weights (default: numpy_ref, no framework)"
    )
    parser.add_argument(
        "--attn-impl", choices=ATTN_IMPLS, default=None, help="explicit or fused kernel (default: the file's); weights are always computed explicitly"
    )
    parser.set_defaults(parser=parser)


def attention_weights(backend: str, arrays: dict, config, tokens: np.ndarray) -> np.ndarray:
    """(H, T, T) weights of the first row of `tokens` (1, T), from the chosen implementation."""
    module = registry.get(backend).model
    _, attention = module.predict(module.from_exchange(arrays, config), tokens, return_weights=True)
    return attention[0]


def run(args) -> int:
    try:
        checks.check_outputs({"--load": args.load}, {"--plot": args.plot})
        if args.plot is not None:
            checks.check_writable(args.plot, "--plot")
        loaded = weights.read(args.load)
        weights.check_finite(loaded.arrays, f"weights file {str(args.load)!r}")
    except (ValueError, FileNotFoundError) as error:
        print(f"mhsa heads: error: {error}", file=sys.stderr)
        return TROUBLE
    arrays, config = loaded.arrays, loaded.config
    if args.attn_impl is not None:
        config = dataclasses.replace(config, attn_impl=args.attn_impl)
    if args.tokens and len(args.tokens) > config.max_len:  # the flags against the model, before any work
        return refuse(args.parser, f"--tokens gives {plural(len(args.tokens), 'id')}, more than the model's max_len={config.max_len}")
    tokens = np.array([args.tokens], dtype=np.int64) if args.tokens else heatmap_tokens(config)
    try:
        attention = attention_weights(args.backend, arrays, config, tokens)
    except (ValueError, TypeError) as error:  # --tokens the model refuses (an id >= vocab_size), before it computes
        return refuse(args.parser, error)
    print(f"{args.load}: {plural(config.n_heads, 'head')}, d_head={config.d_head}, tokens {tokens[0].tolist()} ({args.backend})\n")
    print(ascii_heads(attention, tokens=tokens[0].tolist()))
    if args.plot is not None:
        from mhsa.plots import heads_figure, save_figure

        title = (
            f"{args.load.name} · {args.backend} · {plural(config.n_heads, 'head')} · D={config.d_model} max_len={config.max_len} "
            f"V={config.vocab_size} · a row of {plural(tokens.shape[1], 'token')}"
        )
        save_figure(heads_figure(attention, tokens=tokens[0].tolist(), title=title), args.plot)
        print(f"saved plot to {args.plot}")
    return 0
