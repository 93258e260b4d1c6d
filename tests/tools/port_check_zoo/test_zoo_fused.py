"""The zoo's fused-attention pair (examples/zoo/fused_*.py), checked without the port checker, in
float64: the faithful port agrees with the reference at the output, at every submodule output once
the port's head-shaped qkv output (B, T, 3, H, d_head) is flattened to torch's (B, T, 3D), and at
every gradient of <r, output> once pulled back to the reference's names and layouts by an inverse
of the converter written here (the arrays it only renames or transposes read back from
fused_convert.moves, the reshaped ones undone by hand); the converter takes every array of the
state_dict once; and each planted bug parts the models at the module named below, far beyond the
tolerance, and nowhere before it. The slow tier also trains both sides of the --train factories
(examples/zoo/fused_train.py) from the same weights for three steps."""

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from examples.zoo import fused_bugs, fused_convert, fused_flax, fused_torch, fused_train
from examples.zoo.convert import StateDict
from examples.zoo.fused_torch import TINY
from examples.zoo.torch_weights import numpy_state
from shared.tolerances import assert_close, tolerance
from tests.tools.port_check_zoo import families, sides
from tests.tools.port_check_zoo.families import x64  # noqa: F401  (autouse: every test here in float64)

DTYPE = "float64"
# where each planted bug (fused_bugs.<name>) first parts the models: a module path of the reference
PARTS_AT = {
    "qkv_heads_interleaved": "blocks.0.attn.qkv",
    "qkv_untransposed": "blocks.0.attn.qkv",
    "proj_head_axes_swapped": "blocks.0.attn.proj",
    "scores_over_d_head": "blocks.0.attn.proj",
    "causal_mask_off": "blocks.0.attn.proj",
}
# per block: ln_1, attn.qkv, attn.proj, attn, ln_2, mlp.fc, mlp.proj, mlp, the block (mlp.act is
# torch's only); then ln_f
COMPARED = 9 * TINY.n_layers + 1


def from_flax(arrays, config=TINY) -> dict[str, np.ndarray]:
    """The port's {variable path: array} -> the reference's {state_dict name: array}, in torch's
    layouts: fused_convert.to_flax undone, every array of the port taken once."""
    take, D = StateDict(arrays), config.d_model
    # the arrays moved whole, named back (a transpose undoes itself); the reshaped ones undone below
    state = {source: take(name).T if transposed else take(name) for source, (name, transposed) in fused_convert.moves(config).items()}
    for i in range(config.n_layers):
        block = f"blocks.{i}."
        state[f"{block}attn.qkv.weight"] = take(f"{block}attn.qkv.kernel").reshape(D, 3 * D).T  # (D, 3, H, d_head) -> (3D, D)
        state[f"{block}attn.qkv.bias"] = take(f"{block}attn.qkv.bias").reshape(3 * D)  # (3, H, d_head) -> (3D,)
        state[f"{block}attn.proj.weight"] = take(f"{block}attn.proj.kernel").reshape(D, D).T  # (H, d_head, D) -> (D, D), (out, in)
    take.finish()
    return state


def in_reference_layout(path: str, reference: np.ndarray, port: np.ndarray) -> np.ndarray:
    """The port's output of module `path` in the reference's layout: qkv's (B, T, 3, H, d_head)
    flattened row-major to (B, T, 3D), the split torch's view makes; every other output as it is."""
    if path.endswith("attn.qkv"):
        B, T, _ = reference.shape
        assert port.shape == (B, T, 3, TINY.n_heads, TINY.d_head), port.shape
        return port.reshape(B, T, 3 * TINY.d_model)  # (B, T, 3D)
    assert port.shape == reference.shape, (path, port.shape, reference.shape)
    return port


