"""The mhsa command itself: --version, and --help that answers without loading a framework
(every command, and `python -m PACKAGE.train --help` of every trainer)."""

import subprocess
import sys

import pytest

from shared.tools.cli import COMMANDS, main
from tests.backends import names, package

FRAMEWORKS = ("torch", "jax", "flax", "optax")

# runs one entry point's --help in a fresh interpreter and prints which frameworks it imported
PROBE = """
import runpy, sys
sys.argv = [sys.argv[0], *{argv!r}]
try:
    {call}
except SystemExit as exit:
    assert exit.code == 0, exit.code
print(sorted(name for name in {frameworks!r} if name in sys.modules))
"""


def imported_frameworks(call: str, argv: list[str]) -> list[str]:
    result = subprocess.run([sys.executable, "-c", PROBE.format(call=call, argv=argv, frameworks=FRAMEWORKS)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
    return eval(result.stdout.strip().splitlines()[-1])


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("mhsa ") and out.split()[1][0].isdigit()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_of_every_command_loads_no_framework(command):
    assert imported_frameworks("from shared.tools.cli import main; sys.exit(main(sys.argv[1:]))", [command, "--help"]) == []


@pytest.mark.parametrize("name", names("train"))
def test_help_of_every_trainer_loads_no_framework(name):
    call = f"runpy.run_module('{package(name)}.train', run_name='__main__')"
    assert imported_frameworks(call, ["--help"]) == []


def test_the_probe_sees_a_framework_when_one_is_imported():
    # the check above can fail: a help that imports torch first is caught
    call = "import torch; from shared.tools.cli import main; sys.exit(main(sys.argv[1:]))"
    assert "torch" in imported_frameworks(call, ["--help"])
