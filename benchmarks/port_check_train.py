"""`mhsa port-check --train N` against the trainings it runs, done bare: the reference in float32
(zero_grad, loss, backward, clip, step), the port in float32 (one compiled step: value_and_grad,
tx.update, apply_updates) and the reference in float64, N steps each. Issue 31 holds the check to
3x the three together. Interleaved: every round runs each candidate once, in a new order, each
from objects the factories built just before (not timed); the table gives the medians.

Usage: python benchmarks/port_check_train.py [TORCH_FACTORY FLAX_FACTORY] [--steps N] [--repeats R]

The factories are `--train` factories (package.module:function returning {model, optimizer,
loss, inputs, ...}); by default this script's own small Llama-style pair: token embedding,
2 decoder layers of RMSNorm, rotary causal attention and a SwiGLU MLP, a final RMSNorm and an
untied head, trained by AdamW with gradient clipping (torch's clip, optax.clip_by_global_norm).
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

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402
from torch import nn  # noqa: E402

from mhsa.port_check.factories import call_factory  # noqa: E402
from mhsa.port_check.train_check import check_setup, check_training  # noqa: E402

V, D, H, F, LAYERS, B, T, BATCHES = 61, 64, 4, 176, 2, 8, 16, 4


def _rotary(x, xp):
    """Rotary position embedding, rotate_half convention, on (B, H, T, d_head)."""
    d = x.shape[-1]
    inverse = 1.0 / (10000 ** (np.arange(0, d, 2) / d))
    angles = np.outer(np.arange(x.shape[-2]), inverse)  # (T, d_head / 2)
    cos, sin = (xp.asarray(np.concatenate([f(angles)] * 2, -1), dtype=x.dtype) for f in (np.cos, np.sin))
    half = d // 2
    rotated = xp.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class TorchLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm, self.mlp_norm = nn.RMSNorm(D, eps=1e-6), nn.RMSNorm(D, eps=1e-6)
        self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.gate, self.up, self.down = nn.Linear(D, F, bias=False), nn.Linear(D, F, bias=False), nn.Linear(F, D, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q, k, v = (proj(h).view(b, t, H, D // H).transpose(1, 2) for proj in (self.q, self.k, self.v))  # (B, H, T, d_head)
        q, k = _rotary(q, torch), _rotary(k, torch)
        scores = (q @ k.transpose(-1, -2)) / (D // H) ** 0.5
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        x = x + self.o((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, D))
        h = self.mlp_norm(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))


class TorchLlama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.layers = nn.ModuleList([TorchLayer() for _ in range(LAYERS)])
        self.norm, self.head = nn.RMSNorm(D, eps=1e-6), nn.Linear(D, V, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))  # (B, T, V)


class FlaxLayer(nnx.Module):
    def __init__(self, rngs):
        self.attn_norm, self.mlp_norm = nnx.RMSNorm(D, epsilon=1e-6, rngs=rngs), nnx.RMSNorm(D, epsilon=1e-6, rngs=rngs)
        self.q, self.k, self.v, self.o = (nnx.Linear(D, D, use_bias=False, rngs=rngs) for _ in range(4))
        self.gate, self.up = nnx.Linear(D, F, use_bias=False, rngs=rngs), nnx.Linear(D, F, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(F, D, use_bias=False, rngs=rngs)

    def __call__(self, x):
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q, k, v = (proj(h).reshape(b, t, H, D // H).swapaxes(1, 2) for proj in (self.q, self.k, self.v))  # (B, H, T, d_head)
        q, k = _rotary(q, jnp), _rotary(k, jnp)
        scores = (q @ k.swapaxes(-1, -2)) / (D // H) ** 0.5
        scores = jnp.where(jnp.triu(jnp.ones((t, t), bool), 1), -jnp.inf, scores)
        x = x + self.o((jax.nn.softmax(scores, -1) @ v).swapaxes(1, 2).reshape(b, t, D))
        h = self.mlp_norm(x)
        return x + self.down(jax.nn.silu(self.gate(h)) * self.up(h))


class FlaxLlama(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Embed(V, D, rngs=rngs)
        self.layers = nnx.List([FlaxLayer(rngs) for _ in range(LAYERS)])
        self.norm, self.head = nnx.RMSNorm(D, epsilon=1e-6, rngs=rngs), nnx.Linear(D, V, use_bias=False, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))  # (B, T, V)


def _batches() -> list[tuple[np.ndarray]]:
    rng = np.random.default_rng(0)
    return [(rng.integers(0, V, (B, T)),) for _ in range(BATCHES)]


def torch_factory():
    """The reference: AdamW(lr 1e-3, betas (0.9, 0.95), weight decay 0.1), gradients clipped to norm 1."""
    torch.manual_seed(0)
    model = TorchLlama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)

    def loss(logits, tokens):  # next-token cross-entropy
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1))

    return {"model": model, "optimizer": optimizer, "loss": loss, "inputs": _batches(), "clip": 1.0}


def flax_factory():
    """The port, with the same optimizer in optax."""

    def loss(logits, tokens):
        return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()

    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, b1=0.9, b2=0.95, weight_decay=0.1))
    return {"model": FlaxLlama(nnx.Rngs(0)), "optimizer": tx, "loss": loss, "inputs": _batches()}


def bare_torch(setup: dict, steps: int, dtype=None) -> None:
    """The user's own loop; dtype=torch.float64: on float64 copies of the model and its optimizer."""
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
    parser.add_argument("factories", nargs="*", metavar="FACTORY", help="TORCH_FACTORY FLAX_FACTORY (default: this script's Llama-style pair)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch's threads for every candidate (default: torch's own choice)")
    bench_common.add_write_flag(parser)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if len(args.factories) not in (0, 2):
        parser.error("give both factories, or neither")
    specs = args.factories or ["port_check_train:torch_factory", "port_check_train:flax_factory"]

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
    print(f"\nratio: the check takes {ratio:.2f}x the three bare trainings (issue 31's limit: 3x)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
