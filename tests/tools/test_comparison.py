"""mhsa/comparison.py: the one row type, tolerance rule and table of parity, port-check and --train."""

import math

import pytest

from mhsa.comparison import RESULT, Comparison, held, table
from mhsa.parity.rows import Row as ParityRow
from mhsa.port_check.core.records import Row as PortRow
from mhsa.port_check.core.training_records import TrainRow
from shared.tolerances import UNIT_ROUNDOFF, K

ROWS = {  # each tool's row with one gap of 3e-6
    "parity": lambda: ParityRow("stage", "scores", {"torch-numpy": 3e-6, "jax-numpy": None}),
    "port-check": lambda: PortRow("output", "attn", "attn", "Attention", 3e-6, 1e-6),
    "train": lambda: TrainRow(1, "grad", "w", "", 3e-6),
}


@pytest.mark.parametrize("tool", ROWS)
def test_every_tools_row_is_judged_by_the_one_comparison_rule(tool):
    row = ROWS[tool]()
    assert isinstance(row, Comparison)
    row.tol = 3e-6
    assert row.passed and row.closeness == 1.0  # a gap equal to its tolerance passes
    row.tol = 1e-6
    assert not row.passed and row.failing_pair() is not None and row.closeness == pytest.approx(3.0)
    row.tol = 0.0
    assert not row.passed and row.closeness == math.inf


def test_a_nan_gap_fails_whatever_the_tolerance():
    row = TrainRow(1, "loss", "", "", float("nan"), tol=1.0)
    assert not row.passed and row.failing_pair() == "max abs"


def test_the_larger_own_error_sets_the_tolerance_and_says_whose_it_is():
    tol, by_port = held((1e-7, 1.0), (3e-7, 1.0), fixed=1e-5)
    assert (tol, by_port) == (K * 3e-7, True)
    tol, by_port = held((3e-7, 1.0), (1e-7, 1.0), fixed=1e-5)
    assert (tol, by_port) == (K * 3e-7, False)
    assert held((3e-7, 1.0), None, fixed=1e-5) == (K * 3e-7, False)  # the fixed tolerance is not the floor of a derived one


def test_an_exact_value_is_held_to_k_roundings_of_the_larger_of_both_sides_largest_values():
    assert held((0.0, 2.0), (0.0, 3.0), fixed=1e-5) == (K * UNIT_ROUNDOFF * 3.0, False)


def test_a_fixed_tolerance_is_widened_only_where_the_ports_own_rounding_is_larger():
    assert held(None, None, fixed=1e-5) == (1e-5, False)
    assert held(None, (1e-7, 1.0), fixed=1e-5) == (1e-5, False)
    assert held(None, (1e-5, 1.0), fixed=1e-5) == (K * 1e-5, True)


def test_the_error_cell_names_whose_error_sets_the_tolerance():
    row = TrainRow(1, "loss", "", "", 0.0)
    assert row.error_cell() == "fixed"
    row.reference_error = 1.25e-7
    assert row.error_cell() == "1.25e-07"
    row.port_error, row.by_port = 2.5e-7, True
    assert row.error_cell() == "2.50e-07*"


def test_cells_are_padded_to_their_columns_and_the_rule_marks_the_right_aligned_ones():
    columns = [("compared", 9, "<"), ("max abs", 9, ">"), RESULT]
    rows = [(["ln2", "1.00e-06", "FAIL"], "  <- here"), (["", "", ""], ""), (["a longer name", "0", "PASS"], "")]
    assert table(columns, rows) == [
        "| compared  |   max abs | result |",
        "|-----------|----------:|--------|",
        "| ln2       |  1.00e-06 | FAIL   |  <- here",
        "|           |           |        |",
        "| a longer name |         0 | PASS   |",
    ]
