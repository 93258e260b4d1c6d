"""A port whose layers are stacked on a leading axis and scanned is paired and compared layer by
layer: its stacked parameters with the reference's list (h.1.fc.weight is slice 1 of h.fc.weight),
copied into when fresh, every layer's calls a row of its own named as the reference names them
(h.1.fc), a gradient row per layer's parameter, and a bug in one layer named at that layer; for
nnx.scan, jax.lax.scan over an nnx.split state (in a library's own module around the stack too),
Linen's nn.scan and Equinox's jax.lax.scan; the name map a check writes, given back, pairs as before. A scan
over anything but the parameters (an RNN's over time) runs whole; a torch bidirectional LSTM pairs
with nnx.Bidirectional's two cells."""

import numpy as np
import pytest
import torch

from mhsa.port_check import check_port, format_report
from tests.tiers import first_fast
from tests.tools.port_check import scan_models as sm

LAYERS = [f"h.{i}.{name}" for i in range(sm.L) for name in ("ln", "fc")] + [f"h.{i}" for i in range(sm.L)]
PORTS = {
    "nnx.scan": lambda: sm.NNXStack("scan"),
    "jax.lax.scan": lambda: sm.NNXStack("split"),
    "nn.scan": sm.linen,
    "equinox": sm.EqxStack,
    "wrapped": lambda: sm.NNXStack("wrapped"),
}


@pytest.mark.parametrize("style", first_fast(list(PORTS)))
def test_every_layer_of_a_scanned_port_is_a_row_and_every_layers_parameter_a_gradient(style):
    report = check_port(sm.reference(), PORTS[style](), sm.inputs(), grads=True)
    text = format_report(report)
    assert report.passed and report.transfer.copied and not report.transfer.port_left, text
    rows = {row.name for row in report.rows if row.section == "output"}
    assert set(LAYERS) <= {name.partition("[")[0] for name in rows}, text
    assert {row.name for row in report.rows if row.section == "gradient"} == set(sm.reference().state_dict()), text
    root = "h._stacked" if style == "wrapped" else "h"  # a library's module around its stack: one level more
    assert (
        report.transfer.renamed == {"h.{i}": f"{root}[{{i}}]"}
        and f"  transform: h.{{i}}.fc.weight (8, 8) -> {root}.fc.weight[{{i}}] for each of the 3 layers" in text
    ), text


@pytest.mark.parametrize("style", ["wrapped", "nnx.scan"])
def test_the_name_map_a_check_wrote_given_back_pairs_every_layers_calls_as_before(style):
    # the map --write-map writes for a stack pairs each layer's parameters with a slice: no module renamed whole
    found = check_port(sm.reference(), PORTS[style](), sm.inputs(), probes=False).name_map
    report = check_port(sm.reference(), sm.NNXStack(style.removeprefix("nnx."), broken_layer=1), sm.inputs(), probes=False, name_map=dict(found))
    assert report.transfer.renamed == {} and report.first_failure.name == "h.1", format_report(report)
    assert set(LAYERS) <= {row.name for row in report.rows}, format_report(report)


@pytest.mark.parametrize("style", first_fast(["nnx.scan", "jax.lax.scan"]))
def test_a_bug_in_one_scanned_layer_is_named_at_that_layer(style):
    report = check_port(sm.reference(), sm.NNXStack("scan" if style == "nnx.scan" else "split", broken_layer=1), sm.inputs(), probes=False)
    assert report.first_failure is not None and report.first_failure.name == "h.1", format_report(report)  # its residual doubled
    assert all(row.passed for row in report.rows if row.name.startswith("h.0") or row.name in ("h.1.ln", "h.1.fc")), format_report(report)
    assert any(hint.kind == "enters" and hint.before == "h.1.fc" for hint in report.hints), report.hints


@pytest.mark.slow
def test_a_converted_stack_holding_one_layer_transposed_is_named_at_that_slice():
    reference, port = sm.reference(), sm.NNXStack("scan")
    state = {name: value.detach().numpy() for name, value in reference.state_dict().items()}
    for name, stacked in (("ln", ("weight", "bias")), ("fc", ("weight", "bias"))):
        for leaf in stacked:
            layers = np.stack([state[f"h.{i}.{name}.{leaf}"] for i in range(sm.L)])
            if name == "fc" and leaf == "weight":
                layers = layers.transpose(0, 2, 1)  # (L, in, out): Flax's kernels
                layers[2] = layers[2].T  # the converter's bug: layer 2's kernel left untransposed
            getattr(getattr(port.h, name), {"weight": "kernel" if name == "fc" else "scale", "bias": "bias"}[leaf])[...] = layers
    port.out.kernel[...], port.out.bias[...] = state["out.weight"].T, state["out.bias"]
    report = check_port(reference, port, sm.inputs(), probes=False)
    assert not report.transfer.copied and [(d.name, d.how) for d in report.transfer.differing] == [("h.2.fc.weight", "holds its transpose")]
    assert report.first_failure.name == "h.2.fc", format_report(report)


@pytest.mark.slow
def test_an_rnn_scanned_over_time_runs_whole_and_a_bidirectional_lstm_pairs_with_both_cells():
    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((3, 5, 7)).astype(np.float32)
    report = check_port(sm.TorchBidirectional().eval(), sm.NNXBidirectional(), x, grads=True)
    text = format_report(report)
    assert report.passed and "lstm.weight_ih_l0_reverse (24, 7) -> lstm.backward_rnn.cell.ii.weight" in text, text
    assert not any("cell" in row.name for row in report.rows), text  # the cells' calls inside the scan over time are not rows
