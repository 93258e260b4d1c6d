"""The sentences a port report prints where a number or a count could read wrong: a probe's gap that
is NaN or not comparable, no row whose tolerance the port's error sets, one parameter (not "1
parameters"), a module both sides call whose calls do not pair (one line, not a line on each side),
and a summed group's --train finding."""

from mhsa.port_check.core.findings import Probe, Summed, Switch
from mhsa.port_check.core.records import PortReport, Row, Transfer
from mhsa.port_check.forward.check import stopped_reason
from mhsa.port_check.report.findings import line
from mhsa.port_check.report.forward import format_report

SIDES = ("torch", "jax")


def test_a_probe_says_nan_and_an_incomparable_gap_in_words():
    switch = Switch("precision")
    assert line(Probe(switch, "open", "qkv", 1.0, float("nan")), SIDES).endswith("('qkv' still NaN)")
    assert line(Probe(switch, "open", "qkv", 1.0, float("inf")), SIDES).endswith("('qkv' still not comparable (shapes))")
    assert line(Probe(switch, "open", "qkv", 1.0, None), SIDES).endswith("('qkv' still no output)")
    assert "(NaN -> 1.00e-07)" in line(Probe(switch, "closes", "qkv", float("nan"), 1e-7), SIDES)


def _report(**fields) -> PortReport:
    row = Row("output", "fc", "fc", "Linear", 1e-7, 1e-7, 0, "fc", "fc", tol=1e-6, reference_error=1e-7)
    return PortReport("title", SIDES, Transfer(), rows=[row], **fields)


def test_a_port_twin_that_sets_no_tolerance_says_so_rather_than_counting_zero():
    text = format_report(_report(port_twin="float64", port_sets=0))
    assert "the reference's own error stays the larger at every row (none is marked *)" in text and "the 0 marked" not in text
    assert "and the 2 marked * take jax's" in format_report(_report(port_twin="float64", port_sets=2))


def test_one_parameter_is_one_parameter():
    transfer = Transfer(reference_left=["fc.bias"])
    assert stopped_reason(transfer) == "1 parameter of the reference (torch) pairs with none of the port's (jax): fc.bias"
    transfer.reference_left.append("fc.weight")
    assert stopped_reason(transfer).startswith("2 parameters of the reference (torch)")


def test_a_module_both_sides_call_whose_calls_do_not_pair_is_one_line():
    text = format_report(_report(unmatched_source=["mlp", "act"], unmatched_target=["mlp", "dense"]))
    assert "called in torch and in jax, but their calls pair by number and these do not (a call more on one side?): mlp" in text
    assert "no counterpart in jax (compared only through the next matched output): act" in text
    assert "no counterpart in torch: dense" in text


def test_a_summed_group_says_why_the_trainings_part():
    finding = Summed(("lstm.bias_ih_l0", "lstm.bias_hh_l0"), "lstm.cell.hi.bias, lstm.cell.hf.bias")
    assert line(finding, SIDES) == (
        "lstm.bias_ih_l0, lstm.bias_hh_l0: held as one array in jax (lstm.cell.hi.bias, lstm.cell.hf.bias): equal in the forward pass "
        "and its gradients, but torch's optimizer moves each by its own update, so the trainings part there"
    )
