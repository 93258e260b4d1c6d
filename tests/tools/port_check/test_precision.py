"""Every captured output's dtype is read, and so are the modules' compute dtypes.

A Linen layer with dtype=float32 computes in float32 whatever its parameters: under --dtype
float64 the report names it and its attribute and compares from its first call on at float32's
tolerance, where a real bug before it is still held to float64's. A model-level dtype field (how
libraries hand it down) and NNX dtype attributes are raised to the dtype asked for, and said so.
bfloat16 computation is not judged: the verdict refuses with the reason. bfloat16 inputs are cast
up exactly."""

import jax.numpy as jnp
import ml_dtypes
import pytest
import torch

from mhsa.cli import main as mhsa
from mhsa.port_check import check_port, format_report
from mhsa.port_check.core.findings import Note, Precision
from mhsa.port_check.report.findings import line
from shared.tolerances import UNIT_ROUNDOFF, K, tolerance
from tests.tools.port_check import models


def reference():
    torch.manual_seed(0)
    return models.TorchMLP()


def test_a_linen_layer_computing_in_float32_is_named_with_its_attribute_and_compared_at_float32s_tolerance():
    report = check_port(reference(), models.linen(models.LinenFixedDtype()), models.activations(), dtype="float64", grads=True)
    assert report.precision == [Precision("holds", "jax", "float64", "fc1", attributes=(("dtype", "float32"),), judged_at="float32")]
    assert [line(finding) for finding in report.precision] == [  # the sentence it prints
        "'fc1' in jax holds dtype=float32, below the float64 asked for; "
        "from its first call on, the rows are compared at float32's tolerance, not float64's"
    ]
    assert report.passed, format_report(report)
    # from fc1 on, K times the float32 error the reference has there (its float32 run against its float64 one)
    rows = {row.name: row for row in report.rows if row.section == "output"}
    assert rows["norm"].tol == 1e-10 and rows["norm"].reference_error is None
    for name in ("fc1", "fc2", "(model output)"):
        row = rows[name]
        assert row.dtype == "float32" and row.tol == pytest.approx(K * max(row.reference_error, row.port_error or 0.0, UNIT_ROUNDOFF * row.scale)), (
            name
        )
    assert format_report(report).splitlines()[-1].endswith("(some at a lower precision's tolerance: see precision above)")


def test_a_bug_before_the_float32_layer_is_still_held_to_float64():
    report = check_port(reference(), models.linen(models.LinenFixedDtype(eps=1e-6)), models.activations(), dtype="float64")
    assert report.first_failure.name == "norm" and report.first_failure.tol == 1e-10, format_report(report)


def test_a_model_level_dtype_field_and_nnx_dtype_attributes_are_raised_to_the_dtype_asked_for():
    linen = check_port(reference(), models.linen(models.LinenModelDtype()), models.activations(), dtype="float64")
    assert linen.passed and not linen.precision, format_report(linen)
    assert Note("dtype set", ("'(the model)' dtype float32 -> float64",), "float64") in linen.notes
    port = models.NNXMLP()
    port.fc1.dtype = jnp.float32  # nnx.Linear computes in its dtype attribute
    nnx_report = check_port(reference(), port, models.activations(), dtype="float64")
    assert nnx_report.passed and Note("dtype set", ("'fc1' dtype float32 -> float64",), "float64") in nnx_report.notes, format_report(nnx_report)


def test_an_attribute_the_cast_does_not_know_is_named_and_lowers_the_tolerance_of_what_runs_inside_it():
    report = check_port(reference(), models.NNXMLP(compute_dtype=jnp.float32), models.activations(), dtype="float64")
    first = report.precision[0]
    assert (first.kind, first.side, first.path, first.attributes) == ("holds", "jax", "", (("compute_dtype", "float32"),)), report.precision
    assert report.passed, format_report(report)


def test_bfloat16_computation_is_not_judged_and_the_verdict_says_why(capsys):
    report = check_port(reference(), models.linen(models.LinenFixedDtype("bfloat16")), models.activations())
    first = report.precision[0]
    assert (first.kind, first.path, first.attributes, first.judged_at) == ("holds", "fc1", (("dtype", "bfloat16"),), ""), report.precision
    assert [row.status for row in report.rows] == ["", "unjudged", "unjudged", "unjudged"] and not report.passed
    text = format_report(report)
    assert text.splitlines()[-1] == "NO VERDICT: 3 of 4 comparisons not judged, computed below float32 (see precision above); the 1 judged agree"
    assert "| skip   |" in text


def test_a_float32_step_inside_a_float64_run_is_read_off_the_dataflow_and_holds_its_rows_to_float32s_tolerance():
    torch.manual_seed(0)
    report = check_port(models.TorchUpcast(), models.NNXMLP(), models.activations(), dtype="float64")
    first = report.precision[0]
    assert report.passed and (first.kind, first.side, first.dtype, first.path) == ("rounds", "torch", "float32", "act"), format_report(report)
    rows = {row.name: row for row in report.rows}
    assert rows["fc1"].tol == tolerance("stage", "float64") and rows["fc2"].dtype == "float32" and rows["fc2"].reference_error is not None


def test_a_float32_sized_difference_no_dataflow_explains_points_at_a_cast_in_the_code(monkeypatch):
    from mhsa.port_check.forward import precision

    monkeypatch.setattr(precision, "leaf_floor", lambda output: 3)  # a reader that cannot follow its model's dataflow
    torch.manual_seed(0)
    report = check_port(models.TorchUpcast(), models.NNXMLP(), models.activations(), dtype="float64")
    assert report.first_failure.name == "fc2"
    assert any(hint.kind == "rounding" and hint.row == "fc2" for hint in report.hints), report.hints


def test_bfloat16_inputs_are_cast_up_exactly_and_said_so():
    x = models.activations().astype(ml_dtypes.bfloat16)
    report = check_port(reference(), models.NNXMLP(), x, dtype="float64")
    assert report.passed, format_report(report)
    assert Note("inputs cast", ("bfloat16",), "float64") in report.notes
    torch_inputs = torch.as_tensor(models.activations()).to(torch.bfloat16)
    assert check_port(reference(), models.NNXMLP(), torch_inputs).passed


def test_the_command_names_the_float32_layer_under_float64(capsys, monkeypatch):
    monkeypatch.setattr(models, "flax_fixed", lambda: models.linen(models.LinenFixedDtype()), raising=False)
    assert (
        mhsa(
            [
                "port-check",
                "tests.tools.port_check.models:torch_mlp",
                "tests.tools.port_check.models:flax_fixed",
                "--input-shape",
                "3,5,24",
                "--dtype",
                "float64",
            ]
        )
        == 0
    )
    assert "precision: 'fc1' in jax holds dtype=float32, below the float64 asked for" in capsys.readouterr().out
