"""The zoo's recurrent pairs (examples/zoo/rnn_*.py), checked without the port checker, in float64:
each faithful port agrees with its reference at the output, at the recurrent module's output
(torch's (output, (h_n, c_n)) / (output, h_n), leaf by leaf; the per-example Equinox LSTM returns
its output sequence alone) and at every gradient of <r, output>, pulled back to torch's names and
layouts by an inverse of each converter written here (b_ih and b_hh each get the gradient of the
bias that holds their sum); each converter takes every element of the state_dict exactly once,
and the ports hold exactly what it fills; the GRU converter to nnx.GRUCell refuses a b_hn it
cannot hold; each planted bug parts the models where the table says, far beyond the tolerance
(the gradient one keeps the outputs and parts the recurrent layer's gradients); the bias-free
Equinox ports train as torch does, step for step, and the port of summed biases does not (each
SGD step moves torch's b_ih + b_hh twice as far).

The NNX ports run nnx.RNN, whose scan does not take nnx.capture's recorded intermediates (sides.py's
flax_run): the recurrent module's output is the module called on the same inputs."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx

from examples.zoo import catalog, rnn_bugs, rnn_convert, rnn_torch, rnn_train, train_common
from examples.zoo.convert import StateDict
from examples.zoo.convert_equinox import equinox_arrays, equinox_shapes
from examples.zoo.rnn_torch import GRU, GRU_NO_BIAS, LSTM, LSTM_NO_BIAS, RNNConfig
from examples.zoo.torch_weights import numpy_state
from shared.tolerances import assert_close, max_abs_diff, tolerance
from tests.tools.port_check_zoo import families, sides
from tests.tools.port_check_zoo.families import FAR, x64  # noqa: F401  (x64, autouse: every test here in float64)

DTYPE = "float64"
Z = "examples.zoo."
H = LSTM.hidden_size


# --- the inverses of the converters: ({port path: gradient}, config) -> {torch name: gradient}, every array taken once ---


def lstm_from_flax(grads, config: RNNConfig = LSTM) -> dict[str, np.ndarray]:
    take = StateDict(grads)
    state = {"head.weight": take("head.kernel").T, "head.bias": take("head.bias")}  # (H, O) -> (O, H)
    for k in range(config.num_layers):
        cell = f"lstm.layers.{k}.cell."
        state[f"lstm.weight_ih_l{k}"] = np.concatenate([take(f"{cell}{g}.kernel").T for g in ("ii", "if_", "ig", "io")])  # 4 x (in, H) -> (4H, in)
        state[f"lstm.weight_hh_l{k}"] = np.concatenate([take(f"{cell}{g}.kernel").T for g in ("hi", "hf", "hg", "ho")])  # 4 x (H, H) -> (4H, H)
        state[f"lstm.bias_ih_l{k}"] = state[f"lstm.bias_hh_l{k}"] = np.concatenate([take(f"{cell}{gate}.bias") for gate in ("hi", "hf", "hg", "ho")])
    take.finish()
    return state


def gru_from_flax(grads, config: RNNConfig = GRU) -> dict[str, np.ndarray]:
    """b_hn has no counterpart in nnx.GRUCell: its rows come back NaN."""
    take = StateDict(grads)
    state = {"head.weight": take("head.kernel").T, "head.bias": take("head.bias")}
    for k in range(config.num_layers):
        cell = f"gru.layers.{k}.cell."
        state[f"gru.weight_ih_l{k}"] = take(f"{cell}dense_i.kernel").T  # (in, 3H) -> (3H, in)
        state[f"gru.weight_hh_l{k}"] = take(f"{cell}dense_h.kernel").T  # (H, 3H) -> (3H, H)
        bias = take(f"{cell}dense_i.bias")  # (3H,): r, z sums and b_in
        state[f"gru.bias_ih_l{k}"] = bias
        state[f"gru.bias_hh_l{k}"] = np.concatenate([bias[: 2 * H], np.full(H, np.nan)])
    take.finish()
    return state


def from_equinox(grads, config: RNNConfig) -> dict[str, np.ndarray]:
    """Either cell's: b_ih and b_hh each get the gradient of the cell's bias, which holds their sum,
    but for the GRU's b_hn rows, which get bias_n's."""
    take, rnn = StateDict(grads), config.cell
    state = {"head.weight": take("head.weight"), "head.bias": take("head.bias")}
    for k in range(config.num_layers):
        cell = f"{rnn}.layers.{k}."
        state[f"{rnn}.weight_ih_l{k}"], state[f"{rnn}.weight_hh_l{k}"] = take(f"{cell}weight_ih"), take(f"{cell}weight_hh")
        if config.bias:
            bias = take(f"{cell}bias")  # (G*H,)
            state[f"{rnn}.bias_ih_l{k}"] = bias
            state[f"{rnn}.bias_hh_l{k}"] = bias if rnn == "lstm" else np.concatenate([bias[: 2 * H], take(f"{cell}bias_n")])  # r, z sums; b_hn
    take.finish()
    return state


# pair -> (reference, converted port, fresh port, converter, the converter's inverse (grads, config), config)
PAIRS = {
    "lstm_flax": ("rnn_torch:lstm", "rnn_convert:ported_lstm_flax", "rnn_flax:fresh_lstm", "rnn_convert:lstm_to_flax", lstm_from_flax, LSTM),
    "gru_flax": ("rnn_torch:gru_zero_hn", "rnn_convert:ported_gru_flax", "rnn_flax:fresh_gru", "rnn_convert:gru_to_flax", gru_from_flax, GRU),
    "lstm_equinox": (
        "rnn_torch:lstm",
        "rnn_convert:ported_lstm_equinox",
        "rnn_equinox:fresh_lstm",
        "rnn_convert:lstm_to_equinox",
        from_equinox,
        LSTM,
    ),
    "lstm_no_bias_equinox": (
        "rnn_torch:lstm_no_bias",
        "rnn_convert:ported_lstm_no_bias_equinox",
        "rnn_equinox:fresh_lstm_no_bias",
        "rnn_convert:lstm_no_bias_to_equinox",
        from_equinox,
        LSTM_NO_BIAS,
    ),
    "gru_equinox": ("rnn_torch:gru", "rnn_convert:ported_gru_equinox", "rnn_equinox:fresh_gru", "rnn_convert:gru_to_equinox", from_equinox, GRU),
    "gru_no_bias_equinox": (
        "rnn_torch:gru_no_bias",
        "rnn_convert:ported_gru_no_bias_equinox",
        "rnn_equinox:fresh_gru_no_bias",
        "rnn_convert:gru_no_bias_to_equinox",
        from_equinox,
        GRU_NO_BIAS,
    ),
}
# bug (rnn_bugs.<name>) -> (its reference, where the models first part: a reference module path for
# "output", the reference's parameters whose gradients part for "gradient", section)
BUGS = {
    "lstm_gates_tf_order": ("rnn_torch:lstm", "lstm", "output"),
    "lstm_hidden_bias_dropped": ("rnn_torch:lstm", "lstm", "output"),
    "lstm_batch_first_ignored": ("rnn_torch:lstm", "lstm", "output"),
    "gru_hn_folded": ("rnn_torch:gru", "gru", "output"),
    "gru_keras_gate_order": ("rnn_torch:gru", "gru", "output"),
    "gru_carry_detached": ("rnn_torch:gru", "gru.weight_ih_l0 gru.weight_hh_l0 gru.bias_ih_l0 gru.bias_hh_l0", "gradient"),
}


def build(spec: str, **kwargs):
    return catalog.build(Z + spec, **kwargs)


def port_side(model, x: np.ndarray, r: np.ndarray, cell: str):
    """(output, {module path: the leaves of its output}, {port path: d <r, output> / d it}), in one compiled program."""
    x = jnp.asarray(x)
    if isinstance(model, nnx.Module):
        graphdef, params = nnx.split(model)
        rebuild, call = (lambda p: nnx.merge(graphdef, p)), (lambda m, x: m(x))
        inner = lambda m, x: getattr(m, cell)(x)  # noqa: E731
    else:
        batched = getattr(model, "port_check_batched", False)
        params, static = eqx.partition(model, eqx.is_inexact_array)
        rebuild = lambda p: eqx.combine(p, static)  # noqa: E731
        call = (lambda m, x: m(x)) if batched else (lambda m, x: jax.vmap(m)(x))  # the port check's per-example call
        inner = (lambda m, x: getattr(m, cell)(x)) if batched else (lambda m, x: jax.vmap(getattr(m, cell))(x))

    @jax.jit
    def run(params):
        def total(params):
            output = call(rebuild(params), x)
            return jnp.sum(output * r), output

        grads, output = jax.grad(total, has_aux=True)(params)
        return output, inner(rebuild(params), x), grads

    output, recurrent, grads = run(params)
    flat = families.nnx_arrays(grads) if isinstance(model, nnx.Module) else equinox_arrays(grads)
    leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(recurrent)]
    return np.asarray(output), {cell: leaves, "head": [np.asarray(output)]}, flat


def gaps(torch_calls, port_calls) -> list[tuple[str, float]]:
    """(path, the largest gap of its output's leaves) for each reference module in return order: the
    port's leaves paired in order (the per-example LSTM's one leaf with torch's output sequence); a
    leaf of another shape is an infinite gap."""
    found = []
    for path, leaves in torch_calls:
        theirs = port_calls[path]
        assert len(theirs) in (1, len(leaves)), (path, len(theirs), len(leaves))
        found.append((path, max(max_abs_diff(a, b) if a.shape == b.shape else np.inf for a, b in zip(leaves, theirs))))
    return found


def run_pair(reference_spec: str, port, cell: str):
    (reference, (x,)), (model, (y,)) = build(reference_spec), port
    r = sides.direction(0, x.shape[:-1] + (reference.head.out_features,), np.float64)
    return families.torch_hooked(reference, x, r), port_side(model, y.astype(np.float64), r, cell)


@pytest.mark.slow  # the checker's tests hold the property in the fast tier (tests/tools/port_check_zoo/test_zoo_checker.py)
@pytest.mark.parametrize("name", sorted(PAIRS))
def test_every_faithful_pair_agrees_at_the_output_the_recurrent_module_and_every_gradient(name):
    reference_spec, port_spec, _, _, inverse, config = PAIRS[name]
    (expected, torch_calls, torch_grads), (actual, port_calls, port_grads) = run_pair(reference_spec, build(port_spec, dtype=DTYPE), config.cell)
    tol = tolerance("stage", DTYPE)
    assert actual.dtype == np.float64 and actual.shape == expected.shape
    assert_close(f"{name} output", actual, expected, tol)
    assert [path for path, _ in torch_calls] == [config.cell, "head"]
    (_, leaves), ours = torch_calls[0], port_calls[config.cell]
    per_example = len(ours) == 1  # the per-example Equinox LSTM: its output sequence alone
    assert [leaf.shape for leaf in ours] == [leaf.shape for leaf in leaves[: len(ours)]] and (per_example or len(ours) == len(leaves))
    for k, (a, b) in enumerate(zip(ours, leaves)):
        assert_close(f"{name} {config.cell} leaf {k}", a, b, tol)
    pulled_back = inverse(port_grads, config)
    assert set(pulled_back) == set(torch_grads)
    for parameter, grad in pulled_back.items():
        held = ~np.isnan(grad)  # nnx.GRUCell has no b_hn
        assert held.all() or (name == "gru_flax" and parameter.startswith("gru.bias_hh") and held.sum() == 2 * H), parameter
        assert np.any(grad[held]), parameter
        assert_close(f"{name} gradient of {parameter}", grad[held], torch_grads[parameter][held], tolerance("grad", DTYPE))


def test_every_converter_takes_every_element_once_and_fills_exactly_what_the_fresh_port_holds():
    for name, (reference_spec, _, fresh_spec, convert_spec, _, _) in PAIRS.items():
        convert, state = catalog.resolve(Z + convert_spec), numpy_state(build(reference_spec)[0])
        base = convert(state)
        fresh = (eqx.filter_eval_shape if "equinox" in name else nnx.eval_shape)(lambda spec=fresh_spec: build(spec)[0])  # shapes only
        assert families.shapes(base) == (families.nnx_shapes(fresh) if isinstance(fresh, nnx.Module) else equinox_shapes(fresh)), name
        for array, value in state.items():
            moved = np.ones_like(value)
            if name == "gru_flax" and array == "gru.bias_hh_l0":
                moved[2 * H :] = 0.0  # b_hn must stay zero (the refusal is checked below)
            changes = np.concatenate([(new - base[path]).ravel() for path, new in convert(state | {array: value + moved}).items()])
            changed = changes[np.abs(changes) > 1e-6]
            # each element moved by 1 moves exactly one element of the result, by 1: taken once, never dropped or copied
            assert changed.size == moved.sum() and np.allclose(changed, 1.0, atol=1e-6), (name, array, changed.size, moved.sum())
        with pytest.raises(ValueError, match="unused: head.extra"):
            convert(state | {"head.extra": state["head.bias"]})


def test_the_nnx_gru_converter_refuses_a_b_hn_it_cannot_hold():
    with pytest.raises(ValueError, match="nnx.GRUCell has no b_hn"):
        rnn_convert.gru_to_flax(numpy_state(build("rnn_torch:gru")[0]))
    assert not np.any(numpy_state(build("rnn_torch:gru_zero_hn")[0])["gru.bias_hh_l0"][2 * H :])


@pytest.mark.slow  # the checker's tests hold the property in the fast tier (tests/tools/port_check_zoo/test_zoo_checker.py)
@pytest.mark.parametrize("name", sorted(BUGS))
def test_every_planted_bug_parts_the_models_where_the_table_says(name):
    reference_spec, parts_at, section = BUGS[name]
    cell = reference_spec.rpartition(":")[2].split("_")[0]
    (expected, torch_calls, torch_grads), (actual, port_calls, port_grads) = run_pair(reference_spec, getattr(rnn_bugs, name)(dtype=DTYPE), cell)
    tol = tolerance("stage", DTYPE)
    found = gaps(torch_calls, port_calls)
    if section == "output":
        families.assert_outputs_part(name, actual, expected, tol)
        families.assert_parts_first_at(name, found, parts_at, tol)
    else:
        gap = max_abs_diff(actual, expected)
        assert gap <= tol and all(g <= tol for _, g in found), (gap, found)
        *_, inverse, config = PAIRS[f"{cell}_equinox"]
        pulled_back = inverse(port_grads, config)
        parted = {p for p, g in pulled_back.items() if max_abs_diff(g, torch_grads[p]) > FAR * tolerance("grad", DTYPE)}
        agreed = {p for p, g in pulled_back.items() if max_abs_diff(g, torch_grads[p]) <= tolerance("grad", DTYPE)}
        assert parted == set(parts_at.split()) and agreed == set(torch_grads) - parted, (parted, agreed)


@pytest.mark.slow  # the checker's tests hold the property in the fast tier (tests/tools/port_check_zoo/test_zoo_checker.py)
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_step_moves_torchs_two_biases_twice_as_far_as_the_cells_one_bias_of_their_sum(optimizer):
    # rnn_train's claim for the LSTM against nnx.RNN(nnx.LSTMCell): both of torch's biases get the
    # gradient of their sum, and each takes the step the cell's one bias takes (Adam's first step
    # too: the same gradient gives the same moments), so their sum moves twice as far. SGD by hand:
    # torch.optim's first use imports for seconds
    x, target = rnn_train.batches(LSTM)[0]
    reference = rnn_train.lstm_reference() if optimizer == "adam" else {"model": rnn_torch.build(LSTM)}
    model = reference["model"].double()  # in place: an optimizer over it holds the same parameters
    before = numpy_state(model)
    train_common.torch_mse(model(torch.as_tensor(x, dtype=torch.float64)), x, torch.as_tensor(target, dtype=torch.float64)).backward()
    if optimizer == "sgd":
        after, tx = {name: p.detach().numpy() - rnn_train.LR * p.grad.numpy() for name, p in model.named_parameters()}, optax.sgd(rnn_train.LR)
    else:
        reference["optimizer"].step()
        after, tx = numpy_state(model), rnn_train.lstm_port()["optimizer"]
    graphdef, params = nnx.split(rnn_convert.ported_lstm_flax(DTYPE)[0])  # the port's weights, converted in float64

    @jax.jit
    def step(params):
        loss = lambda p: train_common.jax_mse(nnx.merge(graphdef, p)(jnp.asarray(x, jnp.float64)), x, jnp.asarray(target, jnp.float64))  # noqa: E731
        grads = jax.grad(loss)(params)
        return tx.update(grads, tx.init(params), params)[0]

    moved = lstm_from_flax(families.nnx_arrays(step(params)))
    for k in range(LSTM.num_layers):
        names = (f"lstm.bias_ih_l{k}", f"lstm.bias_hh_l{k}")
        torch_moved = sum(after[n] - before[n] for n in names)  # (4H,)
        assert np.abs(moved[names[0]]).min() > 1e-9
        assert_close(f"layer {k}: torch's b_ih + b_hh move / the cell's bias move", torch_moved / moved[names[0]], np.full(4 * H, 2.0), 1e-6)
        for weight in (f"lstm.weight_ih_l{k}", f"lstm.weight_hh_l{k}"):  # the weights move alike
            assert_close(f"{weight} move", after[weight] - before[weight], moved[weight], tolerance("grad", DTYPE))


@pytest.mark.slow  # a real training run, and torch.optim's first use imports for seconds
@pytest.mark.parametrize("name", ["lstm_no_bias", "gru_no_bias"])
def test_the_bias_free_equinox_ports_train_as_torch_step_for_step(name):
    # what the --train check does with rnn_train's factories, in float64: Adam in torch, optax.adam in JAX
    reference, port = getattr(rnn_train, f"{name}_reference")(), getattr(rnn_train, f"{name}_port")()
    config = LSTM_NO_BIAS if name == "lstm_no_bias" else GRU_NO_BIAS
    model = reference["model"].double()  # the optimizer holds the same parameters
    params, static = eqx.partition(port["model"], eqx.is_inexact_array)
    params = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), params)  # the port cast to float64, as the check casts it
    batched = getattr(port["model"], "port_check_batched", False)
    tx, mapping = port["optimizer"], rnn_train.name_map(config)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, x, target):
        def loss(params):
            m = eqx.combine(params, static)
            return port["loss"](m(x) if batched else jax.vmap(m)(x), x, target)

        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    layout = (config.batch, config.time) if config.batch_first else (config.time, config.batch)
    assert reference["inputs"][0][0].shape == port["inputs"][0][0].shape == (*layout, config.input_size)
    for n, ((x, target), (y, port_target)) in enumerate(zip(reference["inputs"], port["inputs"]), 1):
        reference["optimizer"].zero_grad()
        torch_value = reference["loss"](model(torch.as_tensor(x, dtype=torch.float64)), x, torch.as_tensor(target, dtype=torch.float64))
        torch_value.backward()
        reference["optimizer"].step()
        value, params, opt_state = step(params, opt_state, jnp.asarray(y, jnp.float64), jnp.asarray(port_target, jnp.float64))
        assert abs(float(value) - torch_value.item()) <= 1e-12, (n, float(value), torch_value.item())
        ours = equinox_arrays(params)
        for parameter, value in model.named_parameters():
            assert_close(f"step {n}: {parameter}", ours[mapping.get(parameter, parameter)], value.detach().numpy(), tolerance("trajectory", DTYPE))
