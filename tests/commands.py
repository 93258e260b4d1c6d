"""Command lines run in this process, as the tests that check their output use them: a trainer's
(run_cli), and any `mhsa` command its parser refuses (refused)."""

import contextlib
import io
from types import SimpleNamespace

import pytest

from mhsa import train_cli


def run_cli(backend, *flags, cwd):
    """`python -m PACKAGE.train FLAGS` in folder cwd, run in this process (train_cli.main is what
    the launcher calls; tests/tools/test_train_cli.py and test_interrupt.py also start the real launcher):
    an object with the returncode, stdout and stderr a user would see. The streams are not
    terminals, as in a subprocess, so no progress bar is drawn."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = train_cli.main(backend, list(flags))
        except SystemExit as exit:  # argparse's errors
            status = exit.code
    return SimpleNamespace(returncode=status, stdout=out.getvalue(), stderr=err.getvalue())


def refused(capsys, *argv):
    """`mhsa ARGV` in this process, refused by its parser before any work: exit status 2 and
    nothing on stdout (asserted); returns what it wrote on stderr."""
    from mhsa.cli import main

    with pytest.raises(SystemExit) as exit:
        main(list(argv))
    out, err = capsys.readouterr()
    assert exit.value.code == 2 and out == "", (exit.value.code, out, err)
    return err
