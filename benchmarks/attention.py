"""Attention benchmarks, side by side in one process: the block's explicit and fused paths
against the frameworks' own kernels and attention layers, peak memory against T, and one
fused QKV projection against three separate ones. Prints markdown tables of medians.

    python benchmarks/attention.py            # the full tables (a few minutes on 2 cores)
    python benchmarks/attention.py --quick    # tiny sizes, seconds: checks that it all runs
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import bench_common  # noqa: F401  (puts the repository on sys.path)
from bench_common import interleaved, jax_module, median, mib, ms, ratio, spread, table

from mhsa.flags import int_flag  # noqa: E402  (after bench_common puts the repository on sys.path)
from shared import malloc  # noqa: E402

SHAPES = [(4, 1024, 256, 8), (2, 2048, 512, 8)]  # B, T, D, H
QUICK_SHAPES = [(2, 64, 32, 4)]
MEMORY_T = [1024, 2048, 4096, 8192]
QUICK_MEMORY_T = [64]
MEMORY_SIZES = (1, 256, 4)  # B, D, H: one (B, H, T, T) float32 tensor is 128 MiB at T = 4096
QKV_D = [32, 256, 1024]
QKV_TOKENS = (4, 256)  # B, T


# --- PyTorch ---------------------------------------------------------------------------------


def torch_candidates(B, T, D, H):
    """name -> a no-argument function; 'SDPA' is the peer the others are compared with."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from torch_impl.attention import MultiHeadSelfAttention

    torch.manual_seed(0)
    explicit = MultiHeadSelfAttention(D, H, T, attn_impl="explicit").eval()
    fused = MultiHeadSelfAttention(D, H, T, attn_impl="fused").eval()
    fused.load_state_dict(explicit.state_dict())
    mha = nn.MultiheadAttention(D, H, batch_first=True).eval()
    x = torch.randn(B, T, D)
    d_head = D // H
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))

    def naive():
        # the lesson's first version: scale the scores, out-of-place fill, softmax into a new tensor
        q, k, v = explicit.qkv_proj(x).split(D, dim=-1)
        q, k, v = (t.reshape(B, T, H, d_head).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(d_head))
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        return explicit.out_proj((weights @ v).transpose(1, 2).reshape(B, T, D))

    def sdpa():
        # the peer: the same projections around F.scaled_dot_product_attention, nothing else
        q, k, v = explicit.qkv_proj(x).split(D, dim=-1)
        q, k, v = (t.reshape(B, T, H, d_head).transpose(1, 2) for t in (q, k, v))
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return explicit.out_proj(context.transpose(1, 2).reshape(B, T, D))

    blocked = torch.zeros(T, T).masked_fill_(~causal, float("-inf"))  # (T, T): the mask as an additive bias

    def baddbmm():
        # tried for the explicit path: scale and mask inside the scores' matmul, softmax in place
        q, k, v = explicit.qkv_proj(x).split(D, dim=-1)
        q, k, v = (t.reshape(B, T, H, d_head).transpose(1, 2).reshape(B * H, T, d_head) for t in (q, k, v))  # (B * H, T, d_head)
        scores = torch.baddbmm(blocked, q, k.transpose(1, 2), alpha=1.0 / math.sqrt(d_head))  # (B * H, T, T)
        weights = torch.softmax(scores, dim=-1, out=scores)  # (B * H, T, T)
        context = (weights @ v).reshape(B, H, T, d_head)  # (B, H, T, d_head)
        return explicit.out_proj(context.transpose(1, 2).reshape(B, T, D))

    def floor():
        # what no explicit path can avoid: writing one fresh (B, H, T, T) float32 tensor
        return torch.empty(B, H, T, T).fill_(1.0)

    def no_grad(fn):
        def run():
            with torch.no_grad():
                return fn()

        return run

    return {
        "explicit, naive (lesson's first version)": no_grad(naive),
        "explicit (attn_impl='explicit')": no_grad(lambda: explicit(x)),
        "explicit, return_weights=True": no_grad(lambda: explicit(x, return_weights=True)),
        "fused (attn_impl='fused')": no_grad(lambda: fused(x)),
        "F.scaled_dot_product_attention, direct": no_grad(sdpa),
        "tried: baddbmm (mask as a -inf bias, scale as alpha), softmax in place": no_grad(baddbmm),
        f"floor: write a fresh (B, H, T, T) float32 tensor ({mib(B * H * T * T * 4)} MiB)": no_grad(floor),
        "nn.MultiheadAttention": no_grad(lambda: mha(x, x, x, attn_mask=~causal, need_weights=False, is_causal=True)[0]),
    }, "F.scaled_dot_product_attention, direct"


