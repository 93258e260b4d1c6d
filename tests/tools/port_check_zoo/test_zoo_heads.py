"""The zoo's head-shaped pair (examples/zoo/heads_*.py), checked without the port checker, in
float64 (jax_enable_x64 is on for the tests: tests/conftest.py), where no rounding can hide a
difference: each faithful port, NNX (nnx.MultiHeadAttention) and Equinox
(eqx.nn.MultiheadAttention), agrees with the reference (torch's nn.MultiheadAttention) at the
output, at every submodule output that has a counterpart, and at every parameter's gradient of
<r, output>, pulled back to the reference's names by our own inverse converters; the converters
use every array once and their round trip is exact; every planted bug parts the models far beyond
the tolerance, first at the reference module we name; the frameworks' defaults that the ports
override are what the ports' docstrings say; and the --train factories take the same AdamW step.

The reference is hooked by families.torch_hooked rather than through sides.torch_run:
nn.MultiheadAttention returns a tuple (output, weights), whose output sides.torch_run would not
record. The Equinox port is walked module by module (equinox_calls), each module called per
example as its Block calls it."""

from __future__ import annotations

import functools
import inspect

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx

from examples.zoo import convert_equinox, heads_bugs, heads_convert, heads_equinox, heads_flax, heads_torch, heads_train
from examples.zoo.convert import abstract
from examples.zoo.heads_torch import TINY
from shared.tolerances import assert_close, max_abs_diff, tolerance
from tests.tools.port_check_zoo import families, sides

DTYPE = "float64"
TOL = tolerance("stage", DTYPE)
# every planted bug: (the port it is planted in, the reference module where the models first part)
BUGS = {
    "key_value_swapped": ("nnx", "blocks.0.attn"),
    "out_head_order": ("nnx", "blocks.0.attn"),
    "causal_mask_missing": ("nnx", "blocks.0.attn"),
    "layernorm_eps": ("nnx", "blocks.0.ln_1"),
    "output_bias_dropped": ("equinox", "blocks.0.attn"),
    "query_scaled_twice": ("equinox", "blocks.0.attn"),
}
# reference module outputs with a counterpart: NNX has no module for the GELU (blocks.i.mlp.act)
COMPARED = {"nnx": 7 * TINY.n_layers + 1, "equinox": 8 * TINY.n_layers + 1}
FROM = {"nnx": heads_convert.from_flax, "equinox": heads_convert.from_equinox}


@functools.cache
def reference_run() -> tuple[np.ndarray, tuple[tuple[str, np.ndarray], ...], dict[str, np.ndarray]]:
    """The reference in float64 on the example: (output, every module call's output in return
    order (a tuple's first array: MultiheadAttention's), d <r, output> / d every parameter)."""
    output, calls, grads = families.torch_hooked(heads_torch.build(), heads_torch.example_inputs()[0])
    return output, tuple((path, leaves[0]) for path, leaves in calls), grads


def equinox_calls(model: heads_equinox.HeadsStack, x) -> dict[tuple[str, int], jax.Array]:
    """{(reference module path, 0): output} of the Equinox port on the batch x (B, T, D): its own
    modules, each called per example (per position where its Block vmaps it), in the order and
    with the mask its Block uses; each block's output is the block's own call, so the walk cannot
    drift from the port."""
    calls = {}

    def per_position(module):
        return jax.vmap(jax.vmap(module))  # (B, T, D) -> (B, T, ...)

    for i, block in enumerate(model.blocks):
        path = f"blocks.{i}"
        h = calls[(f"{path}.ln_1", 0)] = per_position(block.ln_1)(x)
        a = calls[(f"{path}.attn", 0)] = jax.vmap(lambda h, attn=block.attn: attn(h, h, h, mask=heads_equinox.causal_mask(h.shape[0])))(h)
        h = calls[(f"{path}.ln_2", 0)] = per_position(block.ln_2)(x + a)
        f = calls[(f"{path}.mlp.fc", 0)] = per_position(block.mlp.fc)(h)
        g = calls[(f"{path}.mlp.act", 0)] = per_position(block.mlp.act)(f)
        calls[(f"{path}.mlp.proj", 0)] = per_position(block.mlp.proj)(g)
        calls[(f"{path}.mlp", 0)] = per_position(block.mlp)(h)
        x = calls[(path, 0)] = jax.vmap(block)(x)
    calls[("ln_f", 0)] = per_position(model.ln_f)(x)
    return calls


