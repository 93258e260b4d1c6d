"""Training benchmarks on the default config (H=4, D=32, T=12, V=64, batch 32): steady-state
steps per second of each project trainer against the usual ways of writing the loop (and of
the NumPy trainer against the framework trainers, in the same process), the default demo's
wall time from process start to exit, and the loss gaps between the trainers.

    python benchmarks/train.py            # the full tables (a few minutes on 2 cores)
    python benchmarks/train.py --quick    # small runs, seconds: checks that it all runs
    python benchmarks/train.py --only dp  # data parallel at dp = 1, 2 (its own process: JAX's devices)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import bench_common
from bench_common import interleaved, median, middle_half, ms, ratio, spread, table

from mhsa.flags import int_flag  # noqa: E402  (after bench_common puts the repository on sys.path)

TARGETS = {"torch": 1500, "jax": 2500, "numpy": 1000}  # steps/s


def _configs(quick, epochs=4, attn_impl="explicit"):
    """The default config; --quick keeps the model but trains 4-step epochs."""
    from shared.config import ModelConfig, TrainConfig

    return ModelConfig(attn_impl=attn_impl), TrainConfig(epochs=epochs, **({"n_sequences": 128} if quick else {}))


def _steps_per_s(values, steps):
    return [steps / seconds for seconds in values]


def project_epochs(backend, repeats, quick, attn_impl="explicit", **options):
    """Seconds per epoch of the project's own train(), epochs 2.. of one run (epoch 1 holds
    set-up and, in JAX, compilation), timed between the on_step calls that open each epoch;
    and the seconds from train() to epoch 1's first step report. options: train()'s own
    (compile=True), whose History is returned third."""
    from mhsa import registry

    trainer = registry.get(backend).train
    model_config, config = _configs(quick, epochs=repeats + 1, attn_impl=attn_impl)
    stamps = []

    def on_step(step, loss):
        if step % config.steps_per_epoch == 0:
            stamps.append(time.perf_counter())

    started = time.perf_counter()
    history = trainer.train(model_config, config, on_step=on_step, **options)
    return [b - a for a, b in zip(stamps, stamps[1:])], stamps[0] - started, history


# --- peers -----------------------------------------------------------------------------------


def torch_peers(quick):
    """name -> one epoch of 64 steps; each keeps its own model and optimizer."""
    import torch

    from shared import training
    from torch_impl.model import from_exchange
    from torch_impl.train import loss_fn

    model_config, train_config = _configs(quick)
    epochs = list(training.epochs(model_config, train_config))
    arrays = training.initial_weights("shared", model_config, train_config)

    def loop(sync, threads=None, **adam):
        model = from_exchange(arrays, model_config)
        optimizer = torch.optim.Adam(model.parameters(), lr=train_config.lr, betas=train_config.betas, eps=train_config.eps, **adam)
        counter = [0]

        def epoch():
            previous = torch.get_num_threads()
            if threads:
                torch.set_num_threads(threads)
            batches = epochs[counter[0] % len(epochs)]
            counter[0] += 1
            losses = []
            for x, y in batches:
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model, torch.from_numpy(x), torch.from_numpy(y))
                loss.backward()
                optimizer.step()
                losses.append(loss.item() if sync else loss.detach())
            result = losses if sync else torch.stack(losses).numpy()
            torch.set_num_threads(previous)
            return result

        return epoch

    peers = {
        "tutorial loop: Adam(), loss.item() every step": loop(sync=True),
        "tutorial loop on 1 thread": loop(sync=True, threads=1),
        "Adam(foreach=True), no host sync": loop(sync=False, foreach=True),
        "Adam(fused=True), no host sync": loop(sync=False, fused=True),
        "Adam(fused=True), no host sync, 1 thread": loop(sync=False, threads=1, fused=True),
    }
    return peers, len(epochs[0])


def jax_peers(quick):
    import jax
    import optax
    from flax import nnx

    from jax_impl.model import from_exchange
    from jax_impl.train import loss_fn, train_step
    from shared import training

    model_config, train_config = _configs(quick)
    epochs = list(training.epochs(model_config, train_config))
    arrays = training.initial_weights("shared", model_config, train_config)

    def fresh():
        model = from_exchange(arrays, model_config)
        tx = optax.adam(train_config.lr, *train_config.betas, eps=train_config.eps)
        return model, nnx.Optimizer(model, tx, wrt=nnx.Param)

    # the Flax tutorial's way: @nnx.jit on the modules themselves (graph mode), one call per step
    graph_model, graph_optimizer = fresh()

    @nnx.jit
    def graph_step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    # the project's train_step under jax.jit on nnx.split state, one call per step
    def split_step(graphdef, state, x, y):
        model, optimizer = nnx.merge(graphdef, state)
        loss = train_step(model, optimizer, x, y)
        return nnx.state((model, optimizer)), loss

    graphdef, state = nnx.split(fresh())
    jitted_step = jax.jit(split_step, static_argnums=0, donate_argnums=1)
    holder = {"state": state}
    counters = {"graph": 0, "split": 0}

    def graph_epoch():
        batches = epochs[counters["graph"] % len(epochs)]
        counters["graph"] += 1
        losses = [graph_step(graph_model, graph_optimizer, x, y) for x, y in batches]
        return jax.block_until_ready(losses)

    def split_epoch():
        batches = epochs[counters["split"] % len(epochs)]
        counters["split"] += 1
        losses = []
        for x, y in batches:
            holder["state"], loss = jitted_step(graphdef, holder["state"], x, y)
            losses.append(loss)
        return jax.block_until_ready(losses)

    return {
        "tutorial: @nnx.jit step (graph mode), one call per step": graph_epoch,
        "jax.jit(train_step) on nnx.split state, one call per step": split_epoch,
    }, len(epochs[0])


def _trainer_variants(backend, quick, with_compile):
    """label -> (torch threads or None, train() options) of the project trainer's rows."""
    from mhsa import registry

    entry = registry.get(backend)
    name = f"{entry.package}.train.train"
    label = (
        f"{name} (the project's trainer)"
        if entry.framework == "torch"
        else f"{name} (the project's trainer: a jax.lax.scan per 16 steps, each queued before the last is read)"
    )
    variants = {label: (None, {})}
    if entry.framework == "torch":  # XLA reads its threads once, at start: a one-thread JAX row would need a process of its own
        variants[f"{name} on 1 thread (--threads 1)"] = (1, {})
    if not quick:
        variants[f"{name} with ModelConfig(attn_impl='fused')"] = (None, {"attn_impl": "fused"})
    if "compile" in entry.supports and with_compile:
        variants[f"{name}(compile=True) (--compile: the whole step in one torch.compile graph, inductor)"] = (None, {"compile": True})
        variants[f"{name}(compile=True) on 1 thread (--compile --threads 1)"] = (1, {"compile": True})
    return variants


