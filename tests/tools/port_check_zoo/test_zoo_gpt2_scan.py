"""The zoo's scanned GPT-2 pair (examples/zoo/gpt2_scan*.py), checked without the port checker, in
float64: each faithful port (nnx.scan, jax.lax.scan over nnx.split's state, two layers per step,
nnx.remat around the body, Linen's nn.scan) agrees with its reference (gpt2_torch's model at three
layers, four for the grouped port) at the logits, at every hidden state and, layer by layer, at
every submodule output, the port's found by running gpt2_flax's (gpt2_linen's) Block on each
layer's slice of the stacked variables, here, not through the scan; the scan itself computes what
that chain of slices does; the gradients of <r, logits> pulled back to torch's per-layer names
(the stacks unstacked by an inverse of the converter written here) agree; each converter takes
every array of the state_dict once; and each planted bug, in layer 1 of 3, parts the models at
the module named below, far beyond the tolerance, and nowhere before it. The slow tier also trains
both sides of the --train factories (examples/zoo/gpt2_scan_train.py) for three steps."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from examples.zoo import gpt2_linen, gpt2_scan, gpt2_scan_bugs, gpt2_scan_convert, gpt2_scan_linen, gpt2_scan_train, gpt2_torch, inputs
from examples.zoo.convert import StateDict
from examples.zoo.gpt2_convert import CONV1DS
from examples.zoo.gpt2_scan import CONFIG, GROUP, GROUPED
from examples.zoo.gpt2_scan_convert import NORMS
from examples.zoo.torch_weights import numpy_state
from shared.tolerances import assert_close, max_abs_diff, tolerance
from tests.tiers import first_fast
from tests.tools.port_check_zoo import families, sides
from tests.tools.port_check_zoo.families import x64  # noqa: F401  (autouse: every test here in float64)

DTYPE = "float64"
TOL = tolerance("stage", DTYPE)  # 1e-10
# each faithful port: (its reference factory, its converted-port factory, its converter's name, its config)
PORTS = {
    "scan": ("reference", "ported", "to_flax", CONFIG),
    "split": ("reference", "ported_split", "to_flax", CONFIG),
    "grouped": ("reference_grouped", "ported_grouped", "to_flax_grouped", GROUPED),
    "remat": ("reference", "ported_remat", "to_flax", CONFIG),
    "linen": ("reference", "ported_linen", "to_flax", CONFIG),
}
# where each planted bug (gpt2_scan_bugs.<name>) first parts the models: a module path of the reference
PARTS_AT = {
    "out_kernel_transposed_layer1": "transformer.h.1.attn.c_proj",
    "mask_off_layer1": "transformer.h.1.attn.c_proj",
    "out_kernel_transposed_layer1_linen": "transformer.h.1.attn.c_proj",
}
# per layer: ln_1, attn.c_attn, attn.c_proj, attn, ln_2, mlp.c_fc, mlp.c_proj, mlp.dropout, mlp, the
# block (mlp.act is torch's only); then wte, wpe, drop, ln_f and lm_head (the logits)
PER_LAYER = 10


def stacked_names() -> list[tuple[str, str]]:
    """(Flax name, torch name) of every array of one block, as gpt2_scan_convert.stacked names them."""
    norms = [(f"{norm}.{name}", f"{norm}.{torch_name}") for norm in ("ln_1", "ln_2") for name, torch_name in NORMS]
    return norms + [(f"{conv}.{name}", f"{conv}.{torch_name}") for conv in CONV1DS for name, torch_name in (("kernel", "weight"), ("bias", "bias"))]


def from_flax(arrays, config=CONFIG, grouped: bool = False) -> dict[str, np.ndarray]:
    """A scanned port's {variable path: array} -> the reference's {parameter name: array}: the stacks
    unstacked into torch's per-layer names, every array of the port taken once (lm_head.weight,
    wte's own tensor in torch, has no array of its own)."""
    take = StateDict(arrays)
    state = {"transformer.wte.weight": take("transformer.wte.embedding"), "transformer.wpe.weight": take("transformer.wpe.embedding")}
    state |= {f"transformer.ln_f.{torch_name}": take(f"transformer.ln_f.{name}") for name, torch_name in NORMS}
    L = config.n_layers
    stacks = [(f"transformer.h.layers_{k}.", range(k, L, GROUP)) for k in range(GROUP)] if grouped else [("transformer.h.", range(L))]
    for prefix, layers in stacks:
        for name, torch_name in stacked_names():
            rows = take(prefix + name)  # (len(layers), ...)
            assert rows.shape[0] == len(layers), (prefix + name, rows.shape)
            state |= {f"transformer.h.{i}.{torch_name}": rows[k] for k, i in enumerate(layers)}
    take.finish()
    return state