# --- JAX -------------------------------------------------------------------------------------


def jax_candidates(B, T, D, H):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jax_impl.attention import MultiHeadSelfAttention

    explicit = jax_module(lambda: MultiHeadSelfAttention(D, H, T, attn_impl="explicit", rngs=nnx.Rngs(0)))
    fused = jax_module(lambda: MultiHeadSelfAttention(D, H, T, attn_impl="fused", rngs=nnx.Rngs(0)))
    mha = jax_module(lambda: nnx.MultiHeadAttention(H, D, qkv_features=D, out_features=D, decode=False, rngs=nnx.Rngs(0)))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((B, T, D), dtype=np.float32))
    causal = jnp.asarray(np.tril(np.ones((B, 1, T, T), dtype=bool)))  # what nnx.make_causal_mask gives
    d_head = D // H

    def compiled(module, **kwargs):
        graphdef, state = nnx.split(module)
        fn = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x, **kwargs))
        return lambda: jax.block_until_ready(fn(state, x))

    params = {
        "wqkv": explicit.qkv_proj.kernel[...],
        "bqkv": explicit.qkv_proj.bias[...],
        "wo": explicit.out_proj.kernel[...],
        "bo": explicit.out_proj.bias[...],
    }

    @jax.jit
    def direct(params, x):
        # the peer: the same projections around jax.nn.dot_product_attention, nothing else
        q, k, v = jnp.split(x @ params["wqkv"] + params["bqkv"], 3, axis=-1)
        q, k, v = (t.reshape(B, T, H, d_head) for t in (q, k, v))
        context = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return context.reshape(B, T, D) @ params["wo"] + params["bo"]

    return {
        "explicit (attn_impl='explicit')": compiled(explicit),
        "explicit, return_weights=True": compiled(explicit, return_weights=True),
        "fused (attn_impl='fused')": compiled(fused),
        "jax.nn.dot_product_attention, direct": lambda: jax.block_until_ready(direct(params, x)),
        "nnx.MultiHeadAttention": lambda: jax.block_until_ready(_mha(mha, x, causal)),
    }, "jax.nn.dot_product_attention, direct"


_MHA_CACHE = {}


def _mha(mha, x, mask):
    import jax
    from flax import nnx

    key = id(mha)
    if key not in _MHA_CACHE:
        graphdef, state = nnx.split(mha)
        fn = jax.jit(lambda state, x, mask: nnx.merge(graphdef, state)(x, mask=mask))
        _MHA_CACHE[key] = (fn, state)
    fn, state = _MHA_CACHE[key]
    return fn(state, x, mask)


def speed_table(framework, shapes, repeats, warmup_s):
    make = torch_candidates if framework == "torch" else jax_candidates
    rows = []
    for B, T, D, H in shapes:
        candidates, peer = make(B, T, D, H)
        times = interleaved(candidates, repeats, warmup_s=warmup_s)
        reference = median(times[peer])
        for name, values in times.items():
            rows.append([f"{B}, {T}, {D}, {H}", name, ms(median(values)), spread(values), ratio(median(values), reference)])
    title = (
        f"### {framework}: forward of the block, no gradients (median of {repeats} interleaved runs, ratio = median / median of {peer.split(',')[0]})"
    )
    return title + "\n\n" + table(["B, T, D, H", "implementation", "median ms", "middle half ms", "vs peer"], rows)


# --- memory ----------------------------------------------------------------------------------