def speed_tables(repeats, quick, with_compile):
    """Steps/s of the usual loops and of the project trainer's variants. Their epochs are taken in
    rounds (3, or one with --quick or under 3 repeats): each round runs every loop interleaved,
    then each trainer variant once, so a slow or fast minute of a shared machine falls on all of
    them and not on one row."""
    sections = []
    rounds = [repeats // 3 + (index < repeats % 3) for index in range(3)] if repeats >= 3 and not quick else [repeats]
    for backend in ("torch", "jax"):
        peers, steps = (torch_peers if backend == "torch" else jax_peers)(quick)
        variants = _trainer_variants(backend, quick, with_compile)
        rows = {name: [] for name in [*peers, *variants]}
        notes = {}
        for count in rounds:
            times = interleaved(peers, count, warmup=1, warmup_s=0.0 if quick else 0.2)
            for name, values in times.items():
                rows[name] += _steps_per_s(values, steps)
            for label, (threads, options) in variants.items():
                with bench_common.torch_threads(threads):
                    epochs, first, history = project_epochs(backend, count, quick, **options)
                rows[label] += _steps_per_s(epochs, steps)
                if label == next(iter(variants)):
                    notes.setdefault("first", []).append(first)
                if history.compile_seconds is not None:
                    notes.setdefault("compile", []).append(f"{history.compile_seconds:.1f}" + (" (1 thread)" if threads == 1 else ""))
        lines = [
            f"the project's trainer: {notes['first'][0]:.2f} s from train() to the end of epoch 1 in its first run (set-up"
            + (", tracing and compilation; later runs in this process reuse the compiled steps)" if backend == "jax" else ")")
        ]
        if "compile" in notes:
            lines.append(
                "--compile: seconds of torch.compile before step 0, apart from the steps, run by run in this process: "
                + ", ".join(notes["compile"])
                + " (each run compiles its own step; inductor's cache on disk, across runs and processes, makes every "
                "compilation after the first on a machine shorter)"
            )
        baseline = median(rows[next(iter(peers))])
        target = TARGETS[backend]
        body = []
        for name, values in rows.items():
            value = median(values)
            low, high = middle_half(values)
            body.append([name, f"{value:,.0f}", f"{low:,.0f}-{high:,.0f}", f"{value / baseline:.2f}x", f"{value / target:.2f}x"])
        sections.append(
            f"### {backend}: steady-state training steps per second, default config "
            f"(median of {repeats} epochs of {steps} steps, in {len(rounds)} interleaved round{'s' * (len(rounds) > 1)})\n\n"
            + table(["loop", "steps/s", "middle half", "vs tutorial loop", f"vs target {target:,}"], body)
            + "\n\n"
            + "\n".join(f"- {line}" for line in lines)
        )
    return "\n\n".join(sections)


def numpy_table(repeats, quick):
    """numpy_ref's trainer (the backward pass by hand, Adam in NumPy) against the framework
    trainers, every epoch function interleaved in one process; then the project's train()."""
    from numpy_ref.adam import Adam
    from numpy_ref.model import from_exchange
    from numpy_ref.train import train_steps
    from shared import malloc, training
    from shared.config import TrainConfig

    model_config, train_config = _configs(quick)
    torch_loops, steps = torch_peers(quick)
    jax_loops, _ = jax_peers(quick)
    malloc.use("settled")

    def numpy_loop(dtype):
        config = TrainConfig(**{**train_config.to_dict(), "dtype": dtype, "betas": train_config.betas})
        epochs = list(training.epochs(model_config, config))
        model = from_exchange(training.initial_weights("shared", model_config, config), model_config)
        optimizer = Adam(model.params, lr=config.lr, betas=config.betas, eps=config.eps)
        counter = [0]

        def epoch():
            batches = epochs[counter[0] % len(epochs)]
            counter[0] += 1
            return train_steps(model, optimizer, batches)

        return epoch

    reference = "torch: Adam(fused=True), no host sync (the torch trainer's loop)"
    candidates = {
        "numpy_ref.train.train_steps, float32": numpy_loop("float32"),
        "numpy_ref.train.train_steps, float64": numpy_loop("float64"),
        reference: torch_loops["Adam(fused=True), no host sync"],
        "torch: tutorial loop, loss.item() every step": torch_loops["tutorial loop: Adam(), loss.item() every step"],
        "torch: Adam(fused=True), no host sync, 1 thread": torch_loops["Adam(fused=True), no host sync, 1 thread"],
        "jax: jax.jit(train_step), one call per step": jax_loops["jax.jit(train_step) on nnx.split state, one call per step"],
    }
    times = interleaved(candidates, repeats, warmup=1, warmup_s=0.0 if quick else 0.2)
    rows = {name: _steps_per_s(values, steps) for name, values in times.items()}
    project, first, _ = project_epochs("numpy", repeats, quick)
    rows["numpy_ref.train.train (the project's trainer), float32"] = _steps_per_s(project, steps)
    return numpy_section(rows, reference, repeats, steps, first)


def numpy_section(rows, reference, repeats, steps, first):
    target = TARGETS["numpy"]
    baseline = median(rows[reference])
    body = [
        [
            name,
            f"{median(values):,.0f}",
            "{:,.0f}-{:,.0f}".format(*middle_half(values)),
            f"{median(values) / baseline:.2f}x",
            f"{median(values) / target:.2f}x",
        ]
        for name, values in rows.items()
    ]
    return (
        f"### numpy: steady-state training steps per second against the framework loops, default config "
        f"(median of {repeats} epochs of {steps} steps, interleaved)\n\n"
        + table(["loop", "steps/s", "middle half", "vs torch's loop", f"vs target {target:,}"], body)
        + f"\n\n- the project's trainer: {first:.2f} s from train() to the end of epoch 1 (set-up)"
        + "\n- the numpy rows run with glibc keeping freed memory, as numpy_ref.train.train sets it"
        " (shared/malloc.py's \"settled\"); in this process torch's and JAX's imports have done so already"
    )


# --- the demo, process start to exit ---------------------------------------------------------


def demo_table(runs):
    """Each backend's default run against its framework's bare import and against the import of
    its trainer module (the framework and every library the run needs, e.g. flax and optax: the
    floor below which no run of that trainer can start), whole processes from start to exit,
    interleaved, `runs` times. The JAX command keeps its compiled programs on disk
    (mhsa.compile_cache), so it is timed twice per round: with that cache emptied first
    (a first run), and once more right after (every later run)."""
    from mhsa import registry

    commands = {}
    for backend in registry.names("train"):
        package, framework = registry.get(backend).package, registry.get(backend).framework
        run = [sys.executable, "-m", f"{package}.train", "--quiet"]
        commands[backend] = {
            "import": ([sys.executable, "-c", f"import {framework}"], f"`python -c 'import {framework}'`"),
            "modules": ([sys.executable, "-c", f"import {package}.train"], f"`python -c 'import {package}.train'`"),
            "run": (run, f"`python -m {package}.train --quiet`" + (", compilation cache empty" if framework == "jax" else "")),
        }
        if framework == "jax":
            commands[backend]["again"] = (run, "the same command again (its compiled programs read from the cache)")
    times = {(backend, kind): [] for backend, kinds in commands.items() for kind in kinds}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(bench_common.ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    with tempfile.TemporaryDirectory() as folder:
        env["XDG_CACHE_HOME"] = os.path.join(folder, "cache")  # the user's own cache is neither read nor written
        for _ in range(runs):
            for backend, kinds in commands.items():
                for kind, (argv, _) in kinds.items():
                    if kind == "run":
                        shutil.rmtree(env["XDG_CACHE_HOME"], ignore_errors=True)
                    started = time.perf_counter()
                    result = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True)
                    times[backend, kind].append(time.perf_counter() - started)
                    if result.returncode != 0:
                        raise RuntimeError(f"{backend} {kind} failed:\n{result.stderr}")
    rows = []
    for backend, kinds in commands.items():
        bare, modules = times[backend, "import"], times[backend, "modules"]
        for kind in kinds:
            if kind not in ("import", "modules"):
                run = times[backend, kind]
                cells = [kinds[kind][1], ms(median(run)), spread(run)]
                rows.append([*cells, ms(median(bare)), ratio(median(run), median(bare)), ms(median(modules)), ratio(median(run), median(modules))])
    return (
        f"### Start-up: the default run (imports, 3 epochs, compilation, the heatmap) against its framework's bare import "
        f"and against the import of its trainer module, process start to exit (median of {runs} runs each, interleaved)\n\n"
        + table(["run", "ms", "middle half", "bare import ms", "run / bare import", "its modules' import ms", "run / its modules' import"], rows)
        + "\n\n- bare import: `python -c 'import FRAMEWORK'` (numpy, torch, jax); its modules' import: `python -c 'import PACKAGE.train'`"
    )


# --- torch vs JAX trajectories ---------------------------------------------------------------


def gap_table(quick):
    import numpy as np

    from mhsa import registry
    from shared.config import ModelConfig, TrainConfig

    rows = []
    for dtype in ("float32",) if quick else ("float32", "float64"):  # float64 turns jax_enable_x64 on: last
        # --quick: the speed table's shapes, so JAX reuses its compiled epoch
        config = TrainConfig(dtype=dtype, **({"epochs": 1, "n_sequences": 128} if quick else {}))
        losses = {backend: np.asarray(registry.get(backend).train.train(ModelConfig(), config).losses) for backend in ("torch", "jax", "numpy")}
        gap = np.abs(losses["torch"] - losses["jax"])
        numpy_gap = np.abs(losses["numpy"] - losses["torch"])
        rows.append(
            [
                dtype,
                len(gap),
                f"{gap.max():.1e}",
                f"{int(gap.argmax())}",
                "1e-04" if dtype == "float32" else "1e-10",
                f"{numpy_gap.max():.1e}",
                f"{int(numpy_gap.argmax())}",
            ]
        )
    return "### Loss trajectories, torch against JAX and numpy against torch, every step of the default run\n\n" + table(
        ["dtype", "steps", "max abs gap", "at step", "DESIGN.md tolerance", "numpy vs torch", "at step"], rows
    )


# --- data parallel: the frameworks' own engines at dp = 1, 2 -------------------------------------


def dp_epochs(backend, dp, batch_size, repeats, quick):
    """Seconds per epoch (epochs 2.., as project_epochs) of train(..., dp=dp) at a global batch."""
    from mhsa import registry
    from shared.config import ModelConfig, TrainConfig

    steps = 8 if quick else 64
    config = TrainConfig(epochs=repeats + 1, batch_size=batch_size, n_sequences=steps * batch_size)
    stamps = []

    def on_step(step, loss):
        if step % config.steps_per_epoch == 0:
            stamps.append(time.perf_counter())

    # one torch thread per rank, as each DDP rank sets for itself: on 2 busy cores a dp=1 run with
    # 2 threads waits scheduler ticks at every parallel region and would flatter dp=2 (measured: 7 steps/s)
    chosen = registry.get(backend)
    with bench_common.torch_threads(1 if backend == "torch" else None):
        if dp == 1:  # the single-device trainer, as `--dp 1` runs it
            chosen.train.train(ModelConfig(), config, on_step=on_step)
        else:
            chosen.module("parallel").train(ModelConfig(), config, dp, on_step=on_step)
    return [b - a for a, b in zip(stamps, stamps[1:])], steps


def dp_table(repeats, quick):
    """steps/s at dp = 1, 2 for each backend and two global batches, and the overhead share: how
    much of a dp=2 step is not the dp=1 step on one shard (B/2), i.e. communication and waiting."""
    from mhsa import registry

    rows = []
    for backend in registry.names("dp"):
        for batch in (32, 256):
            speed = {}
            for label, dp, size in (("dp=1", 1, batch), ("dp=1, one shard", 1, batch // 2), ("dp=2", 2, batch)):
                seconds, steps = dp_epochs(backend, dp, size, repeats, quick)
                speed[label] = median(_steps_per_s(seconds, steps))
            overhead = 1 - speed["dp=2"] / speed["dp=1, one shard"]
            rows.append(
                [
                    backend,
                    str(batch),
                    f"{speed['dp=1']:,.0f}",
                    f"{speed['dp=2']:,.0f}",
                    f"{speed['dp=2'] / speed['dp=1']:.2f}x",
                    f"{speed['dp=1, one shard']:,.0f}",
                    f"{overhead:.0%}",
                ]
            )
    return (
        f"### Data parallel: steady-state steps/s at dp = 1 and 2 (global batch B, median of {repeats} epochs)\n\n"
        + table(["backend", "B", "dp=1", "dp=2", "dp=2 vs dp=1", "dp=1 on B/2 (one shard)", "dp=2 overhead share"], rows)
        + "\n\n- overhead share = 1 - (dp=2 steps/s) / (dp=1 steps/s on one shard of B/2): the part of a dp=2 step "
        "spent on the gradient all-reduce, the loss reduction and waiting for the slower rank "
        "(an upper bound: on 2 cores the two ranks also compete with each other)"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="4-step epochs, one torch thread, no demo runs, no torch.compile, float32 gap only: seconds"
    )
    parser.add_argument("--repeats", type=int_flag("--repeats"), default=None, help="epochs per median, in [1, 1000] (default 7, 3 with --quick)")
    parser.add_argument(
        "--demo-runs", type=int_flag("--demo-runs"), default=5, help="process runs of each command for the start-up table, in [1, 100] (default 5)"
    )
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile row")
    parser.add_argument("--only", choices=["speed", "numpy", "demo", "gap", "dp"], action="append", help="run only this table (repeatable)")
    bench_common.add_write_flag(parser)
    args = parser.parse_args(argv)
    if args.write and args.quick:
        parser.error("--write records the full tables; --quick's are too small to mean anything")
    if args.only == ["dp"]:  # JAX needs its 2 CPU devices before it starts (other tables run without)
        from mhsa.parity import data_parallel as dp_parity

        dp_parity.prepare(2)
    repeats = args.repeats or (3 if args.quick else 7)
    shown = bench_common.shown_command("benchmarks/train.py", argv if argv is not None else sys.argv[1:])
    with bench_common.recorded(" ".join(["python", *shown]) if args.write else None), bench_common.torch_threads(1 if args.quick else None):
        run(args, repeats, shown)
    return 0


def run(args, repeats, shown):
    parts = args.only or ["speed", "numpy", "demo", "gap"] + ([] if args.quick else ["dp"])
    print(bench_common.header("Training" + (" (--quick: too short to mean anything)" if args.quick else ""), shown))
    if "speed" in parts:
        print("\n" + speed_tables(repeats, args.quick, with_compile=not (args.quick or args.no_compile)), flush=True)
    if "numpy" in parts:
        print("\n" + numpy_table(repeats, args.quick), flush=True)
    if "demo" in parts:
        print("\n" + (demo_table(args.demo_runs) if not args.quick else "### The default demo\n\nskipped with --quick"), flush=True)
    if "dp" in parts:
        if args.only == ["dp"]:
            print("\n" + dp_table(repeats, args.quick), flush=True)
        else:  # its own process: the JAX device count is fixed when JAX starts
            command = [sys.executable, __file__, "--only", "dp", "--repeats", str(repeats)] + (["--quick"] if args.quick else [])
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:  # its own error, not only that it failed
                raise RuntimeError(f"{' '.join(command[1:])} exited {result.returncode}:\n{result.stderr[-4000:]}")
            output = result.stdout
            print("\n" + output[output.index("### ") :].rstrip(), flush=True)  # the table, without its header
    if "gap" in parts:
        print("\n" + gap_table(args.quick), flush=True)


if __name__ == "__main__":
    sys.exit(main())
