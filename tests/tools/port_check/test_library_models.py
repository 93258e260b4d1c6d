"""The classes of model that popular libraries ship, on which a port check once gave a faithful
port a false FAIL (library_models.py holds a small pair of each): a fresh final LayerNorm under
--grads, a Flax side that rounds more than torch, a converter's leftovers, C = H = W, a
deterministic table, a computation split at another module boundary (and differences that only
look healed: one reader of two blind to them, a zero-initialized projection), weight norm and renamed
weights, attention weights one side returns as None. Each faithful pair passes; a bug in each
is still named where it is."""

import numpy as np
import pytest
import torch
from flax import nnx

from mhsa.port_check import check_port, format_report
from mhsa.port_check.core.findings import Note, Untied
from mhsa.port_check.core.structure import as_inputs
from mhsa.port_check.readers.torch import reader as torch_reader
from mhsa.port_check.report.findings import line
from shared.tolerances import K
from tests.tools.port_check import library_models as lib


def _rows(report, section="output"):
    return {row.name: row for row in report.rows if row.section == section}


def test_gradients_behind_a_fresh_final_layernorm_are_taken_along_a_random_direction_and_an_exact_zero_is_said():
    # the features of a LayerNorm with weight 1 and bias 0 sum to 0 in every row: d sum(output) is 0
    report = check_port(lib.TorchEncoder().eval(), lib.FlaxEncoder(), lib.token_ids(), grads=True)
    text = format_report(report)
    assert report.passed and not any(note.kind == "apart" for note in report.notes), text
    grads = _rows(report, "gradient")
    # softmax ignores what a key's bias adds to every score of a row: that gradient alone is 0
    assert [name for name, row in grads.items() if row.zero] == ["k.bias"], text
    assert "| grad k.bias " in text and text.split("| grad k.bias ")[1].split("\n")[0].rstrip().endswith("| zero   |")
    assert all(row.scale > 1e-2 for name, row in grads.items() if name != "k.bias"), text  # the direction's gradient is a number


@pytest.mark.parametrize(("eps", "passes"), [(1e-5, True), (1e-3, False)])
def test_a_port_whose_float32_rounds_more_than_the_references_is_held_to_its_own_error_and_a_bug_still_fails(eps, passes):
    # Flax's LayerNorm computes the variance as E[x^2] - E[x]^2: on features far from 0 it rounds far more than torch's
    port = lib.FlaxNormed()
    port.norm.epsilon = eps
    report = check_port(lib.TorchNormed().eval(), port, lib.activations(), grads=True, probes=False)
    assert report.passed is passes and report.port_twin, format_report(report)
    if passes:  # rows the reference's error alone would fail
        rescued = [row for row in report.rows if row.port_error > row.reference_error and row.abs_diff > K * row.reference_error]
        assert rescued and report.port_sets >= len(rescued), format_report(report)
    else:
        assert report.first_failure.name == "norm", format_report(report)


def test_a_converters_leftovers_are_not_parameters_and_one_embedding_module_used_twice_is_tying():
    reference = lib.TorchSeq2Seq().eval()
    for grads in (False, True):
        report = check_port(reference, lib.converted_seq2seq(reference), lib.seq2seq_inputs(), grads=grads)
        assert report.passed and not report.lint and not report.transfer.copied, format_report(report)
        assert (report.notes[0].kind, report.notes[0].side, len(report.notes[0].names)) == ("unread", "port", 2), report.notes


def test_an_untied_port_is_a_lint_warning_until_the_gradients_part():
    reference = lib.TorchSeq2Seq().eval()
    untied = lib.converted_seq2seq(reference, untie=True)
    report = check_port(reference, untied, lib.seq2seq_inputs())
    assert report.passed and report.lint[0] == Untied("decoder.embed_tokens.weight", "shared.weight"), report.lint
    assert "; warning: 1 setting(s) differ (lint above) that no output shows on this batch" in format_report(report)
    report = check_port(reference, untied, lib.seq2seq_inputs(), grads=True, probes=False)
    assert report.first_failure.section == "gradient" and report.first_failure.name == "shared.weight", format_report(report)


