"""copy_weights: a reference's weights copied into a fresh port by the check's own pairing and layout
rules, so that the port check then passes on the port as it holds them (NNX, Linen, weight norm
and conventional renames, a converter's leftovers), names that do not correspond refused in one
line with the map to pass, and format_transfer saying what was done."""

import jax
import numpy as np
import pytest

from mhsa.port_check import PortCheckError, check_port, copy_weights, format_report, format_transfer
from tests.tools.port_check import library_models as lib
from tests.tools.port_check import models
from tests.tools.port_check.test_library_models import TwoScales


def test_an_nnx_port_holds_the_references_weights_and_passes_the_check_as_it_holds_them():
    reference, fresh = models.TorchMLP(), models.NNXMLP()
    port, transfer = copy_weights(reference, fresh, models.activations())
    assert port is fresh and len(transfer.paired) == 6 and not transfer.reference_left and not transfer.port_left
    report = check_port(reference, port, models.activations(), transfer=False, grads=True)
    assert report.passed and not report.transfer.copied, format_report(report)  # the port's own weights, checked
    assert format_transfer(transfer).splitlines()[:2] == ["weights: 6 parameters copied torch -> jax", "  copied by copy_weights"]


def test_a_linen_port_comes_back_as_a_new_pair_and_its_leftovers_are_said_unread():
    reference = lib.TorchSeq2Seq().eval()
    module, variables = lib.converted_seq2seq(reference)
    scrambled = jax.tree.map(lambda leaf: leaf * 0.5, variables)  # other values, same structure
    port, transfer = copy_weights(reference, (module, scrambled), lib.seq2seq_inputs())
    assert isinstance(port, tuple) and port[0] is module
    assert sorted(transfer.port_unread) == ["decoder.embed_tokens.weight", "encoder.embed_tokens.weight"], transfer.port_unread
    assert "never read by jax's forward pass: encoder.embed_tokens.weight" in format_transfer(transfer)
    report = check_port(reference, port, lib.seq2seq_inputs(), transfer=False)
    assert report.passed, format_report(report)


def test_weight_norm_and_a_renamed_norm_weight_are_copied_as_they_pair():
    reference = lib.TorchWeightNormed().eval()
    port, transfer = copy_weights(reference, lib.FlaxWeightNormed(), lib.sequences())
    assert {group.reference[0]: group.port[0] for group in transfer.groups}["norm.weight"] == "norm.scale"
    assert check_port(reference, port, lib.sequences(), transfer=False).passed


def test_renamed_modules_pair_by_structure_and_a_choice_structure_leaves_open_is_refused_in_one_line():
    reference = models.TorchNamed()
    port, transfer = copy_weights(reference, models.FlaxRenamed(), models.activations())  # norm, fc1, fc2 as ln, dense1, dense2
    assert transfer.renamed == {"norm": "ln", "fc1": "dense1", "fc2": "dense2"} and not transfer.reference_left
    assert check_port(reference, port, models.activations(), transfer=False).passed
    two = lib.FlaxWeightNormed()
    two.norm = TwoScales()
    with pytest.raises(PortCheckError) as refused:
        copy_weights(lib.TorchWeightNormed().eval(), two, lib.sequences())
    assert str(refused.value) == (
        "1 could pair several ways: norm.weight -> norm.gamma or norm.scale, so nothing was copied: pass a name_map that pairs them"
    )


def test_the_copy_keeps_the_ports_dtype():
    reference, fresh = models.TorchMLP().double(), models.NNXMLP()
    port, _ = copy_weights(reference, fresh, models.activations().astype(np.float64))
    assert port.fc1.kernel[...].dtype == np.float32
