"""Outputs of any shape and structure, and keyword inputs.

Position embeddings computed once for the batch, (1, T, D), against per row, (B, T, D), are
compared after broadcasting, and a real bug further on is still named at its own module; shapes
that cannot broadcast fail as a shape. Outputs that are a ModelOutput-like OrderedDict, a
dataclass, a dict, tuples mixing tensors with None and ints are flattened alike for capture,
comparison and gradients; keyword inputs reach both models."""

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from mhsa.cli import main as mhsa
from mhsa.port_check import check_port, format_report
from tests.tools.port_check import models


def test_position_embeddings_computed_once_for_the_batch_are_compared_after_broadcasting():
    torch.manual_seed(0)
    report = check_port(models.TorchPositions(), models.FlaxPositions(), models.token_ids())
    assert report.passed, format_report(report)
    wpe = next(row for row in report.rows if row.name == "wpe")
    assert wpe.note == "compared after broadcasting: (1, 5, 24) in torch, (3, 5, 24) in jax" and wpe.abs_diff == 0.0


def test_a_bug_after_broadcast_position_embeddings_is_named_at_its_own_module():
    torch.manual_seed(0)
    report = check_port(models.TorchPositions(), models.FlaxPositions(bug="gelu"), models.token_ids())
    assert report.first_failure.name == "proj", format_report(report)
    assert "FAIL: the models part at output 'proj' (Linear)" in format_report(report)


def test_outputs_equal_up_to_a_reshape_are_compared_after_it_and_the_row_says_how():
    from mhsa.port_check.forward.rows import compare_arrays

    rng = np.random.default_rng(0)
    fused = rng.standard_normal((2, 5, 72))  # torch's qkv (B, T, 3D) against a (B, T, 3, H, d_head) LinearGeneral's
    assert compare_arrays(fused, fused.reshape(2, 5, 3, 4, 6), ("torch", "jax"))[:4] == (
        0.0,
        0.0,
        "",
        "compared after a reshape ((2, 5, 72) as (2, 5, 3, 4, 6))",
    )
    normed = rng.standard_normal((3, 12, 35))  # a GroupNorm's (B, C, H*W) in torch against (B, H, W, C) in Flax
    nhwc = normed.transpose(0, 2, 1).reshape(3, 5, 7, 12)
    assert compare_arrays(normed, nhwc, ("torch", "jax"))[:4] == (
        0.0,
        0.0,
        "",
        "compared channels-last after a reshape ((3, 12, 35) as (3, 5, 7, 12))",
    )
    # a port that differs is read the same way, and fails by its own numbers, not as a shape
    abs_diff, _, status, note = compare_arrays(normed, nhwc + 0.5, ("torch", "jax"))
    assert (status, note) == ("", "compared channels-last after a reshape ((3, 12, 35) as (3, 5, 7, 12))") and abs_diff == pytest.approx(0.5)
    # heads split the other way round mix the heads with their channels: no reshape reads them
    assert compare_arrays(rng.standard_normal((3, 5, 24)), rng.standard_normal((5, 3, 24)), ("torch", "jax"))[2] == "shape"


