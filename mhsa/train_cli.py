"""The train command line, shared by `python -m torch_impl.train`, `python -m jax_impl.train`
and `mhsa train --backend ...`: identical flags, output lines, heatmap and history file.
The backend is imported only after the flags are parsed, so `--help` loads no framework.

Over 300 lines on purpose: the flags, their checks against each other and against the files
(every combination refused with exit 2 before the banner), and the run they describe are one
command, read top to bottom; what the run prints and writes at its end, or on Ctrl-C, is
mhsa.train_outputs'.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from pathlib import Path

from tqdm import tqdm

from mhsa import registry
from mhsa.cli import hold_further_interrupts
from mhsa.epoch_keeper import EpochKeeper, has_on_epoch
from mhsa.exit_status import TROUBLE
from mhsa.flags import MODEL_FLAGS, add_model_arguments, int_flag, model_flags_given, png_path, positive_float
from mhsa.threads import add_threads_argument, apply_threads, default_train_threads
from mhsa.train_outputs import compile_note, finish, keep_on_interrupt, with_start
from shared import checkpoint, checks, weights
from shared.adam_state import AdamState, companion_path
from shared.config import DTYPES, ModelConfig, TrainConfig
from shared.training import DEVICES, INITS, NonFiniteLossError, RankFailedError, check_data_parallel, check_device
from shared.words import plural


def add_arguments(parser: argparse.ArgumentParser, backend: str | None = None) -> None:
    add_threads_argument(parser, default="1 for a model and batch as small as the lesson's, each library's own for large ones")
    defaults_train = TrainConfig()
    if backend is None:
        parser.add_argument("--backend", choices=registry.names("train"), required=True, help="which implementation trains")
    add_model_arguments(parser, "model (defaults: the lesson's H=4, D=32, T=12, V=64)", defaults=False)
    run = parser.add_argument_group("training")
    run.add_argument(
        "--epochs",
        type=int_flag("--epochs"),
        default=defaults_train.epochs,
        help="passes over the data, in [1, 1000000]; with --resume the total (default 3)",
    )
    run.add_argument(
        "--batch-size", type=int_flag("--batch-size"), default=defaults_train.batch_size, help="sequences per step, in [1, 1048576] (default 32)"
    )
    run.add_argument(
        "--n-sequences", type=int_flag("--n-sequences"), default=defaults_train.n_sequences, help="copy-task rows, in [1, 2147483647] (default 2048)"
    )
    run.add_argument("--lr", type=positive_float, help="Adam learning rate (default 0.01; --resume: the saved run's)")
    run.add_argument(
        "--seed", type=int_flag("--seed"), default=defaults_train.seed, help="data, shuffling and init seed, in [0, 2**32 - 1] (default 0)"
    )
    run.add_argument("--dtype", choices=DTYPES, default=defaults_train.dtype, help="float32 (default) or float64 everywhere")
    run.add_argument(
        "--dp", type=int_flag("--dp"), default=1, help="data parallel: split every batch over N ranks or devices, in [1, 64] (default 1: one device)"
    )
    run.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="where the torch or jax run computes: cpu (default) or cuda (a GPU the framework sees; not numpy, not with --dp)",
    )
    run.add_argument(
        "--full-precision",
        action="store_true",
        help="float32 matmuls at full precision (TF32 off), as mhsa parity sets them: for runs compared across backends on a GPU",
    )
    run.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the whole step (forward, backward, Adam) before the first one (torch; not with --dp): "
        "faster steps, seconds of compilation first (reported apart; inductor caches them across processes): pays on long runs",
    )
    run.add_argument(
        "--no-jax-cache",
        action="store_true",
        help="jax: compile afresh instead of keeping the compiled programs in JAX's persistent compilation cache "
        "(default: on, in $XDG_CACHE_HOME/mhsa/jax or ~/.cache/mhsa/jax, as mhsa parity; a second run starts faster)",
    )
    run.add_argument(
        "--init",
        choices=INITS,
        default="shared",
        help="shared: NumPy init identical for every backend (default); native: the framework layers' own (not numpy)",
    )
    files = parser.add_argument_group("files")
    files.add_argument("--load", metavar="FILE", type=Path, help="start from a saved .safetensors weights file")
    files.add_argument(
        "--resume",
        metavar="FILE",
        type=Path,
        help="continue a run saved with --save (weights and FILE's .adam.safetensors companion), in either backend; --epochs is the total",
    )
    files.add_argument(
        "--save", metavar="FILE", type=Path, help="write the trained weights (exchange format) and Adam's state beside them (.adam.safetensors)"
    )
    files.add_argument("--history", metavar="FILE.json", type=Path, help="write every step's loss as JSON")
    files.add_argument("--plot", metavar="FILE.png", type=png_path, help="write a figure: the loss curve and every head's attention weights")
    show = parser.add_argument_group("output")
    show.add_argument("--heatmap-head", type=int_flag("--heatmap-head"), default=0, help="which head's weights to draw (default 0)")
    show.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(parser=parser)


class FileUnusable(ValueError):
    """A file the flags name cannot be used (missing, cut short, another format): one line, no usage."""


@dataclasses.dataclass
class Plan:
    """What a run will do, decided and checked before any work: every file read once."""

    model_config: ModelConfig
    train_config: TrainConfig
    init: object  # "shared", "native", or the weights.Loaded of --load/--resume
    resume: AdamState | None = None  # the AdamState of --resume
    overridden: tuple[str, ...] = ()  # optimizer settings a flag changed from the resumed run's


def configs(args) -> Plan:
    """Build the configs from the flags; with --load/--resume the file's config is used and
    any model flag given must agree with it (--attn-impl only picks a kernel and may differ).
    Every input is read once here, every output checked against the inputs and each other.
    Raises ValueError with a message for the user."""
    given = model_flags_given(args)
    if args.load is not None and args.resume is not None:
        raise ValueError("--load starts from saved weights with a fresh optimizer, --resume continues a run: give one")
    source = args.load if args.load is not None else args.resume
    flag = "--load" if args.load is not None else "--resume"
    inputs = {flag: source, "the Adam companion of --resume": companion_path(args.resume) if args.resume else None}
    outputs = {
        "--save": args.save,
        "the Adam companion of --save": companion_path(args.save) if args.save else None,
        "--history": args.history,
        "--plot": args.plot,
    }
    checks.check_outputs(inputs, outputs)
    resume: AdamState | None = None
    overridden: tuple[str, ...] = ()
    if source is not None:
        if args.init != "shared":
            raise ValueError(f"{flag} and --init {args.init} both choose the initial weights; give one")
        try:  # the file itself: missing, cut short, of another format, holding NaN
            if args.resume is not None:
                loaded, resume = checkpoint.load(source)
            else:
                loaded = weights.read(source)
            weights.check_finite(loaded.arrays, f"weights file {str(source)!r}")
            if resume is not None:
                moments = {f"{moment}/{name}": value for moment in ("exp_avg", "exp_avg_sq") for name, value in getattr(resume, moment).items()}
                weights.check_finite(moments, f"Adam state file {str(companion_path(source))!r}")
        except (ValueError, TypeError, OSError) as error:
            raise FileUnusable(str(error)) from None
        saved = loaded.config
        disagree = [
            f"{MODEL_FLAGS[field]} {value} (file has {getattr(saved, field)})"
            for field, value in given.items()
            if field in MODEL_FLAGS and getattr(saved, field) != value
        ]
        if disagree:
            raise ValueError(f"weights file {str(source)!r} disagrees with {', '.join(disagree)}")
        if loaded.dtype != args.dtype:
            raise ValueError(f"weights file {str(source)!r} is {loaded.dtype} and this run trains in {args.dtype}; add --dtype {loaded.dtype}")
        model_config = dataclasses.replace(saved, attn_impl=given.get("attn_impl", saved.attn_impl))
        init = loaded
    else:
        model_config, init = ModelConfig(**given), args.init
    lr, betas, eps = TrainConfig.lr, TrainConfig.betas, TrainConfig.eps
    if resume is not None:  # the saved run's optimizer settings continue unless a flag overrides them
        saved_train = resume.train_config
        lr, betas, eps = saved_train.lr, saved_train.betas, saved_train.eps
        if args.lr is not None and args.lr != saved_train.lr:
            overridden = (f"lr={args.lr:g} (saved run: {saved_train.lr:g})",)
    if args.lr is not None:
        lr = args.lr
    train_config = TrainConfig(
        epochs=args.epochs, batch_size=args.batch_size, n_sequences=args.n_sequences, seed=args.seed, dtype=args.dtype, lr=lr, betas=betas, eps=eps
    )
    if resume is not None:
        resume.check_continues(train_config)
    if args.heatmap_head >= model_config.n_heads:
        raise ValueError(
            f"--heatmap-head {args.heatmap_head} is out of range: the model has {model_config.n_heads} heads (0..{model_config.n_heads - 1})"
        )
    m, t = model_config, train_config
    checks.check_training_fits(m.vocab_size, m.d_model, m.n_heads, m.max_len, t.batch_size, t.n_sequences, 8 if t.dtype == "float64" else 4)
    # an output the run cannot write is refused now, not after the training it would lose
    for name, path in outputs.items():
        if path is not None:
            checks.check_writable(path, name)
    return Plan(model_config, train_config, init, resume, overridden)


def describe(model_config: ModelConfig, train_config: TrainConfig, init) -> str:
    m, t = model_config, train_config
    init = init.path if isinstance(init, weights.Loaded) else init
    return (
        f"model  vocab_size={m.vocab_size} d_model={m.d_model} n_heads={m.n_heads} (d_head={m.d_head}) "
        f"max_len={m.max_len} bias={m.bias}{'' if m.attn_impl == 'explicit' else f' attn_impl={m.attn_impl}'}\n"
        f"train  epochs={t.epochs} batch_size={t.batch_size} n_sequences={t.n_sequences} "
        f"({plural(t.steps_per_epoch, 'step')}/epoch) lr={t.lr:g} betas=({t.betas[0]:g}, {t.betas[1]:g}) eps={t.eps:g} "
        f"seed={t.seed} dtype={t.dtype} init={init}"
    )


def full_precision(backend: registry.Backend, asked: bool) -> contextlib.AbstractContextManager:
    """The matmul precision mhsa parity sets (TF32 off, JAX's 'highest'), for a run that will be
    compared across backends; NumPy always computes at full precision."""
    if not asked or "device" not in backend.supports:
        return contextlib.nullcontext()
    return backend.module("device").full_precision()


def run(args) -> int:
    """The command, in its phases: every flag and file checked (exit 2 before any work), the
    framework prepared, the banner, the training, then the result shown and the files written."""
    plan = check_flags(args)
    backend = registry.get(args.backend)
    if args.threads is None:  # given, it applied before the command started (mhsa.cli.run_guarded)
        m, t = plan.model_config, plan.train_config
        apply_threads(default_train_threads(t.batch_size, m.max_len, m.d_model, m.vocab_size))
    cache_note = prepare_framework(args, backend)
    print_banner(args, plan, cache_note)
    history = train_with_progress(args, plan, backend)
    if isinstance(history, int):  # the exit code of a run that stopped
        return history
    return finish(args, plan, backend, history)


def check_flags(args) -> Plan:
    """The Plan of the flags, or argparse's exit 2 with one line for any flag, file or
    combination that cannot run, before any work."""
    parser = args.parser
    try:
        plan = configs(args)
    except FileUnusable as error:  # the flags are right, the file is not: its line alone, no usage
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except (ValueError, TypeError, FileNotFoundError) as error:
        parser.error(str(error))
    backend = registry.get(args.backend)
    if plan.init == "native" and "layers" not in backend.supports:
        parser.error(
            f"--init native asks for the framework layers' own initializers; the {args.backend} backend has none: "
            "use --init shared (the same torch-style init, drawn with NumPy)"
        )
    if args.device != "cpu":
        if "device" not in backend.supports:
            parser.error(f"--device {args.device}: the {args.backend} backend runs on the CPU only")
        try:
            check_device(args.device, args.dp)
            backend.module("device").resolve(args.device)  # a GPU the framework does not see: refused now, not after the banner
        except ValueError as error:
            parser.error(str(error))
    if args.compile:
        if "compile" not in backend.supports:
            parser.error(f"--compile: the {args.backend} backend has no opt-in compiler; --compile is for {', '.join(registry.names('compile'))}")
        if args.dp > 1:
            parser.error(f"--compile with --dp {args.dp}: torch.compile runs on one device here; leave out one of the two")
    if args.no_jax_cache and backend.framework != "jax":
        parser.error(f"--no-jax-cache: the {args.backend} backend does not compile with JAX")
    if args.dp > 1 and "dp" not in backend.supports:
        parser.error(f"--dp {args.dp}: the {args.backend} backend has no data-parallel trainer")
    if args.dp > 1:
        try:  # every batch must split into dp equal shards
            check_data_parallel(plan.train_config, args.dp)
        except (ValueError, TypeError) as error:
            parser.error(str(error))
    return plan


def prepare_framework(args, backend: registry.Backend) -> str | None:
    """What must happen before the framework starts: the data-parallel devices (JAX fixes its CPU
    device count then), and JAX's compilation cache. Returns a note where the cache cannot be used."""
    if args.dp > 1:
        backend.module("parallel").prepare(args.dp)
    if backend.framework != "jax" or args.no_jax_cache:
        return None
    from mhsa import compile_cache

    note = compile_cache.enable_jax_cache()  # the same programs every run of these sizes: a second run reads them compiled
    return note if note.startswith(compile_cache.OFF) else None  # said only when it cannot be used


def print_banner(args, plan: Plan, cache_note: str | None) -> None:
    """What will run (not with --quiet); a compilation cache that cannot be used is said on stderr."""
    if cache_note is not None:
        print(f"note: {cache_note}", file=sys.stderr)
    if args.quiet:
        return
    print(f"backend {args.backend}")
    print(describe(plan.model_config, plan.train_config, plan.init) + (f" dp={args.dp}" if args.dp > 1 else ""), flush=True)
    if plan.resume is not None:
        print(f"resume after epoch {plan.resume.epochs_done} (step {plan.resume.step}) of a saved run")
        if plan.overridden:
            print(f"overridden from the saved run: {', '.join(plan.overridden)}")


class Progress:
    """on_step(step, loss) for a trainer: the progress bar, one line per finished epoch (not with
    --quiet), the losses so far, and the steps an EpochKeeper may count as complete."""

    def __init__(self, args, train_config: TrainConfig, bar: tqdm, first_step: int, keeper: EpochKeeper | None) -> None:
        self.args, self.train_config, self.bar, self.keeper = args, train_config, bar, keeper
        self.first_step, self.epoch_sum = first_step, 0.0
        self.losses: list[float] = []  # this run's, from first_step
        self.started = time.perf_counter()

    def on_step(self, step: int, loss: float) -> None:
        t = self.train_config
        self.losses.append(loss)
        if self.keeper is not None:
            self.keeper.on_step(step)
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        self.epoch_sum += loss
        if (step + 1) % t.steps_per_epoch == 0 or step + 1 == t.epochs * t.steps_per_epoch:
            steps = step % t.steps_per_epoch + 1
            line = f"epoch {step // t.steps_per_epoch + 1}/{t.epochs}  mean loss {self.epoch_sum / steps:.6g}"
            self.epoch_sum = 0.0
            if self.args.quiet:
                return
            if self.bar.disable:  # tqdm.write takes tqdm's locks even then, and a Ctrl-C between them ends in a traceback
                print(line, flush=True)
            else:  # above the bar in the terminal
                self.bar.write(line, file=sys.stdout)

    @property
    def epoch(self) -> int:
        """The epoch under way, counted from 1 over the whole run."""
        return (self.first_step + len(self.losses)) // self.train_config.steps_per_epoch + 1


def train_with_progress(args, plan: Plan, backend: registry.Backend):
    """The History of the run, or the exit code of a run that stopped (1: an error, one line;
    130: Ctrl-C, 143: SIGTERM, after keeping the last complete epoch where --save asks for it: keep_on_interrupt)."""
    model_config, train_config, resume = plan.model_config, plan.train_config, plan.resume
    first_step = 0 if resume is None else resume.step
    bar = tqdm(
        total=train_config.epochs * train_config.steps_per_epoch,
        initial=first_step,
        desc="train",
        unit="step",
        file=sys.stderr,
        leave=False,
        disable=args.quiet or not sys.stderr.isatty(),
    )
    trainer = backend.module("parallel").train if args.dp > 1 else backend.train.train
    keeper = EpochKeeper(backend, train_config, first_step) if args.save is not None and has_on_epoch(trainer) else None
    progress = Progress(args, train_config, bar, first_step, keeper)
    if args.compile:  # the first progress comes only after it
        print(compile_note(), file=sys.stderr, flush=True)
    try:
        options = ({"device": args.device} if args.device != "cpu" else {}) | ({"compile": True} if args.compile else {})
        options |= {"on_epoch": keeper.on_epoch} if keeper is not None else {}
        with full_precision(backend, args.full_precision):
            if args.dp > 1:  # the same run over dp ranks or devices: the framework's own data-parallel engine
                history = trainer(model_config, train_config, args.dp, init=plan.init, on_step=progress.on_step, resume=resume, **options)
            else:
                history = trainer(model_config, train_config, init=plan.init, on_step=progress.on_step, resume=resume, **options)
    except (NonFiniteLossError, RankFailedError, ValueError, TypeError, FileNotFoundError) as error:
        bar.close()
        print(f"{args.parser.prog}: error: {error}", file=sys.stderr)
        return TROUBLE
    except KeyboardInterrupt:
        hold_further_interrupts()  # the last complete epoch is saved and said whatever Ctrl-C or SIGTERM comes next
        bar.close()
        return keep_on_interrupt(args, plan, progress, keeper)
    bar.close()
    return with_start(history, plan)


def main(backend: str, argv: list[str] | None = None) -> int:
    """`python -m PACKAGE.train ARGV` (sys.argv's when None: this process's own command line)."""
    from mhsa.cli import interrupt_status, interruption, interrupts_restored, run_guarded, stdout_to_a_reader_that_may_leave

    parser = argparse.ArgumentParser(
        prog=f"python -m {registry.get(backend).package}.train",
        description=f"Train TinyLM on the copy task with the {backend} backend.",
    )
    with interrupts_restored(own_process=argv is None), stdout_to_a_reader_that_may_leave():
        try:
            add_arguments(parser, backend)
            args = parser.parse_args(argv)
            args.backend = backend
        except KeyboardInterrupt:
            hold_further_interrupts()
            print(interruption(), file=sys.stderr)
            return interrupt_status()
        return run_guarded(run, args, prefix=f"{parser.prog}: error")