def memory_rows(framework, lengths):
    """{T: {name: bytes}}: the peak extra resident memory of one forward of each path, and for
    JAX what XLA's compiled memory_analysis() plans for intermediates."""
    from bench_common import peak_extra_bytes

    B, D, H = MEMORY_SIZES
    rows = {}
    for T in lengths:
        row = rows[T] = {}
        for impl in ("explicit", "fused"):
            if framework == "torch":
                import torch

                from torch_impl.attention import MultiHeadSelfAttention

                block = MultiHeadSelfAttention(D, H, T, attn_impl=impl).eval()
                x = torch.randn(B, T, D)
                with torch.no_grad():
                    block(x[:, :8])  # first-call set-up outside the measurement
                    row[impl] = peak_extra_bytes(lambda: block(x))
            else:
                import jax
                import numpy as np
                from flax import nnx

                from jax_impl.attention import MultiHeadSelfAttention

                graphdef, state = nnx.split(jax_module(lambda: MultiHeadSelfAttention(D, H, T, attn_impl=impl, rngs=nnx.Rngs(0))))
                x = jax.numpy.asarray(np.random.default_rng(0).standard_normal((B, T, D), dtype=np.float32))
                compiled = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x)).lower(state, x).compile()
                analysis = compiled.memory_analysis()
                row[f"{impl} XLA temp"] = analysis.temp_size_in_bytes if analysis is not None else float("nan")
                jax.block_until_ready(compiled(state, x))
                row[impl] = peak_extra_bytes(lambda: jax.block_until_ready(compiled(state, x)))
    return rows


def _probe(framework, lengths) -> None:
    """--memory-probe: a fresh process in which glibc returns every buffer of 64 KiB or more to
    the system when it is freed, so resident memory follows what is alive; prints JSON."""
    import json

    malloc.use("returned")  # fixed, not adaptive
    print(json.dumps({str(T): row for T, row in memory_rows(framework, lengths).items()}))


def memory_table(lengths, isolated):
    import json
    import subprocess

    from bench_common import can_measure_peak, mib

    if not can_measure_peak():
        return "### Peak memory\n\nskipped: /proc/self/clear_refs is not writable here (Linux only)"
    rows = {}
    for framework in ("torch", "jax"):
        if isolated:
            command = [sys.executable, __file__, "--memory-probe", framework, "--lengths", *map(str, lengths)]
            found = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
            found = {int(T): row for T, row in found.items()}
        else:
            found = memory_rows(framework, lengths)
        for T, row in found.items():
            rows.setdefault(T, {}).update({f"{framework} {name}": value for name, value in row.items()})
    B, D, H = MEMORY_SIZES
    names = ["torch explicit", "torch fused", "jax explicit", "jax fused", "jax explicit XLA temp", "jax fused XLA temp"]
    body = [[f"{T:,}", mib(4 * B * H * T * T)] + [mib(row[name]) for name in names] for T, row in sorted(rows.items())]
    how = (
        "each framework in a fresh process whose malloc returns every buffer of 64 KiB or more when it is freed"
        if isolated
        else "in this process (--quick: no isolation, small allocations may reuse freed memory)"
    )
    title = (
        f"### Peak memory of one forward (no gradients), B = {B}, D = {D}, H = {H}, float32, in MiB\n\n"
        "Resident memory above its level before the call (Linux VmHWM, reset through "
        f"/proc/self/clear_refs), output included, one run each, {how}. XLA temp: what XLA's "
        "compiled memory_analysis() plans for intermediates."
    )
    return title + "\n\n" + table(["T", "one (B,H,T,T) tensor", *names], body)


# --- fused QKV against three linear layers ---------------------------------------------------


