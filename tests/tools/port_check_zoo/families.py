"""What the tests of the zoo's heads, fused, vae and rnn families (test_zoo_{heads,fused,vae,rnn}.py)
share beside sides.py: JAX in float64 for every test of a module that imports `x64`; the
reference run in float64 with a forward hook on every submodule and the gradients of <r, output>;
a port's variables under their flat paths; where a planted bug first parts the models; and the
first three training steps of an NNX port beside its reference, from the same weights."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from examples.zoo.convert import load_nnx
from examples.zoo.torch_weights import numpy_state
from shared.tolerances import max_abs_diff, tolerance
from tests.tools.port_check_zoo import sides

FAR = 1000  # a planted bug parts the models by more than FAR times the float64 tolerance


@pytest.fixture(autouse=True)
def x64():
    """Every test of a module that imports this fixture runs with jax_enable_x64 on."""
    with jax.enable_x64(True):
        yield


def tensors(output) -> list[torch.Tensor]:
    """A module's output (a tensor, or nested tuples of tensors and Nones: nn.LSTM's (output,
    (h_n, c_n)), nn.MultiheadAttention's (output, weights or None)) -> its tensors in order."""
    if torch.is_tensor(output):
        return [output]
    return [leaf for item in output for leaf in tensors(item)] if isinstance(output, (tuple, list)) else []


def torch_hooked(model: torch.nn.Module, x: np.ndarray, r: np.ndarray | None = None):
    """`model` (moved to float64, in place) on x as float64 -> (output as NumPy, [(module path, the
    tensors of its output as NumPy)] for every submodule in return order, {parameter name: d <r,
    output> / d it}). r has the output's shape and torch's layout; without one, sides.direction(0, ...),
    the direction sides.flax_run takes for the port's one output array."""
    model = model.double()
    calls = []

    def hook(path):
        return lambda module, arguments, output: calls.append((path, [leaf.detach().numpy() for leaf in tensors(output)]))

    handles = [module.register_forward_hook(hook(path)) for path, module in model.named_modules() if path]
    try:
        output = model(torch.as_tensor(x, dtype=torch.float64))
    finally:
        for handle in handles:
            handle.remove()
    r = sides.direction(0, tuple(output.shape), np.float64) if r is None else r
    (output * torch.as_tensor(r)).sum().backward()
    return output.detach().numpy(), calls, {name: p.grad.numpy() for name, p in model.named_parameters()}


def nnx_flat(state) -> dict[str, object]:
    """An nnx.State (a model's variables, their gradients, or an abstract model's shapes) ->
    {variable path "blocks.0.attn.qkv.kernel": its value, as it is}."""
    return {".".join(map(str, path)): variable.get_value() for path, variable in nnx.to_flat_state(state)}


def nnx_arrays(state) -> dict[str, np.ndarray]:
    """nnx_flat with every value a NumPy array."""
    return {name: np.asarray(value) for name, value in nnx_flat(state).items()}


def nnx_shapes(model: nnx.Module, *filters) -> dict[str, tuple[int, ...]]:
    """{variable path: shape} of `model`'s variables that `filters` select (nnx.Param, say; every
    variable without one), the model's arrays or, built abstractly, their shapes only."""
    return shapes(nnx_flat(nnx.state(model, *filters)))


def shapes(arrays: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """{name: array} -> {name: its shape}."""
    return {name: tuple(value.shape) for name, value in arrays.items()}


def gaps(pairs) -> list[tuple[str, float]]:
    """[(path, reference output, port output)], both in one layout -> [(path, the largest gap between the two)], in order."""
    return [(path, max_abs_diff(port_output, reference_output)) for path, reference_output, port_output in pairs]


def assert_outputs_part(name: str, port_output: np.ndarray, reference_output: np.ndarray, tol: float) -> None:
    """The planted bug `name` parts the models' outputs (one shape) by more than FAR times `tol`."""
    gap = max_abs_diff(port_output, reference_output)
    assert gap > FAR * tol, f"{name}: the outputs part by {gap:.2e} only"


def assert_parts_first_at(name: str, found: list[tuple[str, float]], parts_at: str, tol: float) -> None:
    """The first of `found` [(module path, gap)] beyond `tol` is at `parts_at`, and beyond FAR times `tol` there."""
    first = next(k for k, (_, gap) in enumerate(found) if gap > tol)
    assert found[first][0] == parts_at, found[: first + 1]
    assert found[first][1] > FAR * tol, f"{name}: {parts_at} parts by {found[first][1]:.2e} only"


def train_three_steps(reference: dict, port: dict, to_flax: Callable) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A pair's --train factories' dicts, the NNX port started from the reference's weights (to_flax:
    the pair's converter), trained side by side on their first three batches, in float32 as the
    factories build them; the losses agree within float32's stage tolerance at every step. Returns
    (the port's parameters {path: array}, the reference's trained weights converted by to_flax)."""
    load_nnx(port["model"], to_flax(numpy_state(reference["model"])))
    model, optimizer = port["model"], nnx.Optimizer(port["model"], port["optimizer"], wrt=nnx.Param)

    @nnx.jit
    def port_step(model, optimizer, batch):
        loss, grads = nnx.value_and_grad(lambda m: port["loss"](m(batch[0]), *batch))(model)
        optimizer.update(model, grads)
        return loss

    for batch, port_batch in zip(reference["inputs"][:3], port["inputs"][:3]):
        reference["optimizer"].zero_grad()
        loss = reference["loss"](reference["model"](torch.as_tensor(batch[0])), *map(torch.as_tensor, batch))
        loss.backward()
        reference["optimizer"].step()
        assert abs(float(port_step(model, optimizer, port_batch)) - loss.item()) <= tolerance("stage", "float32")
    return nnx_arrays(nnx.state(model, nnx.Param)), to_flax(numpy_state(reference["model"]))
