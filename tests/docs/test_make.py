"""The Makefile installs again when PYTHON, TORCH_INDEX or PIP_ARGS changes, and only then.

Run on a copy of the Makefile and the files its install depends on, with a stand-in for the
interpreter: `-m venv [--clear] DIR` makes DIR/bin/python (the stand-in again), `-m pip ...`
succeeds; each call is logged. `make -n` shows what an install would run without running it."""

import shutil
import stat
import subprocess

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")

STAND_IN = """#!/bin/sh
echo "$*" >> "{log}"
if [ "$1 $2" = "-m venv" ]; then
    shift 2
    if [ "$1" = "--clear" ]; then shift; rm -rf "$1"; fi
    mkdir -p "$1/bin" && cp "$0" "$1/bin/python"
fi
"""


@pytest.fixture
def checkout(tmp_path):
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    for name in ("python-a", "python-b"):
        (tmp_path / "bin").mkdir(exist_ok=True)
        path = tmp_path / "bin" / name
        path.write_text(STAND_IN.format(log=tmp_path / "calls.log"))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def make(checkout, *args, dry=False):
    result = subprocess.run(["make", *(["-n"] if dry else []), "install", *args], cwd=checkout, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def installs(output: str) -> bool:
    return "-m pip install" in output


PYTHON_A = "PYTHON=bin/python-a"


@pytest.mark.slow
def test_the_first_make_installs_and_a_second_does_nothing(checkout):
    assert installs(make(checkout, PYTHON_A, dry=True))
    make(checkout, PYTHON_A)
    calls = (checkout / "calls.log").read_text().splitlines()
    assert calls[0] == "-m venv .venv"  # a first install: no --clear
    assert calls[1].startswith("-m pip install --no-compile --disable-pip-version-check")
    assert calls[2] == "-m compileall -q -j 0 .venv/lib"  # the bytecode, on every core
    assert not installs(make(checkout, PYTHON_A, dry=True))


@pytest.mark.slow
@pytest.mark.parametrize(
    "change, shown",
    [
        ("TORCH_INDEX=https://download.pytorch.org/whl/cpu", "--extra-index-url https://download.pytorch.org/whl/cpu"),
        ("PIP_ARGS=--index-url https://mirror.invalid/simple", "--index-url https://mirror.invalid/simple"),
        ("PYTHON=bin/python-b", "bin/python-b -m venv --clear .venv"),
    ],
)
def test_changing_a_variable_installs_again_into_a_fresh_venv_and_changing_it_back_too(checkout, change, shown):
    make(checkout, PYTHON_A)
    again = make(checkout, PYTHON_A, change, dry=True)
    assert installs(again) and shown in again and "-m venv --clear .venv" in again, again
    make(checkout, PYTHON_A, change)
    assert not installs(make(checkout, PYTHON_A, change, dry=True))
    back = make(checkout, PYTHON_A, dry=True)
    assert installs(back) and "-m venv --clear .venv" in back, back  # the venv now holds the other install


@pytest.mark.slow
def test_a_quote_in_pip_args_is_kept_whole(checkout):
    change = "PIP_ARGS=--trusted-host 'mirror.invalid' --no-cache-dir"
    assert "--trusted-host 'mirror.invalid' --no-cache-dir" in make(checkout, PYTHON_A, change, dry=True)
    make(checkout, PYTHON_A, change)
    assert "--trusted-host mirror.invalid --no-cache-dir" in (checkout / "calls.log").read_text()  # what pip got, after the shell
    assert not installs(make(checkout, PYTHON_A, change, dry=True))


@pytest.mark.slow
def test_a_changed_pyproject_installs_again_into_the_same_venv(checkout):
    make(checkout, PYTHON_A)
    (checkout / "pyproject.toml").write_text((checkout / "pyproject.toml").read_text() + "\n")
    again = make(checkout, PYTHON_A, dry=True)
    assert installs(again) and "bin/python-a -m venv .venv" in again, again  # no --clear: pip updates what is there


@pytest.mark.slow
def test_make_clean_removes_the_venv(checkout):
    make(checkout, PYTHON_A)
    result = subprocess.run(["make", "clean"], cwd=checkout, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not (checkout / ".venv").exists()
