"""What keeps a large model's check within its time and memory (benchmarks/port_check_scale.py):
reductions in blocks that equal the whole-array ones, no copy of a model or its weights that the
check does not need, one pass per side for outputs and gradients, and the user's models left as
they were (their weights and their .grad)."""

import numpy as np
import pytest
import torch

from examples import flax_block, torch_block
from mhsa.port_check import check_port, format_report
from mhsa.port_check.core.chunks import blocks, dot, equal, largest, varies, within
from mhsa.port_check.forward.weights import how_it_differs
from mhsa.port_check.readers.flax import reader as flax_reader
from mhsa.port_check.readers.torch import reader as torch_reader
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


def test_equal_and_varies_in_blocks_agree_with_the_whole_arrays_a_transposed_view_and_a_nan_included():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((9, 13)).astype(np.float32)
    b = np.ascontiguousarray(a.T).T  # a port's kernel read in the reference's layout: a transposed view
    assert equal(a, b, size=5) and not equal(a, b[:, ::-1], size=5) and not equal(a, a[:, :12], size=5)
    changed = a.copy()
    changed[8, 12] = np.nextafter(changed[8, 12], np.inf)  # one value one rounding away, in the last block
    assert not equal(a, changed, size=5)
    with_nan = a.copy()
    with_nan[0, 0] = np.nan
    assert not equal(with_nan, with_nan.copy(), size=5)  # never equal: max_abs_diff's rules settle a NaN
    assert varies(a, size=5) and not varies(np.full((9, 13), 0.5), size=5) and not varies(np.ones(1), size=5)
    constant_first = np.ones((9, 13))
    constant_first[8, 12] = 2.0
    assert varies(constant_first, size=5)  # found in the last block


def recording(sizes: list[int], reduce=max_abs_diff):
    """`reduce` (max_abs_diff), appending the size of every block it is handed to `sizes`."""

    def recorded(a, b):
        sizes.append(a.size)
        return reduce(a, b)

    return recorded


