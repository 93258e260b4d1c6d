"""What a training run prints and writes, for mhsa.train_cli: the note before a compilation, the
final line and the heatmap, the figure, the checkpoint and the history, and what Ctrl-C leaves
on disk, said in one line: during training, the last complete epoch (mhsa.epoch_keeper) where
--save asks for it; after the last step, the run's checkpoint and history where asked."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mhsa import registry
from mhsa.cli import hold_further_interrupts, interrupt_status, interruption
from mhsa.epoch_keeper import EpochKeeper
from mhsa.exit_status import TROUBLE
from mhsa.heatmap import ascii_heatmap
from shared import checkpoint, weights
from shared.adam_state import companion_path
from shared.config import ModelConfig
from shared.history import History
from shared.training import epoch_means
from shared.words import plural

if TYPE_CHECKING:
    from mhsa.train_cli import Plan, Progress


TEXT_POSITIONS, FIGURE_POSITIONS = 12, 64  # the most positions a terminal heatmap, and a figure, shows


def heatmap_tokens(model_config: ModelConfig, limit: int = TEXT_POSITIONS) -> np.ndarray:
    """A copy-task row to draw the heads on: one id repeated over the context, at most `limit` long."""
    return np.full((1, min(model_config.max_len, limit)), 7 % model_config.vocab_size, dtype=np.int64)


def row_note(shown: int, max_len: int) -> str:
    """What a title says about the row drawn: the whole context, or where it was cut."""
    return "a copy-task row" if shown == max_len else f"the first {shown} of {max_len} positions of a copy-task row"


def with_start(history: History, plan: Plan) -> History:
    """The history, with where its run started: the shared or native init, or the file it read."""
    if isinstance(plan.init, weights.Loaded):
        history.init, history.source, history.source_sha256 = "file", str(plan.init.path), plan.init.digest
    else:
        history.init = str(plan.init)  # "shared" or "native"
    return history


def keep_on_interrupt(args, plan: Plan, progress: Progress, keeper: EpochKeeper | None) -> int:
    """Ctrl-C or SIGTERM during training: with --save, the last complete epoch saved as a bound pair
    (and its history with --history), whatever signal comes next; one line on stderr saying what
    is on disk; 130 (Ctrl-C) or 143 (SIGTERM)."""
    train_config = plan.train_config
    where = f"{interruption()} in epoch {progress.epoch}/{train_config.epochs}"
    kept = keeper.last_complete() if keeper is not None else None
    if kept is None:
        reason = (
            "" if args.save is None else " (no epoch was complete)" if keeper is not None else " (this trainer hands over its model only at the end)"
        )
        saves = args.save is not None or args.history is not None or args.plot is not None
        print(f"{where}: nothing was saved{reason}" if saves else interruption(), file=sys.stderr)
        return interrupt_status()
    step = kept.epochs_done * train_config.steps_per_epoch
    pair, saved = f"{args.save} and {companion_path(args.save)}", []
    try:  # further Ctrl-Cs are ignored now (hold_further_interrupts), or held until a pair is renamed
        try:
            checkpoint.save(args.save, kept.arrays, kept.state, plan.model_config)
        except checkpoint.SavedThenInterrupted:  # held until the pair was whole
            pass
        saved.append(pair)
        if args.history is not None:
            losses = progress.losses[: step - progress.first_step]
            seconds = time.perf_counter() - progress.started
            part = History(
                args.backend, plan.model_config, train_config, losses, epoch_means(losses, train_config), seconds, first_step=progress.first_step
            )
            with_start(part, plan).save(args.history)
            saved.append(f"its history to {args.history}")
    except OSError as error:  # a full disk: said, with what is on disk
        if not saved:
            print(f"{where}: epoch {kept.epochs_done} could not be saved: {error}", file=sys.stderr)
            return interrupt_status()
        failed = f"; its history was not written: {error}"
    else:
        failed = ""
    print(f"{where}: saved epoch {kept.epochs_done} (step {step}) to {', '.join(saved)} (--resume {args.save} continues it){failed}", file=sys.stderr)
    return interrupt_status()


def seconds_since_process_start() -> float | None:
    """Wall-clock seconds since this process started (Linux: /proc/self/stat's start time, in
    clock ticks since boot, against CLOCK_BOOTTIME); None where neither exists."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        return time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of proc(5)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# the seconds the note tells a user to expect from torch.compile of the default model's whole step,
# with inductor's cache empty and in a later process that reads it: the order of the compile times
# that benchmarks/RESULTS.md's torch training table records ("--compile: seconds of torch.compile")
COMPILE_SECONDS_COLD, COMPILE_SECONDS_WARM = 20, 3


def inductor_cache() -> Path:
    """Where torch's inductor keeps what it compiled: TORCHINDUCTOR_CACHE_DIR, or its default
    (torch._inductor.runtime.cache_dir_utils, read here without importing torch's compiler)."""
    import getpass
    import re
    import tempfile

    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def compile_note() -> str:
    """What --compile does before step 0, and roughly for how long: a first compilation against
    one that reads inductor's cache."""
    folder = inductor_cache()
    try:
        empty = not any(folder.iterdir())
    except OSError:  # absent, or unreadable: nothing of it can be reused
        empty = True
    if empty:
        return f"torch.compile: compiling the whole step before step 0, about {COMPILE_SECONDS_COLD} s (inductor's cache {folder} is empty)"
    return (
        f"torch.compile: compiling the whole step before step 0, about {COMPILE_SECONDS_WARM} s if inductor's cache "
        f"{folder} holds this model's step, up to about {COMPILE_SECONDS_COLD} s if not"
    )


