"""The train command line, shared by `python -m torch_impl.train`, `python -m jax_impl.train`
and `mhsa train --backend ...`: identical flags, output lines, heatmap and history file.
The backend is imported only after the flags are parsed, so `--help` loads no framework."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from shared import adam_state, checks, weights
from shared.config import DTYPES, ModelConfig, TrainConfig
from shared.tools import registry
from shared.tools.heatmap import ascii_heatmap
from shared.training import INITS, NonFiniteLossError, RankFailedError

BACKENDS = ("torch", "jax")
MODEL_FLAGS = {"vocab_size": "--vocab-size", "d_model": "--d-model", "n_heads": "--n-heads", "max_len": "--seq-len"}


def int_at_least(minimum: int, description: str):
    """An argparse type: an int >= minimum, else an argparse-style error naming the value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {description}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {description}, got {value}")
        return value

    parse.__name__ = description.removeprefix("a ").replace(" ", "_").replace("-", "_")  # argparse names it in errors
    return parse


positive_int = int_at_least(1, "a positive integer")
non_negative_int = int_at_least(0, "a non-negative integer")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text}")
    return value


def png_path(text: str) -> Path:
    if not text.lower().endswith(".png"):
        raise argparse.ArgumentTypeError(f"expected a file name ending in .png, got {text!r}")
    return Path(text)


def add_arguments(parser: argparse.ArgumentParser, backend: str | None = None) -> None:
    defaults_model, defaults_train = ModelConfig(), TrainConfig()
    if backend is None:
        parser.add_argument("--backend", choices=registry.names("train"), required=True, help="which implementation trains")
    model = parser.add_argument_group("model (defaults: the lesson's H=4, D=32, T=12, V=64)")
    model.add_argument("--n-heads", type=positive_int, help=f"attention heads H (default {defaults_model.n_heads})")
    model.add_argument("--d-model", type=positive_int, help=f"model width D (default {defaults_model.d_model})")
    model.add_argument("--seq-len", type=positive_int, help=f"context length T = max_len (default {defaults_model.max_len})")
    model.add_argument("--vocab-size", type=positive_int, help=f"vocabulary size V (default {defaults_model.vocab_size})")
    run = parser.add_argument_group("training")
    run.add_argument("--epochs", type=positive_int, default=defaults_train.epochs, help="passes over the data (default 3)")
    run.add_argument("--batch-size", type=positive_int, default=defaults_train.batch_size, help="sequences per step (default 32)")
    run.add_argument("--n-sequences", type=positive_int, default=defaults_train.n_sequences, help="copy-task rows (default 2048)")
    run.add_argument("--lr", type=positive_float, default=defaults_train.lr, help="Adam learning rate (default 0.01)")
    run.add_argument("--seed", type=non_negative_int, default=defaults_train.seed, help="data, shuffling and init seed (default 0)")
    run.add_argument("--dtype", choices=DTYPES, default=defaults_train.dtype, help="float32 (default) or float64 everywhere")
    run.add_argument("--dp", type=positive_int, default=1,
                     help="data parallel: split every batch over N ranks (torch) or devices (jax) (default 1)")
    run.add_argument("--init", choices=INITS, default="shared",
                     help="shared: NumPy init identical for every backend (default); native: the framework's own")
    files = parser.add_argument_group("files")
    files.add_argument("--load", metavar="FILE", type=Path, help="start from a saved .safetensors weights file")
    files.add_argument("--resume", metavar="FILE", type=Path,
                       help="continue a run saved with --save (weights and FILE's .adam.safetensors companion), "
                            "in either backend; --epochs is the total")
    files.add_argument("--save", metavar="FILE", type=Path,
                       help="write the trained weights (exchange format) and Adam's state beside them (.adam.safetensors)")
    files.add_argument("--history", metavar="FILE.json", type=Path, help="write every step's loss as JSON")
    files.add_argument("--plot", metavar="FILE.png", type=png_path,
                       help="write a figure: the loss curve and every head's attention weights")
    show = parser.add_argument_group("output")
    show.add_argument("--heatmap-head", type=non_negative_int, default=0, help="which head's weights to draw (default 0)")
    show.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(parser=parser)


def configs(args) -> tuple[ModelConfig, TrainConfig, object]:
    """Build the configs from the flags; with --load the file's config is used and any model
    flag given must agree with it. Raises ValueError with a message for the user."""
    given = {field: getattr(args, flag[2:].replace("-", "_")) for field, flag in MODEL_FLAGS.items()}
    given = {field: value for field, value in given.items() if value is not None}
    if args.load is not None and args.resume is not None:
        raise ValueError("--load starts from saved weights with a fresh optimizer, --resume continues a run: give one")
    source = args.load if args.load is not None else args.resume
    if source is not None:
        if args.init != "shared":
            raise ValueError(f"--{'load' if args.load else 'resume'} and --init {args.init} both choose the initial weights; give one")
        _, saved = weights.load(source)
        disagree = [f"{MODEL_FLAGS[field]} {value} (file has {getattr(saved, field)})"
                    for field, value in given.items() if getattr(saved, field) != value]
        if disagree:
            raise ValueError(f"weights file {str(source)!r} disagrees with {', '.join(disagree)}")
        model_config, init = saved, source
    else:
        model_config, init = ModelConfig(**given), args.init
    train_config = TrainConfig(
        epochs=args.epochs, batch_size=args.batch_size, n_sequences=args.n_sequences,
        lr=args.lr, seed=args.seed, dtype=args.dtype,
    )
    if args.heatmap_head >= model_config.n_heads:
        raise ValueError(f"--heatmap-head {args.heatmap_head} is out of range: the model has {model_config.n_heads} heads (0..{model_config.n_heads - 1})")
    # an output the run cannot write is refused now, not after the training it would lose
    for flag in ("--save", "--history", "--plot"):
        if getattr(args, flag[2:]) is not None:
            checks.check_writable(getattr(args, flag[2:]), flag)
    return model_config, train_config, init


