"""Every planted bug of the zoo is a real bug, checked without the port checker: in float64 the
port's outputs part from the reference's far beyond the tolerance (precision cannot explain it),
and the first submodule output that differs is the one the table names; a gradient-only bug keeps
the outputs and parts one gradient; a lint-only bug keeps the outputs and parts the running
statistics after a training step. The converters' and loaders' own guards refuse what they cannot
convert."""

import dataclasses

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from examples.zoo import catalog, convert, gpt2_convert, inputs, llama_convert, llama_flax, vit_bugs, vit_convert, vit_torch
from examples.zoo.torch_weights import numpy_state
from shared.tolerances import max_abs_diff, tolerance
from tests.tools.port_check_zoo import sides

FAR = 1000  # a planted bug parts the models by more than FAR times the float64 tolerance


def converter_of(bug: catalog.Bug):
    return catalog.resolve(next(pair.convert for pair in catalog.FAITHFUL.values() if pair.reference == bug.reference))


@pytest.mark.parametrize("name", catalog.BUGS)
def test_every_planted_bug_parts_the_models_where_the_table_says(name):
    bug = catalog.BUGS[name]
    (reference, x), (port, y) = catalog.build(bug.reference), catalog.build(bug.port, dtype=bug.dtype)
    grads = bug.section == "gradient"
    expected = sides.torch_run(reference, x, bug.dtype, converter_of(bug) if grads else None)
    actual = sides.flax_run(port, y, bug.dtype, grads=grads)
    tol = tolerance("stage", bug.dtype)
    gap = max(max_abs_diff(a, b) for a, b in zip(actual.outputs, expected.outputs))
    if bug.section != "output":
        assert gap <= tol, f"{name} was meant to keep the outputs, but they part by {gap:.2e}"
    else:
        assert gap > FAR * tol, f"{name}: the outputs part by {gap:.2e} only"
        assert (sides.first_parting(sides.matched(expected.calls, actual.calls), tol) or "") == bug.parts_at
    if grads:
        differing = {
            variable for variable, g in actual.grads.items() if variable in expected.grads and max_abs_diff(g, expected.grads[variable]) > FAR * tol
        }
        assert {variable.rsplit(".", 1)[0] for variable in differing} == {bug.parts_at.rsplit(".", 1)[0]}, differing


def test_batchnorm_momentum_read_the_wrong_way_parts_the_running_mean_after_one_training_step():
    # float32: nnx.BatchNorm keeps its statistics in float32 whatever its param_dtype
    reference = vit_torch.build()
    features = reference.stem.conv(torch.as_tensor(inputs.images_nchw(vit_torch.TINY)))  # (B, S, H, W): what the BatchNorm sees
    reference.stem.bn.train()(features)
    nhwc = jax.numpy.asarray(features.detach().numpy().transpose(0, 2, 3, 1))
    means = {}
    for label, port in (("faithful", vit_convert.ported()[0]), ("bug", vit_bugs.batchnorm_momentum()[0])):
        port.stem.bn(nhwc, use_running_average=False)
        means[label] = max_abs_diff(port.stem.bn.mean.get_value(), reference.stem.bn.running_mean.numpy())
    assert means["faithful"] <= tolerance("stage", "float32") and means["bug"] > 0.1, means


def test_a_converter_refuses_an_array_taken_twice_or_never():
    take = convert.StateDict({"a": np.zeros(2), "b": np.zeros(3)})
    take("a")
    with pytest.raises(ValueError, match="'a' is taken from the state_dict twice"):
        take("a")
    with pytest.raises(ValueError, match="the state_dict has no 'c'"):
        take("c")
    with pytest.raises(ValueError, match="leaves 1 array"):
        take.finish()
    take.finish(unused=["b"])


def test_the_gpt2_converter_refuses_an_output_layer_that_is_not_the_embedding():
    state = numpy_state(gpt2_convert.gpt2_torch.build())
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    with pytest.raises(ValueError, match="lm_head.weight differs from transformer.wte.weight"):
        gpt2_convert.to_flax(state)


def test_the_loader_checks_every_name_and_shape_before_writing_anything():
    arrays = llama_convert.to_flax(numpy_state(llama_convert.llama_torch.build()))
    port = convert.abstract(lambda: llama_flax.Llama(llama_flax.TINY, rngs=nnx.Rngs(0)))
    square = "layers.1.self_attn.o_proj.kernel"
    for broken, message in (
        (arrays | {"lm_head.kernel": np.zeros((24, 37))}, "the port has no variable lm_head.kernel"),
        (arrays | {square: np.zeros((24, 25))}, r"gives shape \(24, 25\), the port holds \(24, 24\)"),
        ({k: v for k, v in arrays.items() if k != square}, f"gives no value for {square}"),
    ):
        with pytest.raises(ValueError, match=message):
            convert.load_nnx(port, broken)
        assert isinstance(port.embed_tokens.embedding.get_value(), jax.ShapeDtypeStruct)  # nothing written
    with pytest.raises(ValueError, match=f"gives no value for {square}, which the abstract port holds no value for"):
        convert.load_nnx(port, {k: v for k, v in arrays.items() if k != square}, complete=False)


def test_the_linen_variables_are_checked_against_what_init_would_create():
    module, x = convert_linen_inputs()
    arrays = gpt2_convert.reference_arrays()
    with pytest.raises(ValueError, match="gives no value for transformer.ln_f.bias"):
        convert.linen_variables(module, x, {k: v for k, v in arrays.items() if k != "transformer.ln_f.bias"})


def convert_linen_inputs():
    from examples.zoo import gpt2_linen

    return gpt2_linen.GPT2LMHeadModel(gpt2_linen.TINY), inputs.gpt2(gpt2_linen.TINY)


def test_float64_without_jax_x64_is_refused_rather_than_computed_in_float32():
    with jax.enable_x64(False), pytest.raises(ValueError, match="float64 needs jax.config.update"):
        convert.jax_dtype("float64")
    with pytest.raises(ValueError, match="float32 or float64; got 'bfloat16'"):
        convert.jax_dtype("bfloat16")


def test_every_bug_of_the_table_has_its_own_factory_and_a_reference_with_a_converter():
    assert len(catalog.BUGS) >= 12 and len({bug.port for bug in catalog.BUGS.values()}) == len(catalog.BUGS)
    assert all(dataclasses.astuple(bug)[:2] and converter_of(bug) for bug in catalog.BUGS.values())
