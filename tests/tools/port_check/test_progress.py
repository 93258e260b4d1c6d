"""The progress line (mhsa/port_check/core/progress.py): on stderr, only where it is a terminal and
only once the check has run two seconds, redrawn at most ten times a second with the stage and
"call k of N" of a run with the call's module, cleared however the check ends, silent when its stream refuses it; and
the command's report on stdout never holds any of it. A fake terminal and a fake clock, so that no
test waits (but the one that watches the ticker's thread, a few hundredths of a second)."""

import contextlib
import io
import time

import pytest

from mhsa.cli import main as mhsa
from mhsa.port_check.core import progress

FACTORIES = ["tests.tools.port_check.models:torch_named", "tests.tools.port_check.models:flax_renamed"]


class Terminal(io.StringIO):
    """A stream that says it is a terminal, and keeps what is written."""

    def isatty(self) -> bool:
        return True


class Refusing(Terminal):
    """A terminal whose reader is gone: every write fails, as on a closed pipe."""

    def __init__(self):
        super().__init__()
        self.tries = 0

    def write(self, text):
        self.tries += 1
        raise BrokenPipeError


class Clock:
    """A clock that moves only when a test moves it (seconds; 1/64 is exact in binary)."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def shown(stream, clock):
    return progress.shown(stream, clock, ticking=False)  # drawn only by the stages' calls: the fake clock decides


def cleared(text: str) -> str:
    return "\r" + " " * len(text) + "\r"


def test_a_check_that_ends_within_two_seconds_prints_nothing():
    stream, clock = Terminal(), Clock()
    with shown(stream, clock):
        progress.stage("running the reference")
        clock.now += 1.9
        progress.stage("running the port")
        progress.called("fc1")
    assert stream.getvalue() == ""


def test_after_two_seconds_the_line_shows_the_stage_and_call_k_of_n_with_its_module():
    stream, clock = Terminal(), Clock()
    with shown(stream, clock):
        progress.stage("the reference in float64, for the tolerances", calls=7)
        clock.now += 2.5
        for path in ("blocks.0", "blocks.1.mlp", ""):
            progress.called(path)
            clock.now += 0.25
        drawn = [
            "0:02 the reference in float64, for the tolerances: call 1 of 7 (blocks.0)",
            "0:02 the reference in float64, for the tolerances: call 2 of 7 (blocks.1.mlp)",
            "0:03 the reference in float64, for the tolerances: call 3 of 7 (the model)",
        ]
        assert stream.getvalue() == "\r" + drawn[0] + "\r" + drawn[1] + "\r" + drawn[2] + "   "  # spaces over the longer line's end
        progress.stage("running the port")  # a new stage: its count starts anew
        assert stream.getvalue().endswith("\r0:03 running the port" + " " * (len(drawn[2]) - len("0:03 running the port")))


@pytest.mark.parametrize("ending", [None, RuntimeError("the port failed on the inputs"), KeyboardInterrupt()], ids=["end", "error", "Ctrl-C"])
def test_the_line_is_cleared_however_the_check_ends(ending):
    stream, clock = Terminal(), Clock()
    with pytest.raises(type(ending)) if ending is not None else contextlib.nullcontext(), shown(stream, clock):
        clock.now += 3
        progress.stage("running the port")
        if ending is not None:
            raise ending
    assert stream.getvalue() == "\r0:03 running the port" + cleared("0:03 running the port")
    progress.stage("comparing the outputs")  # once the check is over, a stage draws nothing (as from Python)
    assert stream.getvalue().endswith(cleared("0:03 running the port"))


def test_end_clears_the_line_for_the_report_and_nothing_is_drawn_after_it():
    stream, clock = Terminal(), Clock()
    with shown(stream, clock):
        clock.now += 3
        progress.stage("probes: re-running with likely causes switched")
        progress.end()
        clock.now += 1
        progress.stage("comparing the outputs")
    text = "0:03 probes: re-running with likely causes switched"
    assert stream.getvalue() == "\r" + text + cleared(text)


def test_a_stream_that_refuses_the_line_silences_it_and_the_check_goes_on():
    refusing, clock = Refusing(), Clock()
    with shown(refusing, clock):
        clock.now += 3
        progress.stage("running the reference")
        clock.now += 1
        progress.stage("running the port")
    assert refusing.tries == 1  # silent after the first refusal, its clearing too
    closing = Terminal()
    with shown(closing, clock):
        clock.now += 3
        progress.stage("running the reference")
        closing.close()  # closed under the line: ValueError on a write
        clock.now += 1
        progress.stage("running the port")
    assert closing.closed


def test_nothing_is_written_to_a_stream_that_is_no_terminal():
    stream, clock = io.StringIO(), Clock()
    with shown(stream, clock) as line:
        clock.now += 3
        progress.stage("running the port")
        progress.called("fc1")
        assert line is None
    assert stream.getvalue() == ""


def test_the_line_is_redrawn_at_most_ten_times_a_second():
    stream, clock = Terminal(), Clock()
    with shown(stream, clock):
        progress.stage("running the reference")
        clock.now += 2
        for _ in range(100):  # a call every 1/64 s, 1.5625 s in all
            progress.called("fc1")
            clock.now += 1 / 64
        draws = stream.getvalue().count("\r0:0")
    assert draws == 15  # one in every 7 calls (7/64 s >= 0.1 s > 6/64 s): 15 draws in 1.5625 s


def test_the_line_is_cut_to_the_terminal_width():
    stream, clock = Terminal(), Clock()
    line = progress.Line(stream, clock, columns=lambda: 30)
    clock.now += 2
    line.show("running the port", "call 412 of 1130 (model.layers.7.mlp)")
    assert stream.getvalue() == "\r0:02 running the port: call 4"  # 29 characters: the last column left free


def test_a_long_stage_shows_without_a_further_call(monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0.02)
    monkeypatch.setattr(progress, "INTERVAL", 0.01)
    stream = Terminal()
    with progress.shown(stream):
        progress.stage("running the port")  # before the delay: not drawn by this call
        drawn = stream.getvalue()
        deadline = time.monotonic() + 2
        while "running the port" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)  # the ticker's thread draws it once due
        assert drawn == "" and "\r0:00 running the port" in stream.getvalue()
    assert stream.getvalue().endswith(cleared("0:00 running the port"))


def test_the_command_shows_its_progress_on_stderr_and_never_in_the_report(capsys, monkeypatch):
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)  # stderr, captured, taken for a terminal
    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.setattr(progress, "INTERVAL", 0.0)  # every stage drawn
    assert mhsa(["port-check", *FACTORIES]) == 0
    out, err = capsys.readouterr()
    stages = ["calling the factories", "tracing the port", "the reference in float64, for the tolerances", "running the port", "call 1 of"]
    assert "\r" not in out and not [stage for stage in stages if stage in out] and out.splitlines()[-1].startswith("PASS")
    assert not [stage for stage in stages if stage not in err], err
    assert err.startswith("\r0:00 calling the factories") and err.endswith(" \r")  # cleared before the report
