"""The `mhsa` command: one subcommand per thing a user does. Each lives in its own module,
imported only when used, so `mhsa --help` starts fast and never loads a framework."""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import io
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from mhsa.exit_status import TROUBLE

# name -> (module with add_arguments(parser) and run(args) -> exit code, one-line help)
COMMANDS = {
    "demo": ("mhsa.demo", "train the default copy task with every backend and show a head"),
    "train": ("mhsa.train_cli", "train the copy-task model with one backend (--backend NAME)"),
    "diff": ("mhsa.diff.command", "show one file of two backends side by side (--left, --right), aligned step by step"),
    "heads": ("mhsa.heads", "show every attention head of a saved model (text, and an image with --plot)"),
    "parity": ("mhsa.parity.command", "prove every backend agrees: every stage, gradient, step, decode step and data-parallel run"),
    "generate": ("mhsa.generate", "continue a prompt with a saved model, with the KV cache or without (--no-cache)"),
    "port-check": ("mhsa.port_check", "check your own port: a torch model against its Flax port, module by module"),
    "compare": (
        "mhsa.compare",
        "compare the per-step losses of two or more --history files; exit 1 when they differ beyond the trajectory tolerance",
    ),
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
    """`mhsa ARGV` (sys.argv's when None: this process's own command line)."""
    argv_is_own = argv is None
    with interrupts_restored(own_process=argv_is_own):
        argv = sys.argv[1:] if argv is None else argv
        with stdout_to_a_reader_that_may_leave():
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
                # the subcommand's own parser: an unknown flag is refused with its usage, not mhsa's
                args = subparser.parse_args(argv[1:], argparse.Namespace(command=known.command))
            except KeyboardInterrupt:
                hold_further_interrupts()
                print(interruption(), file=sys.stderr)
                return interrupt_status()
            status = run_guarded(module.run, args, prefix=f"mhsa {known.command}: error")
            if argv_is_own and status == interrupt_status():
                leave_busy_threads(status)
            return status


def run_guarded(run, args, prefix: str) -> int:
    """run(args), with the endings every command shares turned into exit codes, not tracebacks;
    --threads, where the command has it, applies before the command starts any framework.
    A reader of stdout that leaves early (`| head`) neither stops the command nor changes its
    exit status: what it prints after is dropped (stdout_to_a_reader_that_may_leave)."""
    with stdout_to_a_reader_that_may_leave():
        try:
            if getattr(args, "threads", None) is not None:
                from mhsa.threads import apply_threads

                apply_threads(args.threads)
            return run(args)
        except OSError as error:  # a write failed after the checks (disk full, a folder removed): one line
            print(f"{prefix}: {error}", file=sys.stderr)
            return TROUBLE
        except KeyboardInterrupt:
            hold_further_interrupts()
            print(interruption(), file=sys.stderr)
            return interrupt_status()


# the signals that interrupt a command: Ctrl-C (SIGINT) and SIGTERM, what `kill`, `timeout` and
# schedulers send; both wind the command down the same way, as a KeyboardInterrupt
INTERRUPTS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = [signal.SIGINT]  # the signal that interrupted the command under way


def _interrupted(signum: int, frame) -> None:
    _received[0] = signum
    if _in_gc_callback(frame):
        # an exception raised inside a garbage-collector callback (JAX has one) is printed as
        # "Exception ignored" and dropped: the signal comes again once the callback is done
        threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
        return
    raise KeyboardInterrupt


def _in_gc_callback(frame) -> bool:
    codes = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def interrupt_status() -> int:
    """The exit status of an interrupted command: 128 + the signal's number, as a shell reports a
    process the signal ended (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + int(_received[0])


def interruption() -> str:
    """What the one line of an interrupted command starts with: "interrupted", or
    "interrupted by SIGTERM" where the signal was not a Ctrl-C."""
    return "interrupted" if _received[0] == signal.SIGINT else f"interrupted by {signal.Signals(_received[0]).name}"


def leave_busy_threads(status: int) -> None:
    """The end of an interrupted command that is this process's own: where threads of its own are
    still at work (mhsa parity's lanes: a compilation, a data-parallel run), their work is dropped
    rather than waited for. Every child process the command started is ended (SIGKILL: the
    command saves what it keeps before this), the streams are flushed and the process exits with
    `status` now. Without such threads it returns, and the command exits as usual."""
    if not any(thread.is_alive() and not thread.daemon for thread in threading.enumerate() if thread is not threading.current_thread()):
        return
    import multiprocessing
    from multiprocessing import forkserver

    # the ranks' server (multiprocessing's forkserver) leaves only once it has imported what it
    # preloads (torch: seconds) and sees this process gone: it is ended first, with every rank it
    # forked, among them one a lane may be starting now: that one reads its process object from
    # this process, and would print an EOFError's traceback once this process is gone. Stopped
    # first, the server forks no rank after its children are listed; ended, it leaves the ranks'
    # exits unreported, so the joins below do not wait.
    server = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if server is not None:
        with contextlib.suppress(OSError):
            os.kill(server, signal.SIGSTOP)
        for rank in _children_of(server):
            with contextlib.suppress(OSError):
                os.kill(rank, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(server, signal.SIGKILL)
    children = multiprocessing.active_children()
    for child in children:
        child.kill()
    for child in children:
        child.join(timeout=5)
    from multiprocessing import util

    # what an ordinary exit runs once its children have ended: every finalizer, among them the one
    # that removes multiprocessing's temporary folder (/tmp/pymp-*, the rank server's socket)
    util._run_finalizers()  # type: ignore[attr-defined]
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


def _children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux's /proc; elsewhere none are found)."""
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat_file.read_text().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
            if int(fields[1]) == pid:  # proc(5): state, ppid
                found.append(int(stat_file.parent.name))
    return found


def hold_further_interrupts() -> None:
    """After a Ctrl-C or SIGTERM a command winds down: it saves what it can and says so in one
    line, then exits (interrupt_status). A further Ctrl-C or SIGTERM is ignored from here on, so
    that it cuts short neither the line nor the interpreter's exit with a traceback
    (interrupts_restored undoes this in a command run inside another program)."""
    if threading.current_thread() is threading.main_thread():
        for signum in INTERRUPTS:
            signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def interrupts_restored(own_process: bool) -> Iterator[None]:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt while the block runs, the signal recorded for
    interrupt_status; a signal ignored when the block starts (a background job's Ctrl-C) stays
    ignored. The handlers as they were before the block afterwards, unless the command is this
    process's own: it is exiting then, and further interrupts are held (hold_further_interrupts),
    so that a late Ctrl-C cuts short no atexit callback (JAX's clean-up) with a traceback."""
    main = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.getsignal(signum) for signum in INTERRUPTS} if main else {}
    _received[0] = signal.SIGINT
    for signum, handler in previous.items():
        if handler in (signal.default_int_handler, signal.SIG_DFL):
            signal.signal(signum, _interrupted)
    try:
        yield
    finally:
        if main and not own_process:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        elif main:
            hold_further_interrupts()


class _ReaderMayLeave(io.TextIOBase):
    """sys.stdout for a command whose reader may close the pipe before the command is done: once
    a write or flush meets the closed pipe, the stream's descriptor is pointed at /dev/null and
    everything printed after is dropped, so the command finishes its work (the files it writes)
    and exits as it would have, and Python's final flush at exit finds nothing to complain about."""

    def __init__(self, stream) -> None:
        super().__init__()
        self.stream, self.reader_left = stream, False

    def write(self, text: str) -> int:
        if not self.reader_left:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self.reader_left:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self.reader_left = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
            self.stream.flush()  # what the stream still buffers goes to /dev/null now, not to Python's flush at exit
        except (OSError, ValueError, io.UnsupportedOperation):  # a stream without a descriptor: dropping is enough
            pass

    def isatty(self) -> bool:
        return not self.reader_left and self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self):
        return self.stream.encoding

    @property
    def errors(self):
        return self.stream.errors

    def __getattr__(self, name: str):  # the rest of the stream's own interface (buffer, name, ...)
        return getattr(self.stream, name)


@contextlib.contextmanager
def stdout_to_a_reader_that_may_leave() -> Iterator[None]:
    """sys.stdout wrapped in _ReaderMayLeave while the block runs (once: nested calls share it)."""
    if isinstance(sys.stdout, _ReaderMayLeave) or sys.stdout is None:
        yield
        return
    original = sys.stdout
    sys.stdout = wrapper = _ReaderMayLeave(original)
    try:
        yield
    finally:
        wrapper.flush()  # a reader gone is met here, not by Python's own flush at exit
        sys.stdout = original


if __name__ == "__main__":
    sys.exit(main())