@eqx.filter_jit
def _equinox_run(model, x, r):
    def total(model):
        output = jax.vmap(model)(x)  # (B, T, D): the port takes one example
        return (output * r).sum(), output

    (_, output), grads = eqx.filter_value_and_grad(total, has_aux=True)(model)
    return output, equinox_calls(model, x), grads


def port_run(kind: str, model, grads: bool = True) -> sides.Run:
    """The port in float64 on the example: its output, {(module path, call): output}, and (with
    `grads`) d <r, output> / d every variable, {port path: gradient}."""
    x = heads_torch.example_inputs()[0].astype(DTYPE)
    if kind == "nnx":
        return sides.flax_run(model, (x,), DTYPE, grads=grads)
    output, calls, gradients = _equinox_run(model, jnp.asarray(x), jnp.asarray(sides.direction(0, x.shape, np.float64)))
    run = sides.Run([np.asarray(output)], {key: np.asarray(value) for key, value in calls.items()})
    if grads:
        run.grads = convert_equinox.equinox_arrays(gradients)
    return run


@pytest.mark.slow  # the checker's tests hold the property in the fast tier (tests/tools/port_check_zoo/test_zoo_checker.py)
@pytest.mark.parametrize("kind", ["nnx", "equinox"])
def test_each_faithful_port_agrees_at_the_output_every_module_and_every_gradient(kind):
    port = heads_convert.ported(DTYPE)[0] if kind == "nnx" else heads_convert.ported_equinox(DTYPE)[0]
    expected, calls, grads = reference_run()
    actual = port_run(kind, port)
    (output,) = actual.outputs
    assert output.dtype == np.dtype(DTYPE)
    assert_close(f"{kind} output", output, expected, TOL)
    pairs = sides.matched(calls, actual.calls)
    assert len(pairs) == COMPARED[kind], [path for path, *_ in pairs]
    assert sides.first_parting(pairs, TOL) is None
    if kind == "equinox":  # the walk follows the port: each block's output is its input, its attention's and its MLP's
        x = heads_torch.example_inputs()[0].astype(DTYPE)
        for i in range(TINY.n_layers):
            path, before = f"blocks.{i}", actual.calls[(f"blocks.{i - 1}", 0)] if i else x
            assert_close(
                f"{path} rebuilt", before + actual.calls[(f"{path}.attn", 0)] + actual.calls[(f"{path}.mlp", 0)], actual.calls[(path, 0)], TOL
            )
    pulled = FROM[kind](actual.grads)  # every port gradient used once, under the reference's names
    assert set(pulled) == set(grads)
    for name, grad in pulled.items():
        assert_close(f"{kind} gradient of {name}", grad, grads[name], tolerance("grad", DTYPE))


def test_the_converters_use_every_array_once_fill_every_variable_and_round_trip_exactly():
    state = heads_convert.reference_state()
    nnx_port = abstract(lambda: heads_flax.HeadsStack(TINY, rngs=nnx.Rngs(0)))
    nnx_shapes = families.nnx_shapes(nnx_port, nnx.Param)
    eqx_port = convert_equinox.abstract_equinox(lambda: heads_equinox.HeadsStack(TINY, key=jax.random.key(0)))
    eqx_shapes = convert_equinox.equinox_shapes(eqx_port)
    for to, back, shapes in (
        (heads_convert.to_flax, heads_convert.from_flax, nnx_shapes),
        (heads_convert.to_equinox, heads_convert.from_equinox, eqx_shapes),
    ):
        arrays = to(state, TINY)
        assert families.shapes(arrays) == shapes
        again = back(arrays, TINY)
        assert set(again) == set(state) and all(again[name].dtype == state[name].dtype and np.array_equal(again[name], state[name]) for name in state)
        with pytest.raises(ValueError, match="unused: extra"):
            to(state | {"extra": np.zeros(1)}, TINY)
        with pytest.raises(ValueError, match="has no 'blocks.1.attn.in_proj_bias'"):
            to({name: value for name, value in state.items() if name != "blocks.1.attn.in_proj_bias"}, TINY)
        with pytest.raises(ValueError, match="unused"):
            back(arrays | {"extra": np.zeros(1)}, TINY)
    with pytest.raises(ValueError, match="none for .*output_proj.bias"):
        convert_equinox.load_equinox(eqx_port, heads_bugs.drops_output_bias(state, TINY))
    square = heads_convert.to_equinox(state, TINY) | {"blocks.0.mlp.fc.weight": state["blocks.0.mlp.fc.weight"].T}
    with pytest.raises(ValueError, match=r"blocks.0.mlp.fc.weight: the converter gives shape \(24, 44\), the port holds \(44, 24\)"):
        convert_equinox.load_equinox(eqx_port, square)