def direction(shape) -> np.ndarray:
    """r, the fixed random direction of the gradients: <r, logits>."""
    return sides.direction(0, shape, np.float64)


def torch_side(model: torch.nn.Module, ids: np.ndarray):
    """The reference in float64 -> (logits, hidden states, [(module path, output)] for every
    submodule returning a tensor, in return order, {parameter name: d <r, logits> / d it})."""
    model = model.double()
    calls = []

    def hook(path):
        return lambda module, arguments, output: calls.append((path, output.detach().numpy())) if torch.is_tensor(output) else None

    handles = [module.register_forward_hook(hook(path)) for path, module in model.named_modules() if path]
    try:
        output = model(torch.as_tensor(ids))
    finally:
        for handle in handles:
            handle.remove()
    (output.logits * torch.as_tensor(direction(tuple(output.logits.shape)))).sum().backward()
    grads = {name: p.grad.numpy() for name, p in model.named_parameters()}  # the tied weight once, as transformer.wte.weight
    return output.logits.detach().numpy(), [h.detach().numpy() for h in output.hidden_states], calls, grads


@nnx.jit
def nnx_forward(model, ids, r):
    """(the port's output, d <r, logits> / d every parameter)."""

    def total(model):
        output = model(ids)
        return (output.logits * r).sum(), output

    grads, output = nnx.grad(total, has_aux=True)(model)
    return output, grads


@functools.partial(jax.jit, static_argnums=0)
def nnx_layer(graphdef, state, h):
    """One layer's Block, (graphdef, its slice of the stack), on h (B, T, D) -> {submodule path: output}, "" the block's."""
    block = nnx.merge(graphdef, state)
    _, captured = nnx.capture(block, nnx.Intermediate, method_outputs=nnx.Intermediate)(h)
    return {".".join(map(str, path[:-1])): variable.get_value()[0] for path, variable in nnx.to_flat_state(captured)}


@functools.partial(jax.jit, static_argnums=0)
def linen_layer(config, params, h):
    """gpt2_linen.Block with one layer's slice of the stacked params, on h -> {submodule path: output}."""
    _, state = gpt2_linen.Block(config).apply({"params": params}, h, capture_intermediates=True, mutable=["intermediates"])
    flat = jax.tree_util.tree_leaves_with_path(state["intermediates"], is_leaf=lambda x: isinstance(x, tuple))
    return {".".join(str(key.key) for key in path[:-1]): values[0] for path, values in flat}


def row(tree, k: int):
    """Slice k of every array of a stacked tree (an nnx.State, a Linen params dict)."""
    return jax.tree.map(lambda a: a[k], tree)