def describe(model_config: ModelConfig, train_config: TrainConfig, init) -> str:
    m, t = model_config, train_config
    return (
        f"model  vocab_size={m.vocab_size} d_model={m.d_model} n_heads={m.n_heads} (d_head={m.d_head}) "
        f"max_len={m.max_len} bias={m.bias}\n"
        f"train  epochs={t.epochs} batch_size={t.batch_size} n_sequences={t.n_sequences} "
        f"({t.steps_per_epoch} steps/epoch) lr={t.lr:g} betas=({t.betas[0]:g}, {t.betas[1]:g}) eps={t.eps:g} "
        f"seed={t.seed} dtype={t.dtype} init={init}"
    )


def heatmap_tokens(model_config: ModelConfig) -> np.ndarray:
    """A short copy-task row to draw the heads on: one id repeated over the context (up to 12)."""
    return np.full((1, min(model_config.max_len, 12)), 7 % model_config.vocab_size, dtype=np.int64)


def run(args) -> int:
    parser = args.parser
    try:
        model_config, train_config, init = configs(args)
        resume = None
        if args.resume is not None:
            resume = adam_state.load(adam_state.companion_path(args.resume), model_config)
            resume.check_continues(train_config)
    except (ValueError, TypeError, FileNotFoundError) as error:
        parser.error(str(error))
    backend = registry.get(args.backend)
    if args.dp > 1:  # before the framework starts: JAX fixes its CPU device count then
        if "dp" not in backend.supports:
            parser.error(f"--dp {args.dp}: the {args.backend} backend has no data-parallel trainer")
        backend.module("parallel").prepare(args.dp)
    trainer, model_module = backend.train, backend.model
    print(f"backend {args.backend}")
    print(describe(model_config, train_config, init) + (f" dp={args.dp}" if args.dp > 1 else ""), flush=True)

    total = train_config.epochs * train_config.steps_per_epoch
    if resume is not None:
        print(f"resume after epoch {resume.epochs_done} (step {resume.step}) of a saved run")
    bar = tqdm(total=total, initial=0 if resume is None else resume.step, desc="train", unit="step", file=sys.stderr, leave=False,
               disable=args.quiet or not sys.stderr.isatty())
    epoch_sum = [0.0]

    def on_step(step: int, loss: float) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        epoch_sum[0] += loss
        end_of_epoch = (step + 1) % train_config.steps_per_epoch == 0 or step + 1 == total
        if end_of_epoch:
            epoch = step // train_config.steps_per_epoch + 1
            steps = step % train_config.steps_per_epoch + 1
            bar.write(f"epoch {epoch}/{train_config.epochs}  mean loss {epoch_sum[0] / steps:.6g}", file=sys.stdout)
            epoch_sum[0] = 0.0

    try:
        history = trainer.train(model_config, train_config, init=init, on_step=on_step, resume=resume,
                                **({"dp": args.dp} if args.dp > 1 else {}))
    except (NonFiniteLossError, RankFailedError) as error:
        bar.close()
        print(f"error: {error}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, FileNotFoundError) as error:
        bar.close()
        print(f"error: {error}", file=sys.stderr)
        return 1
    bar.close()
    print(f"final loss {history.final_loss:.6g} (step {history.first_step + len(history.losses) - 1}) · "
          f"{len(history.losses)} steps in {history.seconds:.2f} s, start-up and compilation included")

    tokens = heatmap_tokens(model_config)
    _, attention = model_module.predict(history.model, tokens, return_weights=True)
    head = args.heatmap_head
    print()
    print(ascii_heatmap(attention[0, head], tokens=tokens[0].tolist(),
                        title=f"{args.backend} · head {head} of {model_config.n_heads} · attention weights on a copy-task row"))

    if args.plot is not None:
        from shared.tools.plots import save_figure, training_figure

        title = f"{args.backend} · {model_config.n_heads} heads · D={model_config.d_model} T={model_config.max_len} V={model_config.vocab_size}"
        figure = training_figure(history.losses, train_config.steps_per_epoch, attention[0], tokens=tokens[0].tolist(), title=title)
        save_figure(figure, args.plot)
        print(f"saved plot to {args.plot}")
    if args.save is not None:
        weights.save(args.save, model_module.to_exchange(history.model), model_config)
        companion = adam_state.companion_path(args.save)
        adam_state.save(companion, trainer.optimizer_to_exchange(history.optimizer, history.model, train_config), model_config)
        print(f"saved weights to {args.save} (Adam's state to {companion})")
    if args.history is not None:
        history.save(args.history)
        print(f"saved history to {args.history}")
    return 0


def main(backend: str, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {registry.get(backend).package}.train",
        description=f"Train TinyLM on the copy task with the {backend} backend.",
    )
    add_arguments(parser, backend)
    args = parser.parse_args(argv)
    args.backend = backend
    from shared.tools.cli import run_guarded

    return run_guarded(run, args, prefix="error")