def final_line(history) -> str:
    """The run's result and what its seconds measure: the trainer's own time, from its start
    (model set-up, compilation and every step), and the process's, from its start."""
    steps = len(history.losses)
    line = (
        f"final loss {history.final_loss:.6g} (step {history.first_step + steps - 1}) · "
        f"{plural(steps, 'step')} in {history.seconds:.2f} s of training (set-up and compilation included"
        + (f"; torch.compile before step {history.first_step}: {history.compile_seconds:.2f} s" if history.compile_seconds is not None else "")
        + ")"
    )
    elapsed = seconds_since_process_start()
    return line + (f" · {elapsed:.2f} s since the process started" if elapsed is not None else "")


def show_result(args, plan: Plan, backend: registry.Backend, history) -> None:
    """The final line, and (not with --quiet) one head's attention weights on a copy-task row."""
    model_config = plan.model_config
    print(final_line(history), flush=args.quiet)
    if args.quiet:
        return
    tokens = heatmap_tokens(model_config)
    _, attention = backend.model.predict(history.model, tokens, return_weights=True)
    head = args.heatmap_head
    print()
    print(
        ascii_heatmap(
            attention[0, head],
            tokens=tokens[0].tolist(),
            title=f"{args.backend} · head {head} of {model_config.n_heads} · attention weights on {row_note(tokens.shape[1], model_config.max_len)}",
        )
    )


def save_plot(args, plan: Plan, backend: registry.Backend, history) -> None:
    """--plot: the loss curve and every head on a copy-task row of up to FIGURE_POSITIONS."""
    from mhsa.plots import save_figure, training_figure

    model_config, train_config = plan.model_config, plan.train_config
    tokens = heatmap_tokens(model_config, FIGURE_POSITIONS)
    _, attention = backend.model.predict(history.model, tokens, return_weights=True)
    title = (
        f"{args.backend} · {args.history or args.save or 'this run'} · {train_config.dtype} · "
        f"{plural(model_config.n_heads, 'head')} · D={model_config.d_model} T={model_config.max_len} V={model_config.vocab_size}"
        + ("" if tokens.shape[1] == model_config.max_len else f" · heads on {row_note(tokens.shape[1], model_config.max_len)}")
    )
    figure = training_figure(
        history.losses, train_config.steps_per_epoch, attention[0], tokens=tokens[0].tolist(), title=title, first_step=history.first_step
    )
    save_figure(figure, args.plot)


def finish(args, plan: Plan, backend: registry.Backend, history) -> int:
    """The result shown, then --plot, --save and --history, in that order (a line for each, not
    with --quiet); 0. A Ctrl-C meanwhile lands once the file being written is whole; the run is
    complete, so its checkpoint and history are still written (interrupted_after_training); 130 (143 for SIGTERM)."""
    say = (lambda line: None) if args.quiet else print
    planned = outputs(args, plan, backend, history)
    written: list[str] = []
    try:
        show_result(args, plan, backend, history)
    except KeyboardInterrupt:
        hold_further_interrupts()
        return interrupted_after_training(args, written, planned)
    for index, (name, line, write) in enumerate(planned):
        try:
            with checkpoint.deferred_interrupt():
                write()
        except KeyboardInterrupt:  # held until the file was whole
            hold_further_interrupts()
            return interrupted_after_training(args, [*written, name], planned[index + 1 :])
        except OSError as error:  # a full disk: what is on disk, in one line
            print(f"{args.parser.prog}: error: {error}" + (f"; written before it: {', '.join(written)}" if written else ""), file=sys.stderr)
            return TROUBLE
        written.append(name)
        say(line)
    return 0


def outputs(args, plan: Plan, backend: registry.Backend, history) -> list[tuple[str, str, Callable[[], object]]]:
    """The files the run writes, in order: (what a message calls it, the line saying it was written, the write)."""
    planned: list[tuple[str, str, Callable[[], object]]] = []
    if args.plot is not None:
        planned.append((str(args.plot), f"saved plot to {args.plot}", lambda: save_plot(args, plan, backend, history)))
    if args.save is not None:
        companion = companion_path(args.save)
        planned.append(
            (
                f"{args.save} and {companion}",
                f"saved weights to {args.save} (Adam's state to {companion})",
                lambda: save_checkpoint(args, plan, backend, history),
            )
        )
    if args.history is not None:
        planned.append((str(args.history), f"saved history to {args.history}", lambda: history.save(args.history)))
    return planned


def save_checkpoint(args, plan: Plan, backend: registry.Backend, history) -> Path:
    """--save: the trained weights and Adam's state as a bound pair; returns the companion's path."""
    state = backend.train.optimizer_to_exchange(history.optimizer, history.model, plan.train_config)
    return checkpoint.save(args.save, backend.model.to_exchange(history.model), state, plan.model_config)


def interrupted_after_training(args, written: list[str], rest: list[tuple[str, str, Callable[[], object]]]) -> int:
    """Ctrl-C after the last step: the checkpoint and history among `rest` are written now, the
    run being complete, whatever Ctrl-C comes next (hold_further_interrupts); the figure is left
    out. One line says what is on disk; 130 (143 for SIGTERM)."""
    left = [name for name, _, _ in rest]
    for name, _, write in rest:
        if args.plot is not None and name == str(args.plot):
            continue
        try:
            write()
        except checkpoint.SavedThenInterrupted:  # held until the pair was whole
            pass
        except OSError:  # said below: not written
            break
        written.append(name)
    not_written = [name for name in left if name not in written]
    if not written and not not_written:
        print(interruption(), file=sys.stderr)
    else:
        print(
            f"{interruption()} after training: "
            + (f"saved {', '.join(written)}" if written else "nothing was saved")
            + (f"; not written: {', '.join(not_written)}" if written and not_written else ""),
            file=sys.stderr,
        )
    return interrupt_status()
