"""The zoo's VAE pair (examples/zoo/vae_*.py), checked without the port checker, in float64: the
faithful port agrees with the reference at the output and at every submodule output once both are
in one layout (torch's feature maps moved channels last; its GroupNorm's (B, C, H*W) transposed and
unflattened to the port's (B, H, W, C)), and at every gradient of <r, output> once pulled back to
the reference's names and layouts by an inverse of the converter written here; the converter takes
every array of the state_dict once; the epsilon defaults the pair's bug rests on are the
frameworks' own; and each planted bug parts the models at the module named below, far beyond the
tolerance, and nowhere before it. The slow tier also trains both sides of the --train factories
(examples/zoo/vae_train.py) from the same weights for three steps."""

import inspect

import numpy as np
import pytest
import torch
from flax import nnx

from examples.zoo import vae_bugs, vae_convert, vae_flax, vae_torch, vae_train
from examples.zoo.convert import StateDict
from examples.zoo.torch_weights import numpy_state
from examples.zoo.vae_torch import TINY
from shared.tolerances import assert_close, tolerance
from tests.tools.port_check_zoo import families, sides
from tests.tools.port_check_zoo.families import x64  # noqa: F401  (autouse: every test here in float64)

DTYPE = "float64"
# where each planted bug (vae_bugs.<name>) first parts the models: a module path of the reference
PARTS_AT = {
    "group_norm_eps": "attn.group_norm",
    "positions_width_major": "attn.to_q",
    "residual_before_out": "attn.to_out",
    "conv_kernel_reshaped": "conv_out",
}
# conv_in, attn.group_norm, attn.to_q, attn.to_k, attn.to_v, attn.to_out, attn, conv_out
COMPARED = 8
B, H, W = TINY.batch, TINY.height, TINY.width


def from_flax(arrays, config=TINY) -> dict[str, np.ndarray]:
    """The port's {variable path: array} -> the reference's {state_dict name: array}, in torch's
    layouts: vae_convert.to_flax undone, every array of the port taken once."""
    take = StateDict(arrays)
    state = {"attn.group_norm.weight": take("attn.group_norm.scale"), "attn.group_norm.bias": take("attn.group_norm.bias")}
    for conv in ("conv_in", "conv_out"):  # (kH, kW, in, out) -> (out, in, kH, kW)
        state |= {f"{conv}.weight": take(f"{conv}.kernel").transpose(3, 2, 0, 1), f"{conv}.bias": take(f"{conv}.bias")}
    for linear in vae_convert.LINEARS:
        state |= {f"{linear}.weight": take(f"{linear}.kernel").T, f"{linear}.bias": take(f"{linear}.bias")}  # (in, out) -> (out, in)
    take.finish()
    return state


def in_port_layout(path: str, reference: np.ndarray, port: np.ndarray) -> np.ndarray:
    """The reference's output of module `path` in the port's layout: a feature map (B, C, H, W)
    channels last; the GroupNorm's (B, C, H*W) transposed to (B, H*W, C) and unflattened row-major
    to (B, H, W, C); the (B, H*W, C) token rows as they are."""
    if reference.ndim == 4:
        reference = reference.transpose(0, 2, 3, 1)  # (B, H, W, C)
    elif path == "attn.group_norm":
        reference = reference.transpose(0, 2, 1).reshape(B, H, W, -1)  # (B, C, H*W) -> (B, H*W, C) -> (B, H, W, C)
    assert reference.shape == port.shape, (path, reference.shape, port.shape)
    return reference


