"""The zoo's faithful pairs agree, checked without the port checker: every output, every submodule
output that has a counterpart and every parameter's gradient, in float64 (where no rounding can
hide a difference: the port checker's own tests run them in float32 too), with our own converters;
the converters refuse what they cannot convert; GPT-2 small's shape builds from the same code
(shapes only: it is for benchmarks)."""

import numpy as np
import pytest
import torch
from flax import nnx

from examples.zoo import catalog, gpt2_convert, gpt2_flax, gpt2_torch
from examples.zoo.configs import gpt2_small
from shared.tolerances import assert_close, tolerance
from tests.tiers import first_fast
from tests.tools.port_check_zoo import sides

# submodule outputs with a counterpart in the port: a pair that compared none would pass on nothing
COMPARED = {"llama": 30, "llama_keywords": 30, "gpt2": 24, "gpt2_linen": 24, "vit": 25, "seq2seq": 34, "convnet": 5}


@pytest.mark.parametrize("name", first_fast(list(catalog.FAITHFUL)))
def test_every_faithful_pair_agrees_at_every_output_module_and_gradient(name):
    pair, dtype = catalog.FAITHFUL[name], "float64"
    (reference, x), (port, y), convert = catalog.build(pair.reference), catalog.build(pair.port, dtype=dtype), catalog.resolve(pair.convert)
    expected, actual = sides.torch_run(reference, x, dtype, convert), sides.flax_run(port, y, dtype, grads=True)
    tol = tolerance("stage", dtype)
    assert len(actual.outputs) == len(expected.outputs)
    for i, (a, b) in enumerate(zip(actual.outputs, expected.outputs)):
        assert a.dtype == np.dtype(dtype), f"output {i} computed in {a.dtype}"
        assert_close(f"{name} output {i}", a, b, tol)
    pairs = sides.matched(expected.calls, actual.calls)
    assert len(pairs) == COMPARED[name], [path for path, *_ in pairs]
    split = sides.SPLIT.get(pair.reference, {})
    for path, reference_output, port_output in pairs:
        if path in split:
            assert_close(f"{name} {path} (split otherwise)", split[path] * port_output, reference_output, tol)
    assert sides.first_parting(pairs, tol, skip=split) is None
    assert set(actual.grads) <= set(expected.grads) and len(actual.grads) > 5
    for variable, grad in actual.grads.items():
        if variable in pair.unread:  # a converter's leftover: no output depends on it
            assert not np.any(grad), f"{name}: {variable} is said to be unread, but its gradient is not 0"
        else:
            assert_close(f"{name} gradient of {variable}", grad, expected.grads[variable], tolerance("grad", dtype))


def test_the_gpt2_pair_looks_up_positions_once_per_batch_in_torch_and_per_row_in_flax():
    (reference, x), (port, y) = catalog.build(catalog.FAITHFUL["gpt2"].reference), catalog.build(catalog.FAITHFUL["gpt2"].port, dtype="float64")
    torch_calls, flax_calls = sides.torch_run(reference, x, "float64").calls, sides.flax_run(port, y, "float64").calls
    assert dict(torch_calls)["transformer.wpe"].shape == (1, 7, 20) and flax_calls[("transformer.wpe", 0)].shape == (3, 7, 20)


def test_the_vit_pair_gives_each_side_its_own_layout_of_the_same_images():
    (_, (nchw,)), (_, (nhwc,)) = catalog.build(catalog.FAITHFUL["vit"].reference), catalog.build(catalog.FAITHFUL["vit"].port)
    assert nchw.shape == (5, 3, 18, 30) and np.array_equal(nchw.transpose(0, 2, 3, 1), nhwc)


def test_gpt2_small_builds_from_the_same_code_with_124m_parameters_and_the_converter_fits_it():
    with torch.device("meta"):  # shapes only: nothing allocated
        reference = gpt2_torch.GPT2LMHeadModel(gpt2_small())
    port = nnx.eval_shape(lambda: gpt2_flax.GPT2LMHeadModel(gpt2_small(), rngs=nnx.Rngs(0)))
    shapes = {".".join(map(str, path)): v.get_value().shape for path, v in nnx.to_flat_state(nnx.state(port, nnx.Param))}
    assert sum(p.numel() for p in reference.parameters()) == sum(int(np.prod(s)) for s in shapes.values()) == 124_439_808
    zeros = {name: np.broadcast_to(np.float32(0), tuple(value.shape)) for name, value in reference.state_dict().items()}  # no memory
    assert {name: value.shape for name, value in gpt2_convert.to_flax(zeros, gpt2_small()).items()} == shapes