@pytest.mark.parametrize(("bug", "parts_at"), [("", None), ("transposed", "conv2")])
def test_at_c_equal_h_equal_w_layouts_come_from_what_computed_each_output_not_from_shapes(bug, parts_at):
    x = lib.images()
    report = check_port(lib.TorchConvNet().eval(), lib.FlaxConvNet(bug), x, target_inputs=x.transpose(0, 2, 3, 1), grads=True, probes=False)
    rows = _rows(report)
    assert rows["conv1"].note == "compared channels-last" and rows["head"].note == "", format_report(report)
    if parts_at is None:
        assert report.passed and not report.lint, format_report(report)
    else:  # the second conv reads its map with H and W swapped: same shape, other values
        assert report.first_failure.name == parts_at, format_report(report)


class TorchKeywordPermutations(torch.nn.Module):
    """A conv map permuted by arguments given by keyword, as library code may write them."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(lib.C, 5, 3)

    def forward(self, x):
        y = self.conv(x)
        keyword = (y.transpose(1, dim1=3), torch.swapaxes(y, 1, axis1=3), y.movedim(1, destination=3), torch.permute(y, dims=(0, 2, 3, 1)))
        positional = (y.transpose(1, 3), torch.swapaxes(y, 1, 3), y.movedim(1, 3), y.permute(0, 2, 3, 1))
        return keyword + positional


def test_a_permutation_given_by_keyword_is_followed_as_its_positional_twin():
    outputs = [output for output in torch_reader.run(TorchKeywordPermutations(), as_inputs(lib.images()))[0] if output.path == ""]
    layouts = [output.layout for output in outputs]
    assert len(layouts) == 8 and layouts[:4] == layouts[4:] and None not in layouts, layouts


def test_a_frozen_sinusoidal_table_a_fresh_port_holds_too_is_no_evidence_of_a_conversion():
    report = check_port(lib.TorchTabled().eval(), lib.FlaxTabled(), lib.activations(), grads=True)
    assert report.transfer.copied and report.transfer.decision.startswith("a fresh port: none of the 2 parameters"), format_report(report)
    assert report.passed, format_report(report)
    assert Note("frozen", ("embed_positions.weight",)) in report.notes


@pytest.mark.parametrize("bug", ["", "fc2_bias"])
def test_a_computation_split_at_another_module_boundary_passes_with_a_note_and_a_later_bug_is_still_named(bug):
    report = check_port(lib.TorchScaled().eval(), lib.FlaxScaled(bug), lib.token_ids(), grads=True, probes=False)
    split = _rows(report)["embed_tokens"]
    assert split.boundary.startswith("differs (the port's is the reference's scaled by 0.204124 (1/sqrt(24))), but 'norm', computed from it, agrees")
    assert report.passed is (bug == ""), format_report(report)
    if bug:
        assert report.first_failure.name == "(model output)" and "1 split at another module boundary" not in format_report(report)
    else:
        assert "1 split at another module boundary (notes above)" in format_report(report)


@pytest.mark.parametrize(("bug", "parts_at"), [("", None), ("shifted:time", "time"), ("shifted:proj", "proj")])
def test_a_difference_one_reader_cannot_see_and_another_carries_is_no_split(bug, parts_at):
    # the norm reading `time` is blind to a shift of all its features: the projection reading it is not
    reference = lib.TorchTwoReaders().eval()
    port = lib.converted_linears(reference, lib.FlaxTwoReaders(), bug)
    report = check_port(reference, port, lib.activations(), probes=False)
    text = format_report(report)
    if parts_at is None:
        assert report.passed, text
    else:
        assert report.first_failure.name == parts_at and not any(row.boundary for row in report.rows), text


def test_a_difference_read_only_by_a_zero_initialized_projection_is_no_split():
    # the zero projection's output is 0 on both sides whatever `inner` computes: it shows nothing healed
    reference = lib.TorchZeroOut().eval()
    report = check_port(reference, lib.converted_linears(reference, lib.FlaxZeroOut(), "transposed:inner"), lib.activations(), probes=False)
    assert report.first_failure.name == "inner" and not report.first_failure.boundary, format_report(report)
    assert _rows(report)["(model output)"].passed


def test_a_difference_that_flows_on_is_no_split_even_when_the_next_row_is_within_its_tolerance():
    from tests.tools.port_check.test_derived import FlaxNorm, TorchNorm, inputs

    report = check_port(TorchNorm(), FlaxNorm(1e-6), inputs(), probes=False)  # eps 1e-6 for 1e-5: a small gap that 'down' carries
    assert report.first_failure.name == "ln" and not report.first_failure.boundary, format_report(report)


def test_weight_norm_and_a_norm_whose_weight_is_called_scale_pair_without_a_map():
    report = check_port(lib.TorchWeightNormed().eval(), lib.FlaxWeightNormed(), lib.sequences(), grads=True)
    paired = {group.reference[0]: group.port[0] for group in report.transfer.groups}
    assert paired == {"conv.bias": "conv.bias", "conv.weight_g": "conv.weight_g", "conv.weight_v": "conv.weight_v", "norm.weight": "norm.scale"}
    assert report.passed and not report.unmatched_source, format_report(report)


class TwoScales(lib.FlaxRMSNorm):
    """A norm with two weight-like vectors, `scale` and `gamma`: which is torch's `weight`?"""

    def __init__(self):
        super().__init__()
        self.gamma = nnx.Param(np.ones(lib.D, np.float32))

    def __call__(self, x):
        return super().__call__(x) * self.gamma[...]