def matched(torch_calls, flax_calls) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(path, reference output in the port's layout, port output), in the reference's order, for
    every module output with a counterpart in the port (each module is called once)."""
    return [(path, in_port_layout(path, value, flax_calls[path, 0]), flax_calls[path, 0]) for path, value in torch_calls if (path, 0) in flax_calls]


@pytest.mark.slow  # the checker's tests hold the property in the fast tier (tests/tools/port_check_zoo/test_zoo_checker.py)
def test_the_faithful_port_agrees_at_the_output_every_module_and_every_gradient():
    (reference, x), (port, y) = vae_torch.reference(), vae_convert.ported(dtype=DTYPE)
    expected, actual = sides.torch_run(reference, x, DTYPE), sides.flax_run(port, y, DTYPE, grads=True)
    tol = tolerance("stage", DTYPE)
    (output,) = actual.outputs
    assert output.dtype == np.float64 and output.shape == (B, H, W, TINY.out_channels)
    assert_close("vae output (NHWC)", output, expected.outputs[0].transpose(0, 2, 3, 1), tol)
    pairs = matched(expected.calls, actual.calls)
    assert [path for path, *_ in pairs][:2] == ["conv_in", "attn.group_norm"] and len(pairs) == COMPARED, [path for path, *_ in pairs]
    for path, reference_output, port_output in pairs:
        assert_close(f"vae {path}", port_output, reference_output, tol)
    r = sides.direction(0, output.shape, np.float64)  # the port's r, (B, H, W, C_out): torch gets it channels first
    expected_grads, pulled_back = families.torch_hooked(reference, x[0], r.transpose(0, 3, 1, 2))[2], from_flax(actual.grads)
    assert set(pulled_back) == set(expected_grads)
    for name, grad in pulled_back.items():
        assert grad.shape == expected_grads[name].shape and np.any(grad), name
        assert_close(f"vae gradient of {name}", grad, expected_grads[name], tolerance("grad", DTYPE))


def test_the_converter_takes_every_array_once_and_is_undone_by_its_inverse():
    state = numpy_state(vae_torch.build())
    back = from_flax(vae_convert.to_flax(state))
    assert set(back) == set(state) and all(np.array_equal(back[name], state[name]) for name in state)
    with pytest.raises(ValueError, match="unused: attn.proj_attn.weight"):  # an old checkpoint's name, left beside the new
        vae_convert.to_flax(state | {"attn.proj_attn.weight": state["attn.to_out.weight"]})


def test_group_norms_of_both_layouts_agree_and_the_eps_defaults_differ():
    # torch's GroupNorm on (B, C, H*W) and Flax's on (B, H, W, C) take the same statistics; the
    # block's 1e-6 is Flax's default, and the planted eps bug is torch's default
    assert inspect.signature(torch.nn.GroupNorm.__init__).parameters["eps"].default == 1e-5 == vae_bugs.TORCH_GROUP_NORM_EPS
    assert inspect.signature(nnx.GroupNorm.__init__).parameters["epsilon"].default == 1e-6 == TINY.group_norm_eps
    assert inspect.signature(nnx.GroupNorm.__init__).parameters["num_groups"].default == 32  # 12 channels: Flax's default raises
    maps = np.random.default_rng(0).standard_normal((B, TINY.channels, H, W))  # (B, C, H, W)
    torch_norm = torch.nn.GroupNorm(TINY.groups, TINY.channels, eps=1e-6).double()
    flax_norm = nnx.GroupNorm(TINY.channels, num_groups=TINY.groups, epsilon=1e-6, dtype=np.float64, param_dtype=np.float64, rngs=nnx.Rngs(0))
    flat = torch_norm(torch.as_tensor(maps).view(B, TINY.channels, H * W)).detach().numpy()  # (B, C, H*W)
    nhwc = np.asarray(flax_norm(maps.transpose(0, 2, 3, 1)))  # (B, H, W, C)
    assert_close("GroupNorm, two layouts", nhwc, in_port_layout("attn.group_norm", flat, nhwc), tolerance("stage", DTYPE))


@pytest.mark.slow  # the checker's tests hold the property in the fast tier (tests/tools/port_check_zoo/test_zoo_checker.py)
@pytest.mark.parametrize("name", list(PARTS_AT))
def test_every_planted_bug_parts_the_models_at_its_module_and_not_before(name):
    (reference, x), (port, y) = vae_torch.reference(), getattr(vae_bugs, name)(dtype=DTYPE)
    expected, actual = sides.torch_run(reference, x, DTYPE), sides.flax_run(port, y, DTYPE)
    tol = tolerance("stage", DTYPE)
    families.assert_outputs_part(name, actual.outputs[0], expected.outputs[0].transpose(0, 2, 3, 1), tol)
    families.assert_parts_first_at(name, families.gaps(matched(expected.calls, actual.calls)), PARTS_AT[name], tol)


def test_the_fresh_port_holds_exactly_the_variables_the_converter_fills():
    fresh, (y,) = nnx.eval_shape(vae_flax.fresh)  # shapes only: Flax's initializers would compile for seconds
    assert families.nnx_shapes(fresh, nnx.Param) == families.shapes(vae_convert.to_flax(numpy_state(vae_torch.build())))
    assert y.shape == (B, H, W, TINY.in_channels) and np.array_equal(vae_torch.images_nhwc(), vae_torch.images_nchw().transpose(0, 2, 3, 1))


@pytest.mark.slow
def test_the_train_factories_take_the_same_steps_from_the_same_weights():
    # float32, as the factories build both sides, each batch in its own layout; the port starts from
    # the reference's weights. to_k's bias is left out: its true gradient is 0 (a constant added to
    # every score of a query), so it gets rounding noise, which Adam scales to steps of up to the
    # learning rate on either side
    reference, port = vae_train.reference(), vae_train.port()
    for batch, port_batch in zip(reference["inputs"][:3], port["inputs"][:3]):
        assert np.array_equal(batch[1].transpose(0, 2, 3, 1), port_batch[1])
    params, trained = families.train_three_steps(reference, port, vae_convert.to_flax)
    tol = tolerance("stage", "float32")  # measured: 4e-7 at most
    for name, value in params.items():
        if name != "attn.to_k.bias":
            assert_close(f"{name} after 3 steps", value, trained[name], tol)
