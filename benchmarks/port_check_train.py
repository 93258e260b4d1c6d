"""`mhsa port-check --train N` against the trainings it runs, done bare: the reference in float32
(zero_grad, loss, backward, clip, step), the port in float32 (one compiled step: value_and_grad,
tx.update, apply_updates) and the reference in float64, N steps each. The check is held to
3x the three together. Interleaved: every round runs each candidate once, in a new order, each
from objects the factories built just before (not timed); the table gives the medians.

Usage: python benchmarks/port_check_train.py [TORCH_FACTORY FLAX_FACTORY] [--steps N] [--repeats R]

The factories are `--train` factories (package.module:function returning {model, optimizer,
loss, inputs, ...}); by default the zoo's Llama-style pair (examples/zoo/llama_train.py: RMSNorm,
rotary embeddings, SwiGLU, grouped-query attention, tied embeddings, padded rows), trained by
AdamW with gradient clipping (torch's clip, optax.clip_by_global_norm).
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time

import bench_common
from bench_common import ROOT, header, progress

assert ROOT  # the checkout is on sys.path (bench_common puts it there)

from mhsa.flags import int_flag  # noqa: E402  (the frameworks are imported once the flags are read: a bad flag costs no import)


def bare_torch(setup: dict, steps: int, dtype=None) -> None:
    """The user's own loop; dtype=torch.float64: on float64 copies of the model and its optimizer."""
    import torch
    from torch import nn

    model, optimizer = setup["model"], setup["optimizer"]
    if dtype is not None:
        model, optimizer = copy.deepcopy((model, optimizer))
        model.to(dtype)
    batches = [tuple(torch.as_tensor(x) for x in batch) for batch in setup["inputs"]]
    k = setup.get("model_inputs")
    for step in range(steps):
        batch = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        setup["loss"](model(*batch[:k]), *batch).backward()
        if setup.get("clip") is not None:
            nn.utils.clip_grad_norm_(model.parameters(), setup["clip"])
        optimizer.step()
        if setup.get("scheduler") is not None:
            setup["scheduler"].step()


def bare_flax(setup: dict, steps: int) -> None:
    """One compiled step, as a user writes it for speed: the model split, value_and_grad, tx.update."""
    import jax
    import optax
    from flax import nnx

    graphdef, params, rest = nnx.split(setup["model"], nnx.Param, ...)
    tx, loss_fn, k = setup["optimizer"], setup["loss"], setup.get("model_inputs")

    @jax.jit
    def step(params, rest, opt_state, batch):
        def objective(params):
            return loss_fn(nnx.merge(graphdef, params, rest)(*batch[:k]), *batch)

        loss, grads = jax.value_and_grad(objective)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    opt_state = tx.init(params)
    for index in range(steps):
        loss, params, opt_state = step(params, rest, opt_state, setup["inputs"][index % len(setup["inputs"])])
    jax.block_until_ready(loss)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/port_check_train.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("factories", nargs="*", metavar="FACTORY", help="TORCH_FACTORY FLAX_FACTORY (default: the zoo's Llama-style pair)")
    parser.add_argument("--steps", type=int_flag("port-check --train"), default=20, help="steps of each training, in [1, 100000] (default 20)")
    parser.add_argument("--repeats", type=int_flag("--repeats"), default=5, help="interleaved rounds, in [1, 1000] (default 5)")
    parser.add_argument("--threads", type=int_flag("--threads"), help="torch's threads for every candidate (default: torch's own choice)")
    bench_common.add_write_flag(parser)
    args = parser.parse_args(argv)
    if len(args.factories) not in (0, 2):
        parser.error("give both factories, or neither")
    import torch

    from mhsa.port_check.factories import call_factory
    from mhsa.port_check.training.check import check_setup, check_training

    if args.threads:
        torch.set_num_threads(args.threads)
    specs = args.factories or ["examples.zoo.llama_train:reference", "examples.zoo.llama_train:port"]

    def build():
        return check_setup(call_factory(specs[0], "TORCH_FACTORY"), "reference"), check_setup(call_factory(specs[1], "FLAX_FACTORY"), "port")

    n = args.steps
    candidates = {
        f"bare: torch float32, {n} steps": lambda ref, port: bare_torch(ref, n),
        f"bare: flax float32, {n} steps (compile included)": lambda ref, port: bare_flax(port, n),
        f"bare: torch float64, {n} steps": lambda ref, port: bare_torch(ref, n, torch.float64),
        f"port-check --train {n} (check_training)": lambda ref, port: check_training(ref, port, n),
    }
    times: dict[str, list[float]] = {name: [] for name in candidates}
    order = list(candidates)
    for name in order:  # warm-up: imports, first allocations
        candidates[name](*build())
    for round_ in range(args.repeats):
        random.Random(round_).shuffle(order)
        for name in order:
            progress(f"round {round_ + 1}/{args.repeats}: {name}")
            setups = build()
            start = time.perf_counter()
            candidates[name](*setups)
            times[name].append(time.perf_counter() - start)
    progress(None)
    medians = {name: statistics.median(values) for name, values in times.items()}
    bare = sum(value for name, value in medians.items() if name.startswith("bare"))
    check = medians[f"port-check --train {n} (check_training)"]
    shown = bench_common.shown_command("benchmarks/port_check_train.py", argv)
    with bench_common.recorded(" ".join(["python", *shown]) if args.write else None):
        _print_table(shown, specs, args.repeats, times, medians, check / bare, bare)
    return 0


def _print_table(shown, specs, repeats, times, medians, ratio, bare) -> None:
    print(header("The port check through training against the bare trainings", shown))
    print(f"- factories: `{specs[0]}`, `{specs[1]}`; median of {repeats} interleaved rounds\n")
    print("| run | median s | min s | max s |\n|---|---:|---:|---:|")
    for name, values in times.items():
        print(f"| {name} | {medians[name]:.3f} | {min(values):.3f} | {max(values):.3f} |")
    print(f"| the three bare trainings together | {bare:.3f} | | |")
    print(f"\nratio: the check takes {ratio:.2f}x the three bare trainings (the limit: 3x)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