@pytest.mark.slow  # the checker's tests hold the property in the fast tier (tests/tools/port_check_zoo/test_zoo_checker.py)
@pytest.mark.parametrize("name", list(BUGS))
def test_every_planted_bug_parts_the_models_first_where_we_say(name):
    kind, parts_at = BUGS[name]
    port, (x,) = getattr(heads_bugs, name)(DTYPE)
    assert isinstance(port, heads_flax.HeadsStack if kind == "nnx" else heads_equinox.HeadsStack)
    assert np.array_equal(x, heads_torch.example_inputs()[0])
    expected, calls, _ = reference_run()
    actual = port_run(kind, port, grads=False)
    families.assert_outputs_part(name, actual.outputs[0], expected, TOL)
    assert sides.first_parting(sides.matched(calls, actual.calls), TOL) == parts_at


def test_the_fresh_ports_build_with_head_shaped_kernels():
    # the factories' own code, traced: shapes and dtypes only, no initializer compiled
    D, H, d_head = TINY.d_model, TINY.n_heads, TINY.d_head
    given = {}  # the factories' inputs: NumPy, made outside the trace

    def built(kind, factory):
        model, given[kind] = factory()
        return model

    flax_port = nnx.eval_shape(lambda: built("nnx", heads_flax.fresh))
    params = families.nnx_flat(nnx.state(flax_port, nnx.Param))
    for name in ("query", "key", "value"):
        assert params[f"blocks.0.attn.{name}.kernel"].shape == (D, H, d_head) and params[f"blocks.0.attn.{name}.bias"].shape == (H, d_head)
    assert params["blocks.0.attn.out.kernel"].shape == (H, d_head, D) and params["blocks.0.attn.out.bias"].shape == (D,)
    assert params["blocks.0.ln_1.scale"].dtype == jnp.float32 and len(params) == 16 * TINY.n_layers + 2  # 4 x 2 per attention
    shapes = convert_equinox.equinox_shapes(eqx.filter_eval_shape(lambda: built("equinox", heads_equinox.fresh_equinox)))
    for name in ("query", "key", "value", "output"):
        assert shapes[f"blocks.1.attn.{name}_proj.weight"] == (D, D) and shapes[f"blocks.1.attn.{name}_proj.bias"] == (D,)
    assert len(shapes) == len(params)
    (x,), (y,) = given["nnx"], given["equinox"]
    assert (
        np.array_equal(x, y)
        and np.array_equal(x, heads_torch.example_inputs()[0])
        and x.shape == (3, heads_torch.SEQUENCE, D)
        and x.dtype == np.float32
    )


