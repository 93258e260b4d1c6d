"""Every mistake with factories, inputs or shapes is one line and exit 2; Ctrl-C
is one line and exit 130; NaN in an output is a NaN row, never a crash and never a PASS."""

import numpy as np
import pytest

from mhsa.cli import main as mhsa
from mhsa.port_check import check_port, format_report
from tests.tools.port_check import models

M = "tests.tools.port_check.models"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [f"{M}:raising", "examples.flax_block:block"],
            f"TORCH_FACTORY '{M}:raising' raised RuntimeError: the checkpoint file is missing (at tests/tools/port_check/models.py:",
        ),
        (
            ["examples.torch_block:block", f"{M}:returns_none"],
            "FLAX_FACTORY 'tests.tools.port_check.models:returns_none' returned None; expected a model or (model, inputs)",
        ),
        (
            ["examples.flax_block:block", "examples.torch_block:block"],
            "TORCH_FACTORY returned a Flax model; the torch reference comes first, then its port (Flax NNX, Linen or Equinox)",
        ),
        (
            ["examples.equinox_block:block", "examples.torch_block:block"],
            "TORCH_FACTORY returned an Equinox model; the torch reference comes first, then its port (Flax NNX, Linen or Equinox)",
        ),
        (
            [f"{M}:no_parameters", "examples.flax_block:block"],
            "the reference (torch) (Identity) has no floating-point parameters: there is nothing to port",
        ),
        (
            ["examples.torch_block:block", f"{M}:flax_narrow"],
            "running the port (jax) on the inputs ((3, 5, 24) float32) failed: TypeError: cannot reshape array of shape (16,)",
        ),
        (
            [f"{M}:torch_block_model", f"{M}:flax_block_model", "--input-shape", "3,5,7"],
            "running the reference (torch) on the inputs ((3, 5, 7) float32) failed: RuntimeError: Given normalized_shape=[24]",
        ),
        (
            [f"{M}:torch_block_model", f"{M}:flax_block_model", "--input-shape", "3,5,24", "--int-range", "5"],
            "running the reference (torch) on the inputs ((3, 5, 24) int64) failed: RuntimeError",
        ),
        ([f"{M}:torch_block_model", f"{M}:flax_block_model"], "no inputs: give --input-shape or --inputs, or let a factory return (model, inputs)"),
        (
            [f"{M}:torch_positions_model", f"{M}:flax_positions_model", "--input-shape", "3,5"],
            "running the reference (torch) on the inputs ((3, 5) float32) failed: RuntimeError: Expected tensor for argument #1 'indices'",
        ),
    ],
    ids=[
        "factory-raises",
        "factory-returns-none",
        "factories-swapped",
        "equinox-first",
        "no-parameters",
        "port-too-narrow",
        "wrong-input-shape",
        "int-range-on-floats",
        "no-inputs",
        "floats-for-ids",
    ],
)
def test_a_mistake_is_one_line_and_exit_2(argv, message, capsys):
    assert mhsa(["port-check", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mhsa port-check: error: "), captured.err
    assert message in lines[0], lines[0]
    assert "Traceback" not in captured.err and captured.out == ""


def test_a_port_of_the_wrong_width_names_the_shapes_the_transfer_found(capsys):
    assert mhsa(["port-check", "examples.torch_block:block", f"{M}:flax_narrow"]) == 2
    err = capsys.readouterr().err
    assert "the port's weights do not fit the reference's ('ln1.weight' (24,) vs 'ln1.weight' (16,);" in err
    assert "is it built with the reference's sizes?" in err


def test_int_range_on_a_float_model_says_what_int_range_gives(capsys):
    assert mhsa(["port-check", f"{M}:torch_block_model", f"{M}:flax_block_model", "--input-shape", "3,5,24", "--int-range", "5"]) == 2
    assert capsys.readouterr().err.rstrip().endswith("--int-range gives integer ids: does the reference take ids?")


def test_ctrl_c_is_one_line_and_exit_130(capsys):
    assert mhsa(["port-check", f"{M}:interrupted", "examples.flax_block:block"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_nan_in_an_output_is_a_nan_row_and_never_passes(capsys):
    report = check_port(models.TorchNaN(), models.FlaxNaN(), models.activations(), grads=True)
    assert not report.passed
    row = report.first_failure
    assert (row.name, row.status, row.note) == ("(model output)", "nan", "NaN in both outputs") and not report.passed
    text = format_report(report)
    line = next(line for line in text.splitlines() if line.startswith("| (model output)"))
    assert "|       NaN |           |" in line and line.endswith("| FAIL   |  <- the models part here  (NaN in both outputs)"), line
    assert text.splitlines()[-1].startswith("FAIL: the models part at output '(model output)' (TorchNaN): NaN in both outputs")
    assert mhsa(["port-check", f"{M}:torch_nan", f"{M}:flax_nan", "--no-probes"]) == 1


def test_nan_on_one_side_only_is_named_on_that_side():
    from mhsa.port_check.forward.rows import compare_arrays

    a, b = np.ones((2, 3)), np.ones((2, 3))
    b[1, 2] = np.nan
    assert compare_arrays(a, b, ("torch", "jax"))[2:] == ("nan", "NaN in jax's output only")


def test_an_error_is_located_in_the_users_code_never_in_the_checkers_own_readers():
    from pathlib import Path

    from mhsa.port_check.forward.check import one_line
    from mhsa.port_check.readers import marks

    def raised_in(filename):  # raised and caught in `filename`, as a reader's error is caught in the checker's own code
        caught = "try:\n    raise ValueError('no such axis')\nexcept ValueError as error:\n    said = one_line(error)\n"
        scope = {"one_line": one_line}
        exec(compile(caught, filename, "exec"), scope)
        return scope["said"]

    assert raised_in(marks.__file__) == "ValueError: no such axis"  # the interpreter of a traced program, not the model
    user = Path(marks.__file__).parents[2] / "port_check_models.py"  # beside the package: a name that begins like it
    assert raised_in(str(user)).startswith("ValueError: no such axis (at "), raised_in(str(user))
