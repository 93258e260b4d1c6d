"""copy_weights: a reference's weights copied into a fresh port by the check's own pairing and layout
rules, so that the port check then passes on the port as it holds them (NNX, Linen, weight norm
and conventional renames, a converter's leftovers), names that do not correspond refused in one
line with the map to pass, and format_transfer saying what was done."""

import json

import jax
import numpy as np
import pytest

from mhsa.port_check import PortCheckError, check_port, copy_weights, format_report, format_transfer
from tests.tools.port_check import library_models as lib
from tests.tools.port_check import models


def test_an_nnx_port_holds_the_references_weights_and_passes_the_check_as_it_holds_them():
    reference, fresh = models.TorchMLP(), models.NNXMLP()
    port, transfer = copy_weights(reference, fresh, models.activations())
    assert port is fresh and len(transfer.filled) == 6 and not transfer.unconsumed_source and not transfer.unconsumed_target
    report = check_port(reference, port, models.activations(), transfer=False, grads=True)
    assert report.passed and not report.transfer.copied, format_report(report)  # the port's own weights, checked
    assert format_transfer(transfer).splitlines()[:2] == ["weights: 6 parameters copied torch -> jax", "  copied by copy_weights"]


def test_a_linen_port_comes_back_as_a_new_pair_and_its_leftovers_are_said_unread():
    reference = lib.TorchSeq2Seq().eval()
    module, variables = lib.converted_seq2seq(reference)
    scrambled = jax.tree.map(lambda leaf: leaf * 0.5, variables)  # other values, same structure
    port, transfer = copy_weights(reference, (module, scrambled), lib.seq2seq_inputs())
    assert isinstance(port, tuple) and port[0] is module
    assert sorted(transfer.unread_target) == ["decoder.embed_tokens.weight", "encoder.embed_tokens.weight"], transfer.unread_target
    assert "never read by jax's forward pass: encoder.embed_tokens.weight" in format_transfer(transfer)
    report = check_port(reference, port, lib.seq2seq_inputs(), transfer=False)
    assert report.passed, format_report(report)


def test_weight_norm_and_a_renamed_norm_weight_are_copied_as_they_pair():
    reference = lib.TorchWeightNormed().eval()
    port, transfer = copy_weights(reference, lib.FlaxWeightNormed(), lib.sequences())
    assert {pair.reference: pair.port for pair in transfer.filled}["norm.weight"] == "norm.scale"
    assert check_port(reference, port, lib.sequences(), transfer=False).passed


def test_names_that_do_not_correspond_are_refused_with_the_map_to_pass_and_the_map_works():
    reference = models.TorchNamed()
    with pytest.raises(PortCheckError, match=r"nothing was copied.*name_map=\{") as refused:
        copy_weights(reference, models.FlaxRenamed(), models.activations())
    assert "\n" not in str(refused.value)
    proposed = json.loads(str(refused.value).rpartition("name_map=")[2])  # the JSON object as printed
    port, transfer = copy_weights(reference, models.FlaxRenamed(), models.activations(), name_map=proposed)
    assert not transfer.unconsumed_source and check_port(reference, port, models.activations(), transfer=False, name_map=proposed).passed


def test_the_copy_keeps_the_ports_dtype():
    reference, fresh = models.TorchMLP().double(), models.NNXMLP()
    port, _ = copy_weights(reference, fresh, models.activations().astype(np.float64))
    assert port.fc1.kernel[...].dtype == np.float32
