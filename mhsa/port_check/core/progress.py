"""The port check's progress line: on stderr while a check runs, what it is doing (its stage) and
how far it is (module call k of N of a run, and that call's module: `model.layers.7.mlp`, layer 7),
so that a check of a large model shows where it is.

Only a person at a terminal sees it: nothing is written to stdout, where the report goes, nor to a
stderr that is no terminal (a log, a pipe). It appears once the check has run DELAY seconds (a
quick check prints nothing), is redrawn in place at most once per INTERVAL, and is cleared when the
check ends, fails or is interrupted, so that the report or error line that follows starts on a
clean line. A stream that refuses it (closed, its reader gone) silences it; the check goes on.

The command opens one line for the whole check (`shown`); the checks' stages say where they are in
one call (`stage`), the readers each module call as they record it (`called`), which does nothing where no line is shown (a check run from Python).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

DELAY = 2.0  # seconds before the line first shows: a check that ends sooner shows nothing
INTERVAL = 0.1  # seconds between two draws at least: ten a second


def is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal (a closed or odd stream is not)."""
    try:
        return stream.isatty()
    except (AttributeError, OSError, ValueError):
        return False


def terminal_columns(stream: TextIO) -> int:
    """The width of the terminal `stream` writes to (shutil's guess where it cannot tell or says 0,
    as a terminal of no size does: $COLUMNS, stdout's, 80)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        columns = 0
    return columns or shutil.get_terminal_size().columns


class Line:
    """One progress line on `stream`, `clock` its time in seconds. The check's thread sets what it
    shows (`show`); `draw` writes it where due, from that thread or the ticker's."""

    def __init__(
        self,
        stream: TextIO,
        clock: Callable[[], float] = time.monotonic,
        delay: float = DELAY,
        interval: float = INTERVAL,
        columns: Callable[[], int] | None = None,
    ):
        self.stream, self.clock, self.delay, self.interval = stream, clock, delay, interval
        self.columns: Callable[[], int] = columns or (lambda: terminal_columns(stream))
        self.start = clock()
        self.now = ("", "")  # (the stage, how far it is): one tuple, so that the ticker never reads half an update
        self.calls: int | None = None  # the module calls the stage's run makes, where known
        self.done = 0  # how many of them have returned
        self.drawn = ""  # the text on the terminal now
        self.last = -math.inf  # when it was drawn
        self.quiet = False  # ended, or the stream refused a write: nothing more is written
        self.lock = threading.Lock()  # one writer at a time: the check's thread or the ticker

    def show(self, stage: str, count: str = "") -> None:
        self.now = (stage, count)
        self.draw()

    def draw(self) -> None:
        """Write the line where due: DELAY after the start, INTERVAL after the last draw, and changed."""
        now = self.clock()
        if self.quiet or now - self.start < self.delay or now - self.last < self.interval:
            return
        with self.lock:
            stage, count = self.now
            minutes, seconds = divmod(int(now - self.start), 60)
            text = f"{minutes}:{seconds:02d} {stage}" + (f": {count}" if count else "")
            text = text[: max(self.columns() - 1, 0)]  # never the last column: some terminals wrap there
            if self.quiet or text == self.drawn:
                return
            self._write("\r" + text + " " * (len(self.drawn) - len(text)))  # spaces over a longer line's end
            self.drawn, self.last = text, now

    def end(self) -> None:
        """Clear the line and draw it no more."""
        with self.lock:
            if self.drawn and not self.quiet:
                self._write("\r" + " " * len(self.drawn) + "\r")
            self.drawn, self.quiet = "", True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # closed, or its reader gone (BrokenPipeError): the check goes on without it
            self.quiet = True


_current: Line | None = None  # the line of the check under way, where one is shown


@contextlib.contextmanager
def shown(stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic, ticking: bool = True) -> Iterator[Line | None]:
    """A progress line on `stream` (sys.stderr) for the block, where it is a terminal (else None,
    and nothing is written); the stages inside draw it. Cleared however the block ends. ticking: a
    thread redraws it too, so that it shows and its clock moves while one stage runs long."""
    global _current
    stream = sys.stderr if stream is None else stream
    if _current is not None or not is_terminal(stream):  # one line per check, and none off a terminal
        yield None
        return
    line = _current = Line(stream, clock, DELAY, INTERVAL)
    stop = threading.Event()
    ticker = threading.Thread(target=_tick, args=(line, stop), name="port-check progress", daemon=True)
    try:
        if ticking:
            ticker.start()
        yield line
    finally:
        _current = None
        stop.set()
        line.end()
        if ticker.is_alive():
            ticker.join(timeout=1.0)


def _tick(line: Line, stop: threading.Event) -> None:
    while not stop.wait(max(line.interval, 0.01)):
        line.draw()


def stage(what: str, calls: int | None = None) -> None:
    """The check now does `what` ("running the port"), a run of `calls` module calls where known:
    drawn where due; nothing where no line is shown."""
    line = _current
    if line is not None:
        line.calls, line.done = calls, 0
        line.show(what)


def called(path: str) -> None:
    """A module call of the run under way returned (a reader says so as it records it): "call k of
    N (its module)" in the current stage; nothing where no line is shown."""
    line = _current
    if line is not None:
        line.done += 1
        total = f" of {line.calls}" if line.calls is not None and line.done <= line.calls else ""
        line.show(line.now[0], f"call {line.done}{total} ({path or 'the model'})")


def end() -> None:
    """Clear the line now and draw it no more: the report or an error line follows."""
    line = _current
    if line is not None:
        line.end()