def test_a_rename_with_two_choices_still_stops_with_a_proposed_map():
    port = lib.FlaxWeightNormed()
    port.norm = TwoScales()
    report = check_port(lib.TorchWeightNormed().eval(), port, lib.sequences())
    assert report.stopped and report.transfer.ambiguous == [("norm.weight", ["norm.gamma", "norm.scale"])], format_report(report)
    assert "  could pair several ways: norm.weight -> norm.gamma or norm.scale" in format_report(report)


def test_an_output_one_side_returns_as_none_is_a_note_never_a_row():
    report = check_port(lib.TorchWithWeights().eval(), lib.FlaxWithWeights(), lib.activations(), grads=True)
    assert report.passed and all("[1]" not in row.name for row in report.rows), format_report(report)
    assert Note("none", (("(model output)[1]", "None in torch, float32 in the other"),)) in report.notes
    assert "not compared, as one side returns None there: '(model output)[1]' (None in torch, float32 in the other)" in [
        line(note, report.sides) for note in report.notes
    ]  # the sentence it prints


def test_head_shaped_einsum_kernels_with_the_input_between_the_head_axes_pair_converted_and_fresh():
    reference = lib.TorchGroupedAttention().eval()
    converted = check_port(reference, lib.converted_einsum(reference), lib.activations(), grads=True)
    text = format_report(converted)
    assert converted.passed and not converted.transfer.copied, text  # the values say which of q's two interleavings the converter chose
    assert "q_proj.weight (24, 24) -> q_einsum.kernel: its rows split into (3, 8), its columns into (24,), laid out as (3, 24, 8)" in text, text
    stopped = check_port(reference, lib.FlaxEinsumAttention(), lib.activations()).stopped  # fresh: (24, 24) fits (3, 24, 8) two ways
    assert stopped == "1 parameter of the reference (torch) pairs with none of the port's (jax): q_proj.weight", stopped
    fresh = check_port(reference, lib.FlaxEinsumAttention(), lib.activations(), grads=True, name_map={"q_proj.weight": "q_einsum.kernel"})
    assert fresh.passed and fresh.transfer.copied, format_report(fresh)  # an entry naming the parameter takes it untransposed
