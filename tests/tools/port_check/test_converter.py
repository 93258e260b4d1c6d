"""By default the port is checked as it is, with the user's own converter.

A port that holds converted weights is not overwritten: each parameter that differs is named with
how (its transpose, a scale, rows in another order, a flipped kernel, a shape), and the output
where it enters fails. A fresh port gets the reference's weights, and the report says which of
the two it saw. --transfer and --no-transfer force either."""

import numpy as np
import pytest
import torch
from flax import nnx

from examples import flax_block, torch_block
from mhsa.cli import main as mhsa
from mhsa.port_check import check_port, format_report
from mhsa.port_check.core.findings import Switch
from tests.tools.port_check import models


def converted(**bugs):
    """The example block, and its NNX port filled by the user's converter (with planted bugs)."""
    source = torch_block.block()[0]
    return source, models.convert(source, flax_block.block()[0], **bugs)


def test_a_converter_that_forgets_a_transpose_fails_by_default_and_the_parameter_is_named():
    source, port = converted(forget_transpose="attn.out_proj")
    report = check_port(source, port, torch_block.example_inputs())
    assert not report.transfer.copied and report.transfer.decision.startswith("the port holds converted weights (8 of 8 parameters")
    assert [(difference.name, difference.how) for difference in report.transfer.differing] == [("attn.out_proj.weight", "holds its transpose")]
    assert report.first_failure.name == "attn.out_proj", format_report(report)
    assert "  differs: attn.out_proj.weight: holds its transpose (max abs" in format_report(report)


def test_a_converter_that_scales_a_weight_is_named_with_the_scale_and_a_probe_confirms_it():
    source, port = converted(scale={"mlp.fc1": 0.5})
    report = check_port(source, port, torch_block.example_inputs())
    assert [difference.how for difference in report.transfer.differing] == ["scaled by 0.5 (1/sqrt(4))"]
    assert report.first_failure.name == "mlp.fc1"
    assert [(probe.switch, probe.outcome, probe.row, probe.moves_to) for probe in report.probes] == [
        (Switch("load", names=("mlp.fc1.weight",)), "closes", "mlp.fc1", None)
    ]


def test_a_faithful_converter_passes_as_it_is_and_a_fresh_port_gets_the_weights_and_says_so():
    source, port = converted()
    report = check_port(source, port, torch_block.example_inputs(), dtype="float64")
    assert report.passed and not report.transfer.copied and not report.transfer.differing, format_report(report)
    fresh = check_port(source, flax_block.block()[0], torch_block.example_inputs())
    assert fresh.passed and fresh.transfer.copied
    assert fresh.transfer.decision.startswith("a fresh port: none of the 8 parameters whose reference values are not constant hold them")


def test_transfer_and_no_transfer_force_either_choice():
    source, port = converted(forget_transpose="attn.out_proj")
    assert check_port(source, port, torch_block.example_inputs(), transfer=True).passed  # the converter's bug overwritten
    fresh = check_port(source, flax_block.block()[0], torch_block.example_inputs(), transfer=False, probes=False)
    assert not fresh.transfer.copied and len(fresh.transfer.differing) == 8 and not fresh.passed  # the norms start alike


def test_the_command_checks_the_converter_by_default(capsys, monkeypatch):
    monkeypatch.setattr(models, "converted_port", lambda: converted(forget_transpose="attn.out_proj")[1], raising=False)
    factories = ["examples.torch_block:block", "tests.tools.port_check.models:converted_port", "--input-shape", "3,5,24", "--no-probes"]
    assert mhsa(["port-check", *factories]) == 1
    assert "differs: attn.out_proj.weight: holds its transpose" in capsys.readouterr().out
    assert mhsa(["port-check", *factories, "--transfer"]) == 0


@pytest.mark.parametrize(
    ("transform", "how"),
    [
        (lambda w: w[::-1].copy(), "holds the reference's rows in another order (the port's rows 0, 1, 2, ... are its 5, 4, 3, 2, 1, 0)"),
        (lambda w: w[:, [1, 0, 2]], "holds the reference's columns in another order (the port's columns 0, 1, 2, ... are its 1, 0, 2)"),
        (lambda w: -w, "scaled by -1"),
    ],
)
def test_how_a_parameter_differs_is_read_off_its_values(transform, how):
    from mhsa.port_check.forward.weights import how_it_differs

    weight = np.random.default_rng(0).standard_normal((6, 3))
    assert how_it_differs(weight, transform(weight), 1e-6) == how


def test_conv_kernels_flipped_or_with_channels_swapped_are_named():
    from mhsa.port_check.forward.weights import how_it_differs

    kernel = np.random.default_rng(0).standard_normal((4, 4, 3, 5))  # (out, in, kH, kW)
    assert how_it_differs(kernel, kernel[:, :, ::-1, ::-1], 1e-6) == "holds the kernel flipped along its spatial axes"
    assert how_it_differs(kernel, kernel.swapaxes(0, 1), 1e-6) == "holds the kernel with its in and out channels swapped"
    assert how_it_differs(kernel, np.random.default_rng(1).standard_normal(kernel.shape), 1e-6) is None


def test_a_port_whose_norms_alone_match_is_a_fresh_port():
    # both frameworks start a LayerNorm at ones and zeros: that is no evidence of a converter
    port = flax_block.block()[0]
    torch.manual_seed(1)
    report = check_port(torch_block.Block().eval(), port, torch_block.example_inputs())
    assert report.transfer.copied and report.passed, format_report(report)
    assert isinstance(port, nnx.Module)