def nnx_blocks(model, config) -> list[tuple]:
    """Layer i of the port as (graphdef, state) of one gpt2_flax.Block: its slice of transformer.h
    (for the grouped port, layers_{i % 2} of slice i // 2)."""
    graphdef, state = nnx.split(model.transformer.h)
    if isinstance(model, gpt2_scan.GroupedScanGPT2LMHeadModel):
        return [nnx.split(getattr(nnx.merge(graphdef, row(state, i // GROUP)), f"layers_{i % GROUP}")) for i in range(config.n_layers)]
    return [(graphdef, row(state, i)) for i in range(config.n_layers)]


def positions(ids: jax.Array) -> jax.Array:
    """(B, T) ids -> (B, T) positions 0 .. T - 1 per row, as the ports look them up."""
    return jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)


def port_side(port, input_ids: np.ndarray, config):
    """The port in float64 -> (logits, hidden states, {reference module path: the port's output},
    {variable path: d <r, logits> / d it}); the blocks' submodule outputs from the chain of layer
    slices, each run on the chain's previous output, not from the scan."""
    ids = jnp.asarray(input_ids)
    r = jnp.asarray(direction((*ids.shape, config.vocab_size)))
    if isinstance(port, tuple):  # Linen: (module, variables)
        module, variables = port

        def total(params):
            output = module.apply({"params": params}, ids)
            return (output.logits * r).sum(), output

        grads, output = jax.jit(jax.grad(total, has_aux=True))(variables["params"])
        flat = {".".join(str(key.key) for key in path): np.asarray(g) for path, g in jax.tree_util.tree_leaves_with_path(grads)}
        embedded = module.apply(variables, ids, method=lambda m, ids: (m.transformer.wte(ids), m.transformer.wpe(positions(ids))))
        stack = variables["params"]["transformer"]["h"]
        layers = [functools.partial(linen_layer, config, row(stack, i)) for i in range(config.n_layers)]
    else:
        output, grads = nnx_forward(port, ids, r)
        flat = families.nnx_arrays(grads)
        embedded = (port.transformer.wte(ids), port.transformer.wpe(positions(ids)))
        layers = [functools.partial(nnx_layer, graphdef, state) for graphdef, state in nnx_blocks(port, config)]
    values = {"transformer.wte": embedded[0], "transformer.wpe": embedded[1], "transformer.drop": output.hidden_states[0]}
    h = output.hidden_states[0]
    for i, layer in enumerate(layers):
        outputs = layer(h)
        values |= {f"transformer.h.{i}" + (f".{path}" if path else ""): value for path, value in outputs.items()}
        h = outputs[""]
    values |= {"transformer.ln_f": output.hidden_states[-1], "lm_head": output.logits}
    to_numpy = functools.partial(jax.tree.map, np.asarray)
    return to_numpy(output.logits), to_numpy(list(output.hidden_states)), to_numpy(values), flat


def matched(calls, values) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(path, reference output, port output) for every reference module output with a counterpart
    in the port, in the reference's order (each module is called once); wpe's (1, T, D) broadcast."""
    return [(path, np.broadcast_to(value, values[path].shape), values[path]) for path, value in calls if path in values]


@functools.cache
def reference_run(factory: str):
    """torch_side of gpt2_scan_convert.<factory>(), computed once."""
    model, (ids,) = getattr(gpt2_scan_convert, factory)()
    return torch_side(model, ids)


@pytest.mark.slow  # the checker's tests hold the property in the fast tier (tests/tools/port_check_zoo/test_zoo_checker.py)
@pytest.mark.parametrize("style", list(PORTS))
def test_each_faithful_port_agrees_at_the_logits_every_layer_and_every_gradient(style):
    reference, ported, convert, config = PORTS[style]
    logits, hidden, calls, grads = reference_run(reference)
    port, (ids,) = getattr(gpt2_scan_convert, ported)(dtype=DTYPE)
    port_logits, port_hidden, values, port_grads = port_side(port, ids, config)
    assert port_logits.dtype == np.float64 and port_logits.shape == (*ids.shape, config.vocab_size)
    assert_close(f"{style} logits", port_logits, logits, TOL)
    assert len(port_hidden) == len(hidden) == config.n_layers + 1
    for i, (port_h, h) in enumerate(zip(port_hidden, hidden)):
        assert_close(f"{style} hidden state {i}", port_h, h, TOL)
    pairs = matched(calls, values)
    assert len(pairs) == PER_LAYER * config.n_layers + 5, [path for path, *_ in pairs]
    for path, reference_output, port_output in pairs:
        assert_close(f"{style} {path}", port_output, reference_output, TOL)
    for i in range(config.n_layers - 1):  # the scan computes what the chain of slices does (the last block's output goes to ln_f)
        assert_close(f"{style} scan vs slice {i}", port_hidden[i + 1], values[f"transformer.h.{i}"], TOL)
    pulled_back = from_flax(port_grads, config, grouped=style == "grouped")
    assert set(pulled_back) == set(grads)
    for name, grad in pulled_back.items():
        assert grad.shape == grads[name].shape and np.any(grad), name
        assert_close(f"{style} gradient of {name}", grad, grads[name], tolerance("grad", DTYPE))


def test_the_converters_take_every_array_once_stacked_and_are_undone_by_their_inverse():
    for config, convert, grouped in ((CONFIG, gpt2_scan_convert.to_flax, False), (GROUPED, gpt2_scan_convert.to_flax_grouped, True)):
        state = numpy_state(gpt2_torch.build(config))
        arrays = convert(state, config)
        back = from_flax(arrays, config, grouped)
        assert set(back) == set(state) - {"lm_head.weight"} and all(np.array_equal(back[name], state[name]) for name in back)
        with pytest.raises(ValueError, match="unused: transformer.h.0.attn.bias"):  # GPT-2's causal-mask buffer, had it been persistent
            convert(state | {"transformer.h.0.attn.bias": np.tril(np.ones((5, 5)))}, config)
        with pytest.raises(ValueError, match="has no 'transformer.h.1.mlp.c_fc.bias'"):
            convert({name: value for name, value in state.items() if name != "transformer.h.1.mlp.c_fc.bias"}, config)
    state = numpy_state(gpt2_torch.build(CONFIG))
    arrays, D = gpt2_scan_convert.to_flax(state), CONFIG.d_model
    assert arrays["transformer.h.attn.c_attn.kernel"].shape == (3, D, 3 * D) and arrays["transformer.h.mlp.c_proj.kernel"].shape == (3, 4 * D, D)
    assert np.array_equal(arrays["transformer.h.attn.c_proj.kernel"][2], state["transformer.h.2.attn.c_proj.weight"])  # (in, out) as it is
    state = numpy_state(gpt2_torch.build(GROUPED))
    grouped = gpt2_scan_convert.to_flax_grouped(state)
    assert np.array_equal(grouped["transformer.h.layers_1.ln_2.scale"][1], state["transformer.h.3.ln_2.weight"])  # layer 3: layers_1, slice 1


@pytest.mark.slow  # the checker's tests hold the property in the fast tier (tests/tools/port_check_zoo/test_zoo_checker.py)
@pytest.mark.parametrize("name", list(PARTS_AT))
def test_every_planted_bug_parts_the_models_at_its_module_and_not_before(name):
    logits, _, calls, _ = reference_run("reference")
    port, (ids,) = getattr(gpt2_scan_bugs, name)(dtype=DTYPE)
    port_logits, _, values, _ = port_side(port, ids, CONFIG)
    families.assert_outputs_part(name, port_logits, logits, TOL)
    found = families.gaps(matched(calls, values))
    families.assert_parts_first_at(name, found, PARTS_AT[name], TOL)
    assert all(gap <= TOL for path, gap in found if not path.startswith(("transformer.h.1", "transformer.h.2", "transformer.ln_f", "lm_head"))), found


# each fresh port: (its factory in gpt2_scan.py, its converter, its config); Linen's apart
FRESH = {
    "scan": ("fresh", "to_flax", CONFIG),
    "split": ("fresh_split", "to_flax", CONFIG),
    "grouped": ("fresh_grouped", "to_flax_grouped", GROUPED),
    "remat": ("fresh_remat", "to_flax", CONFIG),
    "linen": (None, "to_flax", CONFIG),
}


@pytest.mark.parametrize("style", first_fast(list(FRESH)))
def test_the_fresh_ports_hold_exactly_the_variables_the_converters_fill(style):
    fresh, convert, config = FRESH[style]
    converted = families.shapes(getattr(gpt2_scan_convert, convert)(numpy_state(gpt2_torch.build(config)), config))
    if fresh is None:  # Linen: the variables module.init would create, traced only
        module, x = gpt2_scan_linen.ScanGPT2LMHeadModel(config), inputs.gpt2(config)
        expected = jax.eval_shape(module.init, jax.random.key(0), *x)["params"]
        assert {".".join(str(key.key) for key in path): leaf.shape for path, leaf in jax.tree_util.tree_leaves_with_path(expected)} == converted
        return
    model, (ids,) = nnx.eval_shape(getattr(gpt2_scan, fresh))  # shapes only: Flax's initializers would compile for seconds
    assert families.nnx_shapes(model) == converted  # every variable a Param: nothing else stacked
    assert ids.shape == (3, 7)


@pytest.mark.slow
def test_the_stacked_layers_are_drawn_apart():
    # nnx.split_rngs(splits=n_layers) under nnx.vmap, split_rngs={"params": True} under nn.scan: one key per layer
    model, _ = gpt2_scan.fresh()
    (_, variables), _ = gpt2_scan_linen.fresh()
    linen_kernel = variables["params"]["transformer"]["h"]["attn"]["c_proj"]["kernel"]
    for kernel in (np.asarray(model.transformer.h.attn.c_proj.kernel[...]), np.asarray(linen_kernel)):
        assert kernel.shape == (3, CONFIG.d_model, CONFIG.d_model)
        assert all(max_abs_diff(kernel[i], kernel[j]) > 0.1 for i in range(3) for j in range(i))


@pytest.mark.slow
@pytest.mark.parametrize("port", ["port", "port_split"])
def test_the_train_factories_take_the_same_steps_from_the_same_weights(port):
    # float32, as the factories build both sides; the port starts from the reference's weights. The
    # key bias is left out: its true gradient is 0 (a constant added to every score of a query), so
    # it gets rounding noise, which Adam scales to steps of up to the learning rate on either side
    params, trained = families.train_three_steps(gpt2_scan_train.reference(), getattr(gpt2_scan_train, port)(), gpt2_scan_convert.to_flax)
    tol = tolerance("stage", "float32")
    D = CONFIG.d_model
    for name, value in params.items():
        keep = np.ones(value.shape, dtype=bool)
        if name == "transformer.h.attn.c_attn.bias":
            keep[:, D : 2 * D] = False  # (n_layers, 3D): k's
        assert_close(f"{name} after 3 steps", value[keep], trained[name][keep], tol)