def test_shapes_that_cannot_broadcast_fail_as_a_shape_never_as_inf():
    from mhsa.port_check.forward.rows import compare_arrays

    abs_diff, _, status, note = compare_arrays(np.zeros((3, 5)), np.zeros((3, 7)), ("torch", "jax"))
    assert status == "shape" and note == "shape (3, 5) in torch, (3, 7) in jax: no reshape or broadcast joins them" and np.isnan(abs_diff)
    # a channels-first reference against a channels-last port is compared channels-last, as their layouts say
    first, last = (0, 1, 2), (0, 2, 1)
    assert compare_arrays(np.ones((3, 4, 9)), np.ones((3, 9, 4)), ("torch", "jax"), (first, last))[2:] == ("", "compared channels-last")
    # and at C = L too, where both layouts have one shape: the layouts decide, not the shapes
    x = np.random.default_rng(0).standard_normal((3, 4, 4))
    assert compare_arrays(x, x.transpose(0, 2, 1), ("torch", "jax"), (first, last))[:3] == (0.0, 0.0, "")
    assert compare_arrays(x, x.transpose(0, 2, 1), ("torch", "jax"))[0] > 0  # without layouts: as they are


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_model_outputs_and_dataclasses_with_none_and_ints_are_compared_leaf_by_leaf_with_keyword_inputs(dtype):
    torch.manual_seed(0)
    report = check_port(models.TorchStructured(), models.FlaxStructured(), models.keyword_inputs(), dtype=dtype, grads=True)
    assert report.passed, format_report(report)
    outputs = [row.name for row in report.rows if row.section == "output"]
    assert outputs == [
        "layers.0.dense",
        "layers.0[0]",
        "layers.1.dense",
        "layers.1[0]",
        "head",
        "(model output)[logits]",
        "(model output)[hidden_states][0]",
        "(model output)[hidden_states][1]",
    ]
    assert len([row for row in report.rows if row.section == "gradient"]) == 6
    skipped = next(note for note in report.notes if note.kind == "not floats")
    assert skipped.names[:2] == (("layers.0[1]", "NoneType"), ("layers.0[2]", "int")) and len(skipped.names) == 6, skipped


def test_a_planted_bug_in_a_structured_model_is_named_at_its_layer():
    torch.manual_seed(0)
    report = check_port(models.TorchStructured(), models.FlaxStructured(bug="mask"), models.keyword_inputs(), grads=True)
    assert report.first_failure.name == "layers.1[0]", format_report(report)
    assert any(hint.kind == "enters" and hint.path == "layers.1" for hint in report.hints), report.hints
    # the leaves of one call are not steps of the computation: no growth is read between them
    assert not any(hint.kind == "grows" and hint.before.endswith("[hidden_states][0]") for hint in report.hints), report.hints


def test_a_linen_port_returning_a_dict_is_compared_and_differentiated_too():
    torch.manual_seed(0)
    inputs = models.keyword_inputs()
    module = models.LinenStructured()
    variables = module.init(jax.random.key(0), inputs["x"], mask=inputs["mask"])
    name_map = {"layers.0.dense": "layers_0_dense", "layers.1.dense": "layers_1_dense"}
    report = check_port(models.TorchStructured(), (module, variables), inputs, name_map=name_map, grads=True)
    by_name = {row.name: row for row in report.rows}
    assert by_name["(model output)[logits]"].passed and by_name["(model output)[hidden_states][1]"].passed, format_report(report)
    assert all(row.passed for row in report.rows if row.section == "gradient"), format_report(report)


def test_grads_on_a_dict_like_output_through_the_command(capsys):
    factories = ["tests.tools.port_check.models:torch_structured", "tests.tools.port_check.models:flax_structured"]
    assert mhsa(["port-check", *factories, "--grads", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert "| grad head.weight " in out and "PASS: 6 of 6 parameters paired, all 14 comparisons (8 outputs)" in out


class IdsOnly(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(models.D, models.V)

    def forward(self, x):
        return {"ids": self.fc(x).argmax(-1), "count": 3}


class IdsOnlyFlax(nnx.Module):
    def __init__(self):
        self.fc = nnx.Linear(models.D, models.V, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return {"ids": self.fc(x).argmax(-1), "count": 3}


def test_an_output_with_no_floating_point_leaf_cannot_be_differentiated_and_says_so_in_one_line():
    from mhsa.port_check import PortCheckError

    report_error = (
        "running and differentiating the reference (torch) on the inputs ((3, 5, 24) float32) failed: "
        "ValueError: the model's output holds no floating-point tensor to differentiate"
    )
    with pytest.raises(PortCheckError, match=report_error.replace("(", r"\(").replace(")", r"\)")):
        check_port(IdsOnly(), IdsOnlyFlax(), models.activations(), grads=True)
