"""Layers as libraries write them, which the port check was not written around: a Conv1D that
stores a linear weight (in, out), a head tied to the embedding, an RMSNorm whose epsilon is
called variance_epsilon, a 'SAME' convolution against explicit padding with BatchNorm in eval, and
'SAME' at stride 2, which is not torch's symmetric padding."""

import itertools

import numpy as np
import pytest
import torch
from flax import nnx
from jax import lax

from mhsa.port_check import check_port, format_report
from mhsa.port_check.core.findings import LintDifference, Note, Switch, Untied
from mhsa.port_check.core.padding import explicit, resolve_same, same_pads
from mhsa.port_check.report.findings import line
from tests.tools.port_check import models


def lm():
    torch.manual_seed(0)
    return models.TorchLM()


def test_conv1d_weights_stored_in_out_are_taken_transposed_and_a_tied_head_is_one_parameter():
    report = check_port(lm(), models.FlaxLM(), models.token_ids(), dtype="float64", grads=True)
    assert report.passed, format_report(report)
    assert report.transfer.layouts == [
        "Conv1D in torch / Linear in jax: 2-d weights taken transposed ('c_fc.weight' (24, 48) fits 'c_fc.weight' (48, 24) only so)"
    ]
    mix = next(group for group in report.transfer.groups if group.reference == ("c_mix.weight",))
    assert mix.port == ("c_mix.weight",) and mix.words() == "transposed"  # the square one follows its layer type
    assert Note("tied", (("head.weight", "wte.weight"),)) in report.notes
    assert not report.transfer.reference_left


def test_a_converter_that_wrote_conv1d_weights_right_passes_as_it_is():
    source, port = lm(), models.FlaxLM()
    for name in ("c_fc", "c_proj", "c_mix"):  # Conv1D (in, out) is already a Flax kernel's layout
        layer, weights = getattr(port, name), getattr(source, name)
        layer.kernel[...] = weights.weight.detach().numpy()
        layer.bias[...] = weights.bias.detach().numpy()
    port.wte.embedding[...] = source.wte.weight.detach().numpy()
    report = check_port(source, port, models.token_ids())
    assert not report.transfer.copied and report.passed, format_report(report)


def test_untied_embeddings_are_named_by_the_lint_and_by_the_gradients():
    report = check_port(lm(), models.FlaxLM(tied=False), models.token_ids(), grads=True, probes=False)
    assert report.lint == [Untied("head.weight", "wte.weight")]
    assert line(report.lint[0], report.sides) == (  # the sentence it prints
        "head.weight: tied to wte.weight in torch, a parameter of its own in jax "
        "(untied: equal once copied, they part as soon as either is trained; --grads shows it)"
    )
    outputs = [row for row in report.rows if row.section == "output"]
    assert all(row.passed for row in outputs) and report.first_failure.name == "wte.weight", format_report(report)


def test_a_library_rmsnorm_epsilon_is_linted_and_probed():
    report = check_port(lm(), models.FlaxLM(eps=1e-5), models.token_ids(), dtype="float64")
    assert report.lint == [LintDifference("norm", "LlamaRMSNorm", "eps", 1e-6, 1e-5)]  # a type of its own: its eps is read all the same
    assert report.first_failure.name == "norm"
    assert (report.probes[0].switch, report.probes[0].outcome, report.probes[0].row) == (Switch("eps", "norm", 1e-6, 1e-5), "closes", "norm")


def test_same_padding_is_explicit_padding_and_batchnorm_statistics_are_copied():
    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((3, 3, 7, 9)).astype(np.float32)  # (B, C, H, W)
    report = check_port(models.TorchConvNet(), models.FlaxConvNet(), x, target_inputs=x.transpose(0, 2, 3, 1), dtype="float64")
    assert report.passed and not report.lint, format_report(report)
    assert [row.note for row in report.rows][:2] == ["compared channels-last", "compared channels-last"]
    assert set(report.transfer.paired) >= {"bn.running_mean", "bn.running_var"}


def test_same_pads_by_the_input_size_as_xla_does():
    for n, k, s, d in itertools.product(range(4, 13), range(1, 5), range(1, 4), range(1, 3)):
        assert [same_pads(k, s, d, n % s)] == lax.padtype_to_pads((n,), (d * (k - 1) + 1,), (s,), "SAME"), (n, k, s, d)
    assert resolve_same((3, 1), (1, 2), (1, 1)) == ((1, 1), (0, 0)) and resolve_same((3, 3), (2, 2), (1, 1)) is None


@pytest.mark.parametrize(
    "given, expected",
    [
        ("VALID", ((0, 0), (0, 0))),
        ("same", ((1, 1), (1, 1))),  # stride 1: a fixed padding, in either case
        ("CIRCULAR", "CIRCULAR"),  # no torch padding of numbers: named
        (2, ((2, 2), (2, 2))),
        ([1, 2], ((1, 1), (2, 2))),  # Flax: an int per axis
        ([(0, 1), (np.int64(2), 3)], ((0, 1), (2, 3))),  # Flax's pairs, Equinox's (NumPy ints too)
    ],
)
def test_a_jax_librarys_conv_padding_is_said_as_torchs_low_high_pairs_per_axis(given, expected):
    assert explicit(given, 2, (1, 1), (1, 1), (3, 3)) == expected
    assert explicit("SAME", 2, (2, 2), (1, 1), (3, 3)) == "SAME"  # by the input's size at stride 2: named


def strided(kernel: int, padding, port_padding):
    """A torch conv of stride 2 and its NNX port, (B, 3, H, W) -> (B, 4, H', W')."""
    torch.manual_seed(0)
    port = nnx.Conv(3, 4, (kernel, kernel), strides=2, padding=port_padding, rngs=nnx.Rngs(0))
    return torch.nn.Conv2d(3, 4, kernel, stride=2, padding=padding), port


SAME_AT_2 = (
    "(the model): Conv padding ((1, 1), (1, 1)) in torch, 'SAME' in jax ('SAME' at stride 2 pads by the input's size: "
    "(0, 1) where it is even, (1, 1) where it is odd; torch pads the same on every size)"
)


@pytest.mark.parametrize(("height", "width", "parts"), [(8, 10, True), (7, 9, False)])
def test_same_padding_at_stride_2_is_named_by_the_lint_and_fails_where_the_size_is_even(height, width, parts):
    x = np.random.default_rng(0).standard_normal((3, 3, height, width)).astype(np.float32)
    report = check_port(*strided(3, 1, "SAME"), x, target_inputs=x.transpose(0, 2, 3, 1), dtype="float64")
    assert [(finding.path, finding.setting, finding.same is not None) for finding in report.lint] == [("", "padding", True)]
    assert report.passed is not parts
    assert [line(finding, report.sides) for finding in report.lint] == [SAME_AT_2]
    if parts:  # every output pixel looks one pixel further down and right
        assert report.first_failure.name == "(model output)" and report.first_failure.abs_diff > 0.1
        assert (report.probes[-1].switch, report.probes[-1].outcome) == (Switch("padding", "", ((1, 1), (1, 1)), "SAME"), "closes"), report.probes
    else:  # an odd size pads alike: this batch agrees, the next even-sized one would not
        assert report.first_failure is None, format_report(report)


def test_same_padding_of_a_kernel_no_wider_than_its_stride_is_torchs_padding_0():
    x = np.random.default_rng(0).standard_normal((3, 3, 8, 10)).astype(np.float32)
    report = check_port(*strided(1, 0, "SAME"), x, target_inputs=x.transpose(0, 2, 3, 1), dtype="float64")
    assert report.passed and not report.lint, format_report(report)
