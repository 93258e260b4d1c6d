"""mhsa/comparison.py: the one table of parity, port-check and --train rows."""

from mhsa.comparison import RESULT, table


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
