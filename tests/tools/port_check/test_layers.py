"""Layers as libraries write them, which the port check was not written around: a Conv1D that
stores a linear weight (in, out), a head tied to the embedding, an RMSNorm whose epsilon is
called variance_epsilon, a 'SAME' convolution against explicit padding with BatchNorm in eval."""

import numpy as np
import torch

from mhsa.port_check import check_port, format_report
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
    assert ("c_mix.weight", "c_mix.weight", (24, 24), True) in report.transfer.filled  # the square one follows its layer type
    assert "tied in torch: head.weight is wte.weight (one parameter, paired once)" in report.notes
    assert not report.transfer.unconsumed_source


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
    assert report.lint == [
        "head.weight: tied to wte.weight in torch, a parameter of its own in jax "
        "(untied: equal once copied, they part as soon as either is trained; --grads shows it)"
    ]
    outputs = [row for row in report.rows if row.section == "output"]
    assert all(row.passed for row in outputs) and report.first_failure.name == "wte.weight", format_report(report)


def test_a_library_rmsnorm_epsilon_is_linted_and_probed():
    report = check_port(lm(), models.FlaxLM(eps=1e-5), models.token_ids(), dtype="float64")
    assert report.lint == ["norm: LlamaRMSNorm eps 1e-06 in torch, 1e-05 in jax"]  # a type of its own: its eps is read all the same
    assert report.first_failure.name == "norm"
    assert report.probes[0].startswith("probe: the eps of 'norm' set to torch's 1e-06 (was 1e-05): closes the gap at 'norm'"), report.probes


def test_same_padding_is_explicit_padding_and_batchnorm_statistics_are_copied():
    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((3, 3, 7, 9)).astype(np.float32)  # (B, C, H, W)
    report = check_port(models.TorchConvNet(), models.FlaxConvNet(), x, target_inputs=x.transpose(0, 2, 3, 1), dtype="float64")
    assert report.passed and not report.lint, format_report(report)
    assert [row.note for row in report.rows][:2] == ["compared channels-last", "compared channels-last"]
    assert {name for name, *_ in report.transfer.filled} >= {"bn.running_mean", "bn.running_var"}
