"""The suite's two tiers (pyproject.toml's `slow` marker): `make test` runs the first case of a
parametrized property, enough to check it once; `make test-slow` runs every other case. A case
that builds, compiles or trains models of its own costs a second or more, and the fast tier
holds the property, not every example of it."""

import pytest
from _pytest.mark.structures import ParameterSet


def first_fast(cases) -> list:
    """`cases` for pytest.mark.parametrize with every case after the first marked slow. A case is
    a value (one argument), a tuple (one per argument name) or a pytest.param, whose id and marks
    are kept."""
    marked = []
    for n, case in enumerate(cases):
        slow = [] if n == 0 else [pytest.mark.slow]
        if isinstance(case, ParameterSet):
            marked.append(pytest.param(*case.values, marks=[*case.marks, *slow], id=case.id))
        elif isinstance(case, tuple):
            marked.append(pytest.param(*case, marks=slow))
        else:
            marked.append(pytest.param(case, marks=slow))
    return marked
