"""The `mhsa` command: one subcommand per thing a user does. Each lives in its own module,
imported only when used, so `mhsa --help` starts fast and never loads a framework."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module with add_arguments(parser) and run(args) -> exit code, one-line help)
COMMANDS = {
    "demo": ("mhsa.demo", "train the default copy task with every backend and show a head"),
    "train": ("mhsa.train_cli", "train the copy-task model with one backend (--backend NAME)"),
    "diff": ("mhsa.diff.command", "show one file of two backends side by side (--left, --right), aligned step by step"),
    "heads": ("mhsa.heads", "show every attention head of a saved model (text, and an image with --plot)"),
    "parity": ("mhsa.parity.command", "prove every backend agrees: every stage, gradient, step, decode step and data-parallel run"),
    "generate": ("mhsa.generate", "continue a prompt with a saved model, with the KV cache or without (--no-cache)"),
    "port-check": ("mhsa.port_check", "check your own port: a torch model against its Flax port, module by module"),
    "compare": ("mhsa.compare", "compare the per-step losses of two --history files"),
    "bind": ("mhsa.bind", "bind an Adam companion saved before checkpoints were bound to its weights file"),
    "bench": ("mhsa.bench", "run the benchmarks (benchmarks/ of a checkout) and print their markdown tables"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mhsa",
        description="Causal multi-head self-attention in PyTorch and JAX/Flax NNX, with a NumPy reference.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=help_text, description=help_text)
        subparser.set_defaults(module_name=module_name)
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of one subcommand, as build_parser added it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise LookupError(f"the mhsa parser has no subcommands; expected one named {command!r}")


def version() -> str:
    """The installed package's version (pyproject.toml), without importing any framework."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("mhsa-parity")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    # parse the subcommand name first, then let its module add its own flags
    known, _ = parser.parse_known_args(argv[:1] if argv and not argv[0].startswith("-") else argv)
    if known.command is None:
        parser.print_help()
        return 0 if not argv else 2
    try:  # Ctrl-C while the subcommand's module is imported: one line, as during its run
        module = importlib.import_module(COMMANDS[known.command][0])
        subparser = _subparser(parser, known.command)
        module.add_arguments(subparser)
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return run_guarded(module.run, args, prefix=f"mhsa {known.command}: error")


def run_guarded(run, args, prefix: str) -> int:
    """run(args), with the endings every command shares turned into exit codes, not tracebacks;
    --threads, where the command has it, applies before the command starts any framework."""
    try:
        if getattr(args, "threads", None) is not None:
            from mhsa.threads import apply_threads

            apply_threads(args.threads)
        return run(args)
    except BrokenPipeError:  # the reader went away (`| head`): not an error of ours
        sys.stdout = None
        return 0
    except OSError as error:  # a write failed after the checks (disk full, a folder removed): one line
        print(f"{prefix}: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
