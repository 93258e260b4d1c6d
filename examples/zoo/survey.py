"""What `mhsa port-check` says about every pair of the zoo: one line per faithful pair (converted
port and fresh port, weights transferred) and per planted bug, each in float32 and float64 with
gradients, with the verdict, the first failing row against the place the table expects, and any
exception.

    python -m examples.zoo.survey            # the table
    python -m examples.zoo.survey --full     # and every report in full
"""

from __future__ import annotations

import argparse
import re
import traceback
from typing import Any

import jax

from examples.zoo import catalog
from mhsa.port_check import check_port, format_report
from mhsa.port_check.report.findings import line

DTYPES = ("float32", "float64")


def row_module(name: str) -> str:
    """A report row's name -> the module path it names ("" for the model's own output)."""
    name = re.sub(r" \(call \d+\)$", "", name).partition("[")[0]  # a leaf of the call's output: its module
    return "" if name.startswith("(model output)") else name


def verdict(reference_spec: str, port_spec: str, *, dtype: str, grads: bool, port_kwargs=None) -> tuple[str, str, Any]:
    """(verdict, first failing row or lint finding, the report or the traceback)."""
    try:
        reference, x = catalog.build(reference_spec)
        port, y = catalog.build(port_spec, **(port_kwargs or {}))
        report = check_port(reference, port, x, target_inputs=y, dtype=dtype, grads=grads)
    except Exception as error:  # the survey reports a crash as what the checker said
        return "CRASH", f"{type(error).__name__}: {str(error).splitlines()[0][:120]}", traceback.format_exc()
    first = report.first_failure
    if first is not None:
        where = f"{first.section} '{first.name}' {first.abs_diff:.2e}" + (f" ({first.note})" if first.note else "")
    else:
        where = f"lint: {line(report.lint[0], report.sides)}" if report.lint else ""
    if report.stopped:
        return "STOP", report.stopped, report
    return ("PASS" if report.passed else "FAIL"), where, report


def survey(full: bool = False) -> None:
    jax.config.update("jax_enable_x64", True)
    for name, pair in {**catalog.FAITHFUL, **catalog.SHAPED}.items():
        ports = (("converted", pair.port), ("fresh", pair.fresh))
        for label, spec, dtype in [(f"{name} {kind}", spec, dtype) for kind, spec in ports for dtype in DTYPES]:
            result, where, report = verdict(pair.reference, spec, dtype=dtype, grads=True)
            print(f"faithful {label:<26} {dtype}  expect PASS  got {result:<5} {where}", flush=True)
            if full or result == "CRASH":
                print(report if result == "CRASH" else format_report(report))
    for name, bug in {**catalog.BUGS, **catalog.SHAPED_BUGS}.items():
        for dtype in DTYPES:
            result, where, report = verdict(bug.reference, bug.port, dtype=dtype, grads=True, port_kwargs={"dtype": dtype})
            expected = f"{bug.section} '{bug.parts_at or '(model output)'}'"
            found = (result == "FAIL" or bug.section == "lint") and names(report, bug)  # a lint finding alone is a warning
            print(f"bug {name:<28} {dtype}  expect {expected:<40} got {result:<5} {'right place' if found else 'WRONG':<11} {where}", flush=True)
            if full or result == "CRASH":
                print(report if result == "CRASH" else format_report(report))


def names(report, bug: catalog.Bug) -> bool:
    """Whether the report names the bug where the table says: its first failing row, in the bug's
    section and at the bug's module; for a lint-only bug, a lint finding about that module."""
    if bug.section == "lint":
        return any(finding.path == bug.parts_at for finding in report.lint)
    if bug.section == "unpaired":
        return bool(report.stopped) and bug.parts_at in report.transfer.unpaired
    first = report.first_failure
    return first is not None and first.section == bug.section and row_module(first.name) == bug.parts_at


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.zoo.survey", description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="print every report in full")
    survey(parser.parse_args().full)


if __name__ == "__main__":
    main()
