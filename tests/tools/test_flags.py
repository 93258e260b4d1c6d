"""The integer flags of every command (mhsa/flags.py): each bounded flag is in the table of
ranges its documentation gives, and its parser takes both ends of that range and refuses one
past either end, and a value far past it, naming the value and the range."""

import argparse
import importlib
import re

import pytest

from mhsa import flags
from mhsa.cli import COMMANDS

# the table of mhsa/flags.py's documentation: "    --seed            [0, 4294967295]    why"
DOCUMENTED = {
    flag: (int(low), int(high)) for flag, low, high in re.findall(r"^    ((?:[a-z-]+ )?--[a-z-]+)\s+\[(\d+), (\d+)\]", flags.__doc__, re.MULTILINE)
}


def integer_flags():
    """(command, flag, its argparse type) for every integer flag of every command."""
    found = []
    for command, (module_name, _) in COMMANDS.items():
        parser = argparse.ArgumentParser(prog=command)
        importlib.import_module(module_name).add_arguments(parser)
        for action in parser._actions:
            if getattr(action.type, "__name__", None) == "integer":  # flags.int_in's parsers
                found += [(command, flag, action.type) for flag in action.option_strings if flag.startswith("--")]
    return found


INTEGER_FLAGS = integer_flags()


def test_there_are_integer_flags_and_a_documented_table():
    assert len(INTEGER_FLAGS) > 20 and len(DOCUMENTED) > 15, (INTEGER_FLAGS, DOCUMENTED)


@pytest.mark.parametrize("command, flag, parse", INTEGER_FLAGS, ids=[f"{command} {flag}" for command, flag, _ in INTEGER_FLAGS])
def test_every_bounded_integer_flag_enforces_its_documented_range(command, flag, parse):
    far = 10**30
    try:
        parse(str(far))
    except argparse.ArgumentTypeError:
        pass
    else:  # no upper bound (diff --width): not a range of the table
        assert f"{command} {flag}" not in DOCUMENTED and flag not in DOCUMENTED, f"{command} {flag} has no upper bound but a documented range"
        return
    key = f"{command} {flag}" if f"{command} {flag}" in DOCUMENTED else flag
    assert key in DOCUMENTED, f"mhsa {command} {flag} is bounded but missing from mhsa/flags.py's table of ranges"
    low, high = DOCUMENTED[key]
    assert parse(str(low)) == low and parse(str(high)) == high
    for value in (low - 1, high + 1, far):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^expected an integer in \[{low}, {high}\], got {value}$"):
            parse(str(value))