def qkv_table(widths, tokens, repeats, warmup_s):
    import jax
    import jax.numpy as jnp
    import torch
    from flax import nnx
    from torch import nn

    B, T = tokens
    min_time = 0.05 if warmup_s else 0.0  # --quick: one call per measurement
    rows = []
    for D in widths:
        torch.manual_seed(0)
        fused = nn.Linear(D, 3 * D)
        separate = [nn.Linear(D, D) for _ in range(3)]
        x = torch.randn(B, T, D)

        def torch_fused():
            with torch.no_grad():
                return fused(x).split(D, dim=-1)

        def torch_separate():
            with torch.no_grad():
                return [layer(x) for layer in separate]

        jfused = jax_module(lambda: nnx.Linear(D, 3 * D, rngs=nnx.Rngs(0)))
        jseparate = jax_module(lambda: nnx.List([nnx.Linear(D, D, rngs=nnx.Rngs(i)) for i in range(3)]))
        jx = jnp.asarray(x.numpy())
        fused_def, fused_state = nnx.split(jfused)
        separate_def, separate_state = nnx.split(jseparate)
        jax_fused_fn = jax.jit(lambda s, x: jnp.split(nnx.merge(fused_def, s)(x), 3, axis=-1))
        jax_separate_fn = jax.jit(lambda s, x: [layer(x) for layer in nnx.merge(separate_def, s)])

        # each framework on its own: XLA's worker threads keep spinning for a while after a call
        # and would steal the cores from torch's threads if the two alternated
        times = interleaved({"torch fused": torch_fused, "torch separate": torch_separate}, repeats, min_time=min_time, warmup_s=warmup_s)
        times.update(
            interleaved(
                {
                    "jax fused": lambda: jax.block_until_ready(jax_fused_fn(fused_state, jx)),
                    "jax separate": lambda: jax.block_until_ready(jax_separate_fn(separate_state, jx)),
                },
                repeats,
                min_time=min_time,
                warmup_s=warmup_s,
            )
        )
        for framework in ("torch", "jax"):
            one, three = median(times[f"{framework} fused"]), median(times[f"{framework} separate"])
            gflops = 2 * B * T * D * 3 * D / one / 1e9
            rows.append([framework, D, ms(one), ms(three), ratio(three, one), f"{gflops:.0f}"])
    title = (
        f"### One Linear(D, 3D) against three Linear(D, D): Q, K and V of B x T = {B} x {T} tokens, "
        f"no gradients (median of {repeats} interleaved runs, in ms)\n\n"
        "torch runs eagerly; the JAX functions are jitted, XLA may merge the three matmuls itself."
    )
    return title + "\n\n" + table(["framework", "D", "one fused", "three separate", "separate / fused", "fused GFLOP/s"], rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 3 runs, one torch thread: seconds, for the tests")
    parser.add_argument("--repeats", type=int_flag("--repeats"), default=None, help="runs per median, in [1, 1000] (default 7, 3 with --quick)")
    parser.add_argument("--only", choices=["speed", "memory", "qkv"], action="append", help="run only this table (repeatable)")
    parser.add_argument(
        "--thp",
        action="store_true",
        help="set THP_MEM_ALLOC_ENABLE=1 before torch loads: its large buffers get transparent "
        "huge pages, so a fresh (B, H, T, T) tensor costs far fewer page faults",
    )
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="glibc's malloc keeps every freed buffer for reuse (bench_common.keep_freed_memory), so a fresh "
        "(B, H, T, T) tensor reuses pages already mapped instead of page-faulting new ones (glibc only)",
    )
    parser.add_argument("--memory-probe", choices=["torch", "jax"], help=argparse.SUPPRESS)
    parser.add_argument("--lengths", type=int, nargs="+", help=argparse.SUPPRESS)
    bench_common.add_write_flag(parser)
    args = parser.parse_args(argv)
    if args.write and args.quick:
        parser.error("--write records the full tables; --quick's are too small to mean anything")
    if args.memory_probe:
        _probe(args.memory_probe, args.lengths)
        return 0
    if args.thp:
        if "torch" in sys.modules:
            parser.error("--thp works only before torch is imported: run `python benchmarks/attention.py --thp`")
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"  # read once, when torch's allocator starts
    if args.keep_freed_memory and not bench_common.keep_freed_memory():
        parser.error("--keep-freed-memory needs glibc's malloc (mallopt), which this system does not have")
    repeats = args.repeats or (3 if args.quick else 7)
    shown = bench_common.shown_command("benchmarks/attention.py", argv if argv is not None else sys.argv[1:])
    with bench_common.recorded(" ".join(["python", *shown]) if args.write else None), bench_common.torch_threads(1 if args.quick else None):
        run(args, repeats, shown)
    return 0


def run(args, repeats, shown):
    parts = args.only or ["speed", "memory", "qkv"]
    warmup_s = 0.0 if args.quick else 0.2
    print(bench_common.header("Attention block" + (" (--quick: sizes too small to mean anything)" if args.quick else ""), shown))
    if "speed" in parts:
        for framework in ("torch", "jax"):
            print("\n" + speed_table(framework, QUICK_SHAPES if args.quick else SHAPES, repeats, warmup_s), flush=True)
    if "memory" in parts:
        isolated = not args.quick or args.keep_freed_memory  # in this process, freed memory would stay resident
        print("\n" + memory_table(QUICK_MEMORY_T if args.quick else MEMORY_T, isolated=isolated), flush=True)
    if "qkv" in parts:
        widths = [32] if args.quick else QKV_D
        print("\n" + qkv_table(widths, (2, 32) if args.quick else QKV_TOKENS, repeats, warmup_s), flush=True)


if __name__ == "__main__":
    sys.exit(main())