def matched(torch_calls, flax_calls) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(path, reference output, port output in the reference's layout), in the reference's order,
    for every module output with a counterpart in the port (each module is called once)."""
    return [(path, value, in_reference_layout(path, value, flax_calls[path, 0])) for path, value in torch_calls if (path, 0) in flax_calls]


@pytest.mark.slow  # the checker's tests hold the property in the fast tier (tests/tools/port_check_zoo/test_zoo_checker.py)
def test_the_faithful_port_agrees_at_the_output_every_module_and_every_gradient():
    (reference, x), (port, y) = fused_torch.reference(), fused_convert.ported(dtype=DTYPE)
    expected = sides.torch_run(reference, x, DTYPE, convert=lambda grads: grads)  # the gradients in torch's names and layouts
    actual = sides.flax_run(port, y, DTYPE, grads=True)  # r: the same direction, the output (B, T, D) on both sides
    tol = tolerance("stage", DTYPE)
    assert actual.outputs[0].dtype == np.float64 and actual.outputs[0].shape == (TINY.batch, TINY.length, TINY.d_model)
    assert_close("fused output", actual.outputs[0], expected.outputs[0], tol)
    pairs = matched(expected.calls, actual.calls)
    assert len(pairs) == COMPARED, [path for path, *_ in pairs]
    for path, reference_output, port_output in pairs:
        assert_close(f"fused {path}", port_output, reference_output, tol)
    pulled_back = from_flax(actual.grads)
    assert set(pulled_back) == set(expected.grads)
    for name, grad in pulled_back.items():
        assert grad.shape == expected.grads[name].shape and np.any(grad), name
        assert_close(f"fused gradient of {name}", grad, expected.grads[name], tolerance("grad", DTYPE))


def test_the_converter_takes_every_array_once_and_is_undone_by_its_inverse():
    state = numpy_state(fused_torch.build())
    arrays = fused_convert.to_flax(state)
    assert arrays["blocks.0.attn.qkv.kernel"].shape == (24, 3, 4, 6) and arrays["blocks.0.attn.proj.kernel"].shape == (4, 6, 24)
    back = from_flax(arrays)
    assert set(back) == set(state) and all(np.array_equal(back[name], state[name]) for name in state)
    with pytest.raises(ValueError, match="unused: blocks.0.attn.bias"):  # nanoGPT's causal-mask buffer, had it been persistent
        fused_convert.to_flax(state | {"blocks.0.attn.bias": np.tril(np.ones((5, 5)))})
    with pytest.raises(ValueError, match="has no 'blocks.1.attn.qkv.bias'"):
        fused_convert.to_flax({name: value for name, value in state.items() if name != "blocks.1.attn.qkv.bias"})


def test_the_head_shaped_qkv_output_is_torchs_flat_one_split_row_major():
    # the layout the whole pair rests on: nnx.LinearGeneral(D, (3, H, d_head)) computes x @ kernel over
    # the kernel's first axis, so the kernel read as (D, 3D) is the transposed torch weight
    (reference, (x,)), (port, _) = fused_torch.reference(), fused_convert.ported(dtype=DTYPE)
    attention = reference.double().blocks[0].attn
    flat = attention.qkv(torch.as_tensor(x, dtype=torch.float64)).detach().numpy()  # (B, T, 3D)
    shaped = np.asarray(port.blocks[0].attn.qkv(jax.numpy.asarray(x, dtype=DTYPE)))  # (B, T, 3, H, d_head)
    assert_close("qkv, head-shaped", shaped.reshape(flat.shape), flat, tolerance("stage", DTYPE))
    q_head_1 = flat[..., TINY.d_head : 2 * TINY.d_head]  # torch's view: channels [d_head, 2 d_head) are q's head 1
    assert_close("q head 1", shaped[:, :, 0, 1], q_head_1, tolerance("stage", DTYPE))


@pytest.mark.slow  # the checker's tests hold the property in the fast tier (tests/tools/port_check_zoo/test_zoo_checker.py)
@pytest.mark.parametrize("name", list(PARTS_AT))
def test_every_planted_bug_parts_the_models_at_its_module_and_not_before(name):
    (reference, x), (port, y) = fused_torch.reference(), getattr(fused_bugs, name)(dtype=DTYPE)
    expected, actual = sides.torch_run(reference, x, DTYPE), sides.flax_run(port, y, DTYPE)
    tol = tolerance("stage", DTYPE)
    families.assert_outputs_part(name, actual.outputs[0], expected.outputs[0], tol)
    families.assert_parts_first_at(name, families.gaps(matched(expected.calls, actual.calls)), PARTS_AT[name], tol)


def test_the_fresh_port_holds_exactly_the_variables_the_converter_fills():
    fresh, (y,) = nnx.eval_shape(fused_flax.fresh)  # shapes only: Flax's initializers would compile for seconds
    assert families.nnx_shapes(fresh, nnx.Param) == families.shapes(fused_convert.to_flax(numpy_state(fused_torch.build())))
    assert y.shape == fused_torch.example_inputs()[0].shape == (TINY.batch, TINY.length, TINY.d_model)


@pytest.mark.slow
def test_the_train_factories_take_the_same_steps_from_the_same_weights():
    # float32, as the factories build both sides; the port starts from the reference's weights. The
    # key bias is left out: its true gradient is 0 (a constant added to every score of a query), so
    # it gets rounding noise, which Adam scales to steps of up to the learning rate on either side
    params, trained = families.train_three_steps(fused_train.reference(), fused_train.port(), fused_convert.to_flax)
    tol = tolerance("stage", "float32")  # measured: 4e-7 at most
    for name, value in params.items():
        keep = np.ones(value.shape, dtype=bool)
        if name.endswith("attn.qkv.bias"):
            keep[1] = False  # (3, H, d_head): k's
        assert_close(f"{name} after 3 steps", value[keep], trained[name][keep], tol)
