"""`mhsa generate`: continue a prompt with a saved model, with the KV cache or without it,
and on request show where the last generated token looks: its attention weights, in one head,
over the whole context."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from mhsa import registry
from mhsa.exit_status import TROUBLE
from mhsa.flags import int_flag, positive_float, refuse
from mhsa.heads import token_list
from mhsa.heatmap import NAN
from mhsa.threads import add_threads_argument
from shared import checks, weights
from shared.sampling import NonFiniteLogitsError
from shared.words import plural

BAR = 40  # characters for a weight of 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_threads_argument(parser)
    parser.add_argument("--load", metavar="FILE", type=Path, required=True, help="a .safetensors file saved by --save")
    parser.add_argument("--prompt", type=token_list, metavar="IDS", required=True, help="comma-separated ids such as 7,7")
    parser.add_argument("--max-new-tokens", type=int_flag("--max-new-tokens"), default=10, help="tokens to generate, in [0, 65536] (default 10)")
    parser.add_argument(
        "--backend", choices=registry.names("generate"), default="numpy", help="which implementation generates (default: numpy_ref, no framework)"
    )
    parser.add_argument("--no-cache", action="store_true", help="recompute the whole prefix for every token")
    parser.add_argument("--temperature", type=positive_float, metavar="T", help="sample from softmax(logits / T) instead of taking the argmax")
    parser.add_argument("--seed", type=int_flag("--seed"), default=0, help="sampling seed, in [0, 2**32 - 1] (default 0)")
    parser.add_argument(
        "--heatmap-head",
        type=int_flag("--heatmap-head"),
        metavar="N",
        help="also show head N's attention of the last generated token over the whole context",
    )
    parser.set_defaults(parser=parser)


def attention_row(weights_row: np.ndarray, tokens: list[int]) -> str:
    """One query's weights (T,) over the keys, one line per key: position, id, weight, bar (the
    heatmap's NAN mark for a NaN weight, which weights finite but large enough to overflow give)."""
    lines = [f"{'pos':>4} {'id':>4}  weight"]
    for position, (token, weight) in enumerate(zip(tokens, weights_row)):
        bar = NAN if math.isnan(weight) else "#" * round(float(weight) * BAR)
        lines.append(f"{position:>4} {token:>4}  {weight:6.3f}  {bar}".rstrip())  # no bar, no trailing spaces
    return "\n".join(lines)


def run(args) -> int:
    try:
        loaded = weights.read(args.load)
        weights.check_finite(loaded.arrays, f"weights file {str(args.load)!r}")
    except (ValueError, FileNotFoundError) as error:
        print(f"mhsa generate: error: {error}", file=sys.stderr)
        return TROUBLE
    config = loaded.config
    prompt = np.array([args.prompt], dtype=np.int64)
    greedy = args.temperature is None
    try:  # the flags against the model, before any work
        if args.heatmap_head is not None and args.heatmap_head >= config.n_heads:
            raise ValueError(
                f"--heatmap-head {args.heatmap_head} is out of range: the model has {plural(config.n_heads, 'head')} (0..{config.n_heads - 1})"
            )
        checks.check_generate(
            prompt.shape,
            prompt.dtype.name,
            config.vocab_size,
            config.max_len,
            args.max_new_tokens,
            prompt.min(),
            prompt.max(),
            greedy,
            args.temperature or 1.0,
        )
    except (ValueError, TypeError) as error:
        return refuse(args.parser, error)
    backend = registry.get(args.backend)
    model = backend.model.from_exchange(loaded.arrays, config)
    try:
        ids = backend.module("generate").generate(
            model, prompt, args.max_new_tokens, greedy=greedy, temperature=args.temperature or 1.0, seed=args.seed, use_cache=not args.no_cache
        )
    except NonFiniteLogitsError as error:  # finite weights large enough to overflow: no token to choose
        print(f"mhsa generate: error: {error}", file=sys.stderr)
        return TROUBLE
    tokens = ids[0].tolist()
    how = "greedy" if greedy else f"sampled at temperature {args.temperature}, seed {args.seed}"
    print(f"{args.load}: {args.backend}, {'no cache' if args.no_cache else 'KV cache'}, {how}")
    print(f"prompt:    {' '.join(map(str, args.prompt))}")
    print(f"generated: {' '.join(map(str, tokens[len(args.prompt) :]))}")
    print(f"tokens:    {','.join(map(str, tokens))}")
    if args.heatmap_head is not None:
        # the last token as a query over every position: the last row of a forward over the whole sequence
        _, attention = backend.model.predict(model, ids, return_weights=True)  # (1, H, T, T)
        print(f"\nhead {args.heatmap_head}: attention of the last token (position {len(tokens) - 1}) over the context")
        print(attention_row(attention[0, args.heatmap_head, -1], tokens))
    return 0