def test_an_output_larger_than_a_block_is_compared_one_block_at_a_time(monkeypatch):
    """The memory bound of a large model's check: the float64 difference of an output (GPT-2
    small's logits are 51M elements) is taken block by block, never of the whole output at once."""
    from mhsa.port_check.core.chunks import BLOCK
    from mhsa.port_check.forward import rows

    sizes: list[int] = []
    monkeypatch.setattr(rows, "max_abs_diff", recording(sizes))
    monkeypatch.setattr(rows, "finite_gap", recording(sizes, rows.finite_gap))
    a = np.random.default_rng(2).standard_normal((2, 3, BLOCK // 2)).astype(np.float32)  # 3 blocks
    b = a.copy()
    b[1, 2, -1] += 1.0
    assert rows.compare_arrays(a, b, ("torch", "jax"))[0] == max_abs_diff(a, b)
    assert len(sizes) > 1 and max(sizes) <= BLOCK, sizes
    b[0, 0, 0] = np.inf  # the exact rules for infinities, also block by block
    sizes.clear()
    assert rows.compare_arrays(a, b, ("torch", "jax"))[0] == np.inf
    assert len(sizes) > 3 and max(sizes) <= BLOCK, sizes


def test_a_fresh_ports_weight_is_told_apart_from_the_reference_one_block_at_a_time(monkeypatch):
    """The time and memory bound of checking a fresh port: its random weight is told apart from
    the reference's by the first block that differs, for each transform tried, never by a
    reduction over the whole weight."""
    from mhsa.port_check.core.chunks import BLOCK
    from mhsa.port_check.forward import weights

    sizes: list[int] = []
    monkeypatch.setattr(weights, "max_abs_diff", recording(sizes))
    rng = np.random.default_rng(3)
    reference, fresh = (rng.standard_normal((3 * BLOCK // 1024, 1024)).astype(np.float32) for _ in range(2))  # 3 blocks each
    assert how_it_differs(reference, fresh, 1e-6) is None
    assert sizes and max(sizes) <= BLOCK and sum(sizes) < reference.size, sizes


def test_a_reordering_is_found_across_blocks(monkeypatch):
    from mhsa.port_check.forward import weights

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


@pytest.mark.parametrize("grads", [False, True], ids=["forward", "with gradients"])
def test_the_reference_runs_once_for_its_outputs_and_its_gradients(grads):
    """One forward pass (the scale benchmark's bound): with gradients its backward runs later, once
    the port's gradients are held (one set of gradients at a time: forward/check.py's _compare),
    from the graph that pass kept. Float64: no float64 twin runs."""
    torch.manual_seed(0)
    source = torch_block.Block().double().eval()  # already in float64: checked as it is, its own hook counts
    calls = []
    source.register_forward_pre_hook(lambda module, args: calls.append(torch.is_grad_enabled()))
    report = check_port(source, flax_block.block()[0], torch_block.example_inputs(), dtype="float64", grads=grads, probes=False)
    assert report.passed and calls == [grads], format_report(report)


def test_a_backward_kept_for_later_leaves_the_models_grad_as_it_was_called_or_let_go():
    import gc

    from mhsa.port_check.core import cotangents
    from mhsa.port_check.core.structure import as_inputs

    torch.manual_seed(0)
    model = torch_block.Block()
    weight = next(model.parameters())
    weight.grad = before = torch.ones_like(weight)
    inputs = as_inputs(torch_block.example_inputs())
    _, differentiate = torch_reader.run(model, inputs, cotangents.reference, later=True)
    assert weight.grad is None  # set aside while the backward is pending
    got: dict = {}
    differentiate(got.__setitem__)
    assert weight.grad is before and set(got) == {name for name, p in model.named_parameters()}
    _, differentiate = torch_reader.run(model, inputs, cotangents.reference, later=True)
    del differentiate
    gc.collect()
    assert weight.grad is before


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


def test_weights_copied_from_a_view_stay_as_copied_when_the_source_changes_in_place():
    # a view of a torch tensor, loaded into a Flax port, must not alias it: the training check
    # steps the torch model in place while the port still holds the weights of before
    torch.manual_seed(0)
    source, (target, _) = torch_block.Block(), flax_block.block()
    views = torch_reader.parameters(source)
    names = set(views) & set(flax_reader.parameters(target))
    loaded = flax_reader.load_parameters(target, {name: views[name] for name in names})
    before = {name: np.array(value) for name, value in flax_reader.parameters(loaded).items()}
    with torch.no_grad():
        for parameter in source.parameters():
            parameter.add_(1.0)
    after = flax_reader.parameters(loaded)
    assert names and all(np.array_equal(before[name], after[name]) for name in names)


class TorchHead(torch.nn.Module):
    def __init__(self, in_place: bool = False):
        super().__init__()
        self.head, self.in_place = torch.nn.Linear(4, 3), in_place

    def forward(self, x):
        y = self.head(x)
        return y.add_(1.0) if self.in_place else y  # the model returns its head's tensor, changed in place or not


def test_a_tensor_several_calls_return_is_copied_once_unless_changed_in_place_in_between():
    x = np.ones((2, 4), dtype=np.float32)
    head, model = torch_reader.run(TorchHead(), x)[0]
    assert head.value is model.value
    head, model = torch_reader.run(TorchHead(in_place=True), x)[0]
    assert np.array_equal(model.value, head.value + 1.0)


def test_a_value_several_calls_return_is_one_output_of_the_flax_program():
    from flax import nnx

    class FlaxHead(nnx.Module):
        def __init__(self):
            self.head = nnx.Linear(4, 3, rngs=nnx.Rngs(0))

        def __call__(self, x):
            return self.head(x)

    head, model = flax_reader.run(FlaxHead(), np.ones((2, 4), dtype=np.float32))[0]
    assert head.value is model.value and head.path == "head" and model.path == ""


def test_a_run_that_reduces_each_output_as_it_comes_holds_none_of_them_meanwhile():
    import weakref

    seen: list = []

    def reduce(output):  # the float64 run's way (forward/derived.py): every earlier copy is gone by now
        assert all(ref() is None or ref() is output.value for ref in seen), f"an earlier output is still held at {output.path}"
        seen.append(weakref.ref(output.value))
        return output._replace(value=None)

    torch.manual_seed(0)
    for reader, model in ((torch_reader, torch_block.Block().eval()), (flax_reader, flax_block.block()[0])):
        seen.clear()
        outputs, _ = reader.run(model, torch_block.example_inputs(), each=reduce)
        assert len(seen) > 5 and all(output.value is None for output in outputs), reader.__name__


def test_the_command_hands_its_models_over_so_a_fresh_ports_initial_weights_go_once_copied_over(monkeypatch, capsys):
    import gc
    import weakref

    import jax

    from mhsa.cli import main
    from mhsa.port_check import command

    initial, alive = [], {}
    build, load = command._factories, flax_reader.load_parameters

    def factories(args):
        built = build(args)
        initial.extend(weakref.ref(leaf) for leaf in jax.tree.leaves(flax_reader._variables(built[1][0])))
        return built

    def loaded(model, arrays):
        model = load(model, arrays)
        gc.collect()
        alive["after"] = sum(ref() is not None for ref in initial)
        return model

    monkeypatch.setattr(command, "_factories", factories)
    monkeypatch.setattr(flax_reader, "load_parameters", loaded)
    assert main(["port-check", "examples.torch_block:block", "examples.flax_block:block", "--no-probes"]) == 0, capsys.readouterr().out
    assert initial and alive == {"after": 0}


def scale_benchmark(monkeypatch):
    """benchmarks/port_check_scale.py as a module (the benchmarks are scripts, not a package)."""
    import importlib.util

    from tests.paths import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("port_check_scale_under_test", ROOT / "benchmarks" / "port_check_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # the benchmark: child processes, the check run whole
def test_the_scale_benchmark_measures_a_childs_own_peak_and_runs_its_floor_and_check_on_the_tiny_pair(monkeypatch, capsys):
    from mhsa.cli import main

    bench = scale_benchmark(monkeypatch)
    seconds, peak, status, _ = bench.measure(["-c", "x = bytearray(300 << 20); x[::4096] = b'1' * len(x[::4096])"])
    assert status == 0 and seconds > 0 and peak > 300 << 20  # the child's resident peak, its 300 MiB touched
    bench.floor("tiny", 3, 7, grads=True)  # build, transfer, forward and backward each, in this process
    bench.floor("tiny", 3, 7, grads=True, kept=True)  # the same, each run keeping the memory it frees
    assert main(bench.check_argv("tiny", 3, 7, grads=True)) == 0, capsys.readouterr().out
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("PASS: 28 of 28 parameters paired, all 59 comparisons")


@pytest.mark.slow  # two child processes, each building a 0.2-0.6 GB model pair
@pytest.mark.parametrize("grads", [False, True], ids=["forward", "with gradients"])
def test_the_checks_memory_beyond_the_two_models_grows_with_one_layer_not_with_the_number_of_layers(grads):
    """Forward: 8 layers more are 8 x 63 MB of float32 a side; a float64 copy of the reference
    made whole grew the check's peak by 510 MB, read one operation at a time it grows by a few MB.
    With gradients one set of them is held (forward/check.py's _compare), 8 x 63 MB more, and one
    layer in float64 (a weight's copy, its gradient) may be in flight: the reference's and the
    port's held together, or the float64 twin's weights or gradients kept whole, would add as much
    again as the set."""
    import subprocess
    import sys

    from tests.paths import ROOT

    def extra(layers: int) -> int:
        command = [sys.executable, "-m", "tests.tools.port_check.check_memory", str(layers)] + (["grads"] if grads else [])
        child = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
        return int(child.stdout.split()[-1])

    layer = 4 * (2 * 1024 * 1024 + 2 * 1024 * 512 + 3 * 1024 * 4096)  # bytes of float32 weights in one layer of one side
    small, large = extra(2), extra(10)
    held = 8 * layer + 2 * layer if grads else layer  # one set of gradients (8 layers more) and one layer in float64 in flight
    assert large - small < held, f"the check's peak above the two models: {small / 2**20:.0f} MiB at 2 layers, {large / 2**20:.0f} MiB at 10"
