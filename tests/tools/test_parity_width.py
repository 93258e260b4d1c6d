"""`mhsa parity` fits its width: 120 columns by default, tables and notes alike, wider
with --width, and a width below the narrowest it fits is refused. Each test trains the default
model for an epoch: the slow tier (test_parity.py holds the default report to 120 in make test)."""

import pytest

from mhsa.cli import main as mhsa

pytestmark = pytest.mark.slow

# the default model with every table that has long names (gradients, trajectories, decode), kept short
MIN_WIDTH = 120  # the default, and the narrowest the tables fit
QUICK = ["--dp", "0", "--epochs", "1", "--samples", "1"]


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_the_default_report_fits_120_columns(capsys):
    assert mhsa(["parity", *QUICK]) == 0
    out = capsys.readouterr().out
    assert widest(out) <= 120
    # nothing dropped: the long names wrap within their column, the long notes under the tables
    assert "| torch fused: cached logits vs explicit full" in out and "grad attn.qkv_proj.weight" in out
    assert "note: columns shortened to fit: torch-numpy is torch vs numpy" in out
    assert "PASS: all" in out


@pytest.mark.parametrize("width", [160, 400])
def test_width_sets_the_longest_line(capsys, width):
    assert mhsa(["parity", *QUICK, "--width", str(width)]) == 0
    out = capsys.readouterr().out
    assert widest(out) <= width
    if width > 300:  # room for every table with its full headers and names on one line each
        assert widest(out) > 120 and "| numpy f64 vs FD |" in out and "shortened" not in out


@pytest.mark.parametrize("value", [str(MIN_WIDTH - 1), "wide"])
def test_a_bad_width_is_refused_in_one_line(capsys, value):
    with pytest.raises(SystemExit) as exit:
        mhsa(["parity", "--width", value])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    shown = value if value.isdigit() else repr(value)
    assert f"error: argument --width: expected a width of at least {MIN_WIDTH}, got {shown}" in err