def test_the_frameworks_defaults_the_ports_override_are_as_their_docstrings_say():
    # eqx.nn.MultiheadAttention: no biases unless asked; Equinox's LayerNorm eps is torch's, Flax's is not
    bare = eqx.filter_eval_shape(eqx.nn.MultiheadAttention, TINY.n_heads, TINY.d_model, key=jax.random.key(0))
    assert all(getattr(bare, f"{name}_proj").bias is None for name in ("query", "key", "value", "output"))
    assert inspect.signature(eqx.nn.LayerNorm.__init__).parameters["eps"].default == 1e-5 and heads_bugs.FLAX_LN_EPS == 1e-6
    # nnx.MultiHeadAttention's default attention_fn, without dropout, takes its softmax in float32 even in float64
    assert inspect.signature(nnx.MultiHeadAttention.__init__).parameters["attention_fn"].default is nnx.dot_product_attention
    q, k, v = np.random.default_rng(7).standard_normal((3, 3, heads_torch.SEQUENCE, TINY.n_heads, TINY.d_head))  # 3 x (B, T, H, d_head)
    mask = np.tril(np.ones((heads_torch.SEQUENCE,) * 2, dtype=bool))  # (T, T)
    default, ours = jax.jit(lambda *a: (nnx.dot_product_attention(*a, mask=mask), heads_flax.attention_in_dtype(*a, mask=mask)))(q, k, v)
    assert default.dtype == ours.dtype == jnp.float64 and 1e-12 < max_abs_diff(default, ours) < 1e-5


def _torch_step(setup: dict, batch) -> tuple[float, float, dict[str, np.ndarray]]:
    """One training step of the reference in float64, as the training check takes it: (loss, the
    gradients' norm before the clip, the parameters after the step)."""
    model = setup["model"].to(torch.float64)  # in place: the optimizer keeps its parameters
    x, target = (torch.as_tensor(a, dtype=torch.float64) for a in batch)
    loss = setup["loss"](model(x), x, target)  # model_inputs 1: the model takes x only
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), setup["clip"])
    setup["optimizer"].step()
    return loss.item(), norm.item(), {name: p.detach().numpy() for name, p in model.named_parameters()}


def _optax_step(kind: str, setup: dict, batch) -> tuple[float, dict[str, np.ndarray]]:
    """One step of the port with converted weights in float64, with the factory's optax
    transformation and loss: (loss, the parameters after the step, under the reference's names)."""
    tx, x, target = setup["optimizer"], *(jnp.asarray(a, dtype=jnp.float64) for a in batch)
    if kind == "nnx":
        graph, params, rest = nnx.split(heads_convert.ported(DTYPE)[0], nnx.Param, ...)
        loss, grads = jax.jit(jax.value_and_grad(lambda p: setup["loss"](nnx.merge(graph, p, rest)(x), x, target)))(params)
        params = optax.apply_updates(params, tx.update(grads, tx.init(params), params)[0])
        return float(loss), heads_convert.from_flax(families.nnx_arrays(params))
    params, static = eqx.partition(heads_convert.ported_equinox(DTYPE)[0], eqx.is_inexact_array)
    loss, grads = eqx.filter_jit(jax.value_and_grad(lambda p: setup["loss"](jax.vmap(eqx.combine(p, static))(x), x, target)))(params)
    params = optax.apply_updates(params, tx.update(grads, tx.init(params), params)[0])
    return float(loss), heads_convert.from_equinox(convert_equinox.equinox_arrays(params))


@pytest.mark.slow  # every case: each builds a fresh port with its framework's initializers, seconds on a small CPU
@pytest.mark.parametrize("kind", ["nnx", "equinox"])
def test_the_train_factories_take_the_same_first_clipped_adamw_step(kind):
    reference, port = heads_train.reference(), heads_train.port() if kind == "nnx" else heads_train.port_equinox()
    assert isinstance(port["model"], heads_flax.HeadsStack if kind == "nnx" else heads_equinox.HeadsStack) and "clip" not in port
    assert reference["model_inputs"] == port["model_inputs"] == 1 and len(reference["inputs"]) == len(port["inputs"]) == heads_train.BATCHES
    assert all(np.array_equal(a, b) for ref, other in zip(reference["inputs"], port["inputs"]) for a, b in zip(ref, other))
    batch = reference["inputs"][0]
    (loss, norm, params), (port_loss, port_params) = _torch_step(reference, batch), _optax_step(kind, port, batch)
    assert norm < reference["clip"]  # a guard these batches do not reach (heads_train's docstring: where it acts, torch's and optax's differ)
    assert abs(loss - port_loss) <= TOL
    before = heads_convert.reference_state()
    assert max(max_abs_diff(params[name], before[name]) for name in params) > 1e-4  # the step moved the weights
    for name, value in params.items():
        assert_close(f"{kind} {name} after one step", port_params[name], value, tolerance("trajectory", DTYPE))
