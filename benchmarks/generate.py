"""Decoding benchmark, side by side in one process: tokens per second of one generation step
at context length T = 64, 256, 1024, with the KV cache (one new token against T cached
positions) and without it (a full forward over all T positions, what generate(use_cache=False)
runs for every token), for each framework backend, and the ratio cached / uncached.

The cached step reads K and V of every cached position: its time per token grows linearly
in T. The uncached step computes (T, T) scores: quadratically. The last columns show the time
per token relative to T = 64 (4x and 16x T: linear would be 4x and 16x, quadratic 16x and 256x;
at small T fixed per-call costs flatten both).

    python benchmarks/generate.py            # the full table (a few minutes on 2 cores)
    python benchmarks/generate.py --quick    # tiny sizes, seconds: checks that it all runs
"""

from __future__ import annotations

import argparse
import sys

import bench_common
import numpy as np
from bench_common import interleaved, median, table

from mhsa.flags import int_flag  # noqa: E402  (after bench_common puts the repository on sys.path)

LENGTHS = [64, 256, 1024]
QUICK_LENGTHS = [16, 32]
SIZES = {"batch": 8, "d_model": 256, "n_heads": 8, "vocab_size": 64}
QUICK_SIZES = {"batch": 2, "d_model": 32, "n_heads": 4, "vocab_size": 64}


def rewind(cache, length):
    """Put the cache back to `length` filled positions, so that the same step can be timed
    again (the slots after it are overwritten). torch and numpy count in an int, NNX in a Variable."""
    if isinstance(cache.length, int):
        cache.length = length
    else:
        cache.length[...] = length


def candidates(name, T, sizes, seed=0):
    """'cached' and 'uncached': one step at context length T, each a no-argument function."""
    from mhsa import registry
    from shared.config import ModelConfig
    from shared.weights import init_weights

    backend = registry.get(name)
    config = ModelConfig(vocab_size=sizes["vocab_size"], d_model=sizes["d_model"], n_heads=sizes["n_heads"], max_len=T)
    model = backend.model.from_exchange(init_weights(config, seed), config)
    generate = backend.module("generate")
    tokens = np.random.default_rng(seed).integers(0, config.vocab_size, size=(sizes["batch"], T))
    cache = generate.new_cache(model, sizes["batch"])
    generate.step(model, tokens[:, : T - 1], cache)  # prefill: T - 1 positions cached

    def cached():
        rewind(cache, T - 1)
        return generate.step(model, tokens[:, T - 1 :], cache)  # (B, 1, V), NumPy: the work is done

    def uncached():
        return backend.model.predict(model, tokens)[:, -1]  # (B, V)

    return {f"{name} cached": cached, f"{name} uncached": uncached}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes and few runs: seconds, checks that it runs")
    parser.add_argument("--repeats", type=int_flag("--repeats"), help="runs per median, in [1, 1000] (default 7, 3 with --quick)")
    parser.add_argument(
        "--torch-threads",
        type=int_flag("--threads"),
        default=1,
        help="torch intra-op threads (default 1: on a busy 2-core machine a second thread made "
        "the cached step 30x slower, waiting for scheduler ticks at every small op)",
    )
    bench_common.add_write_flag(parser)
    args = parser.parse_args(argv)
    if args.write and args.quick:
        parser.error("--write records the full tables; --quick's are too small to mean anything")
    repeats = args.repeats or (3 if args.quick else 7)
    lengths, sizes = (QUICK_LENGTHS, QUICK_SIZES) if args.quick else (LENGTHS, SIZES)
    shown = bench_common.shown_command("benchmarks/generate.py", argv if argv is not None else sys.argv[1:])

    from mhsa import registry

    frameworks = [name for name in registry.names("generate") if name in registry.names("layers")]
    import torch  # noqa: F401  (imported first, so that the header names its thread count)

    command = " ".join(["python", *shown]) if args.write else None
    with bench_common.recorded(command), bench_common.torch_threads(args.torch_threads):
        print(
            bench_common.header("Generation with and without the KV cache" + (" (--quick: too small to mean anything)" if args.quick else ""), shown)
        )
        seconds = {}
        for T in lengths:
            functions = {}
            for name in frameworks:
                functions.update(candidates(name, T, sizes))
            times = interleaved(functions, repeats, min_time=0.0 if args.quick else 0.05)
            seconds[T] = {label: median(values) for label, values in times.items()}
        print(
            f"\nB={sizes['batch']} sequences, d_model={sizes['d_model']}, n_heads={sizes['n_heads']}, "
            f"vocab_size={sizes['vocab_size']}, max_len = T, float32; tokens/s = B / median seconds per step "
            f"over {repeats} interleaved runs.\n"
        )
        print(speed_table(frameworks, lengths, sizes, seconds))
    return 0


def speed_table(frameworks: list[str], lengths: list[int], sizes: dict, seconds: dict) -> str:
    """The markdown table of tokens per second, cached and uncached, for each framework and T."""
    columns = ["T"]
    for name in frameworks:
        columns += [
            f"{name} cached tok/s",
            f"{name} uncached tok/s",
            f"{name} cached / uncached",
            f"{name} ms/token cached, vs T={lengths[0]}",
            f"{name} uncached, vs T={lengths[0]}",
        ]
    rows = []
    for T in lengths:
        row = [T]
        for name in frameworks:
            cached, uncached = seconds[T][f"{name} cached"], seconds[T][f"{name} uncached"]
            first_cached, first_uncached = seconds[lengths[0]][f"{name} cached"], seconds[lengths[0]][f"{name} uncached"]
            row += [
                f"{sizes['batch'] / cached:,.0f}",
                f"{sizes['batch'] / uncached:,.0f}",
                f"{uncached / cached:.1f}x",
                f"{cached * 1e3:.3f} ms ({cached / first_cached:.1f}x)",
                f"{uncached * 1e3:.2f} ms ({uncached / first_uncached:.1f}x)",
            ]
        rows.append(row)
    return table(columns, rows)


if __name__ == "__main__":
    sys.exit(main())
