"""What keeps a large model's check within its time and memory (benchmarks/port_check_scale.py):
reductions in blocks that equal the whole-array ones, no copy of a model or its weights that the
check does not need, one pass per side for outputs and gradients, and the user's models left as
they were (their weights and their .grad)."""

import numpy as np
import pytest
import torch

from examples import flax_block, torch_block
from mhsa.port_check import check_port, flax_reader, format_report, torch_reader
from mhsa.port_check.chunks import blocks, dot, largest, within
from mhsa.port_check.weights import how_it_differs
from shared.tolerances import max_abs_diff


@pytest.mark.parametrize("shape", [(7,), (3, 5, 11), (2, 1, 13, 3), (0, 4), (1, 40)])
def test_blocks_cover_every_element_once_and_the_largest_of_blocks_is_the_whole_arrays(shape):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(shape), rng.standard_normal(shape).astype(np.float32)
    if a.size:
        a.flat[a.size // 2], b.flat[-1] = np.nan, np.inf  # the NaN and infinity rules of max_abs_diff hold block by block
    seen = np.zeros(shape, dtype=int)
    for index in blocks(shape, size=6):
        seen[index] += 1
        assert seen[index].size <= max(6, shape[-1] if shape else 1)
    assert (seen == 1).all()
    assert largest(max_abs_diff, a, b, size=6) == max_abs_diff(a, b)
    assert within(max_abs_diff, 1e300, a[..., :0], b[..., :0], size=6)


def test_a_broadcast_comparison_in_blocks_is_the_whole_ones_and_dot_accumulates_in_float64():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((1, 7, 5)), rng.standard_normal((3, 7, 5))
    assert largest(max_abs_diff, a, b, size=4) == max_abs_diff(np.broadcast_to(a, b.shape), b)
    x = rng.standard_normal((9, 13)).astype(np.float32)
    assert dot(x, x, size=5) == pytest.approx(float(np.vdot(x.astype(np.float64), x.astype(np.float64))), rel=1e-15)


def test_a_reordering_is_found_across_blocks(monkeypatch):
    from mhsa.port_check import weights

    monkeypatch.setattr(weights, "BLOCK", 8)  # rows compared a few at a time
    weight = np.random.default_rng(0).standard_normal((40, 3))
    order = np.random.default_rng(1).permutation(40)
    found = how_it_differs(weight, weight[order], 1e-6)
    assert found.startswith(f"holds the reference's rows in another order (the port's rows 0, 1, 2, ... are its {order[0]}, {order[1]}")
    assert how_it_differs(weight, weight[order] + 1e-3, 1e-6) is None


def test_a_model_already_in_the_dtype_is_checked_as_it_is_and_keeps_its_gradients():
    torch.manual_seed(0)
    source = torch_block.Block().eval()
    assert torch_reader.cast(source, "float32")[0] is source  # no copy of a large model's weights
    marked = {name: torch.full_like(p, 7.0) for name, p in source.named_parameters()}
    for name, p in source.named_parameters():
        p.grad = marked[name].clone()
    before = {name: p.detach().clone() for name, p in source.named_parameters()}
    port = flax_block.block()[0]
    shared = flax_reader.parameters(flax_reader.cast(port, "float32")[0])
    assert all(np.shares_memory(value, shared[name]) for name, value in flax_reader.parameters(port).items())  # a copy of the structure only
    port_before = flax_reader.parameters(port)
    port_before = {name: value.copy() for name, value in port_before.items()}
    report = check_port(source, port, torch_block.example_inputs(), grads=True)
    assert report.transfer.copied and report.passed, format_report(report)
    for name, p in source.named_parameters():
        assert torch.equal(p, before[name]) and torch.equal(p.grad, marked[name]), name
    for name, value in flax_reader.parameters(port).items():  # the fresh port the check copied into is a copy
        assert np.array_equal(value, port_before[name]), name


def test_a_cast_copy_converts_each_tensor_once_and_keeps_tied_weights_tied():
    from tests.tools.port_check import models

    torch.manual_seed(0)
    source = models.TorchLM()
    copy, _ = torch_reader.cast(source, "float64")
    assert copy is not source and all(p.dtype == torch.float64 for p in copy.parameters())
    assert all(p.dtype == torch.float32 for p in source.parameters())
    assert torch_reader.tied(copy) == torch_reader.tied(source) == {"head.weight": "wte.weight"}


def test_the_readers_hand_out_read_only_views_of_the_weights():
    torch.manual_seed(0)
    source = torch_block.Block()
    for params in (torch_reader.parameters(source), flax_reader.parameters(flax_block.block()[0])):
        value = next(iter(params.values()))
        with pytest.raises(ValueError, match="read-only"):
            value[...] = 0
