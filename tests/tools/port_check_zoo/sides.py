"""Running both sides of a zoo pair without the port checker: the output's arrays, every
submodule's output in call order and, on request, every parameter's gradient of <r, output>, r a
fixed random direction per output array (the same on both sides: a sum would be a constant after a
LayerNorm at its init, its gradient rounding noise), in NumPy, so that the zoo's own tests do not
depend on the tool they exist to test.

Torch: forward hooks. NNX: `nnx.capture(..., method_outputs=nnx.Intermediate)`, which records the
methods a module's class defines itself (not inherited ones). Linen: `capture_intermediates`. The
Flax side runs as one compiled program (forward, capture and gradients): eagerly, every operation
would compile on its own, about three times the CPU time for these models."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Container

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from examples.zoo.configs import Seq2SeqConfig
from examples.zoo.torch_weights import numpy_state
from shared.tolerances import max_abs_diff

# where a faithful port splits one computation at another module boundary: {reference factory:
# {module: the factor from the port's output to the reference's}} (torch's embedding scales by
# sqrt(d) inside its module, Flax's after nn.Embed)
SPLIT = {"examples.zoo.seq2seq_torch:reference": {"shared": math.sqrt(Seq2SeqConfig().d_model)}}


@dataclasses.dataclass
class Run:
    outputs: list[np.ndarray]  # the output's arrays, in order
    calls: list[tuple[str, np.ndarray]] | dict[tuple[str, int], np.ndarray]  # torch: in return order; Flax: by (path, call)
    grads: dict[str, np.ndarray] | None = None  # in the port's names and layout


def call_args(inputs, dtype: str, to_array: Callable) -> tuple[tuple, dict]:
    """inputs (a tuple of arrays, or a dict of keyword arrays) -> (args, kwargs), floating arrays
    cast to `dtype` and integer ones kept, each through `to_array`."""

    def cast(x):
        x = np.asarray(x)
        return to_array(x.astype(dtype) if np.issubdtype(x.dtype, np.floating) else x)

    if isinstance(inputs, dict):
        return (), {name: cast(x) for name, x in inputs.items()}
    return tuple(cast(x) for x in inputs), {}


def leaves(output) -> list:
    """An output (an array, a dataclass of arrays and tuples of arrays, a tuple) -> its arrays in order."""
    if dataclasses.is_dataclass(output):
        return [leaf for field in dataclasses.fields(output) for leaf in leaves(getattr(output, field.name))]
    if isinstance(output, (tuple, list)):
        return [leaf for item in output for leaf in leaves(item)]
    return [output]


def direction(k: int, shape: tuple[int, ...], dtype) -> np.ndarray:
    """The fixed random direction r of output array k: N(0, 1), seeded by k."""
    return np.random.default_rng(1000 + k).standard_normal(shape).astype(dtype)


def torch_run(model, inputs, dtype: str, convert=None) -> Run:
    """Run the reference once; with `convert` (our converter) also d <r, output> / d every
    parameter, converted to the port's names and layout (buffers, which have none, as zeros).
    Modules that return something other than a tensor are not recorded."""
    model = model.to(getattr(torch, dtype))
    args, kwargs = call_args(inputs, dtype, torch.as_tensor)
    calls = []

    def hook(path):
        return lambda module, arguments, output: calls.append((path, output.detach().numpy())) if isinstance(output, torch.Tensor) else None

    handles = [module.register_forward_hook(hook(path)) for path, module in model.named_modules() if path]
    try:
        with torch.set_grad_enabled(convert is not None):
            output = model(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    run = Run([leaf.detach().numpy() for leaf in leaves(output)], calls)
    if convert is not None:
        _total(output, torch.as_tensor).backward()
        grads = {name: p.grad.numpy() for name, p in model.named_parameters(remove_duplicate=False)}  # a tied weight under each name
        run.grads = convert({name: grads.get(name, np.zeros_like(value)) for name, value in numpy_state(model).items()})
    return run


def _total(output, to_array=jnp.asarray):
    """<r, output>: every output array against its direction(k), summed."""
    return sum(
        (leaf * to_array(direction(k, tuple(leaf.shape), np.dtype(str(leaf.dtype).removeprefix("torch."))))).sum()
        for k, leaf in enumerate(leaves(output))
    )


def _calls(named) -> dict[tuple[str, int], np.ndarray]:
    """[(path parts, values of every call of one method)] -> {(module path, call): output of __call__}."""
    calls: dict[tuple[str, int], np.ndarray] = {}
    for path, values in named:
        if path[-1] == "__call__" and len(path) > 1:
            calls |= {(".".join(path[:-1]), k): np.asarray(value) for k, value in enumerate(values) if isinstance(value, jax.Array)}
    return calls


def flax_run(model, inputs, dtype: str, grads: bool = False) -> Run:
    """Run the port once, compiled; with `grads` also d <r, output> / d every parameter, {Flax path: gradient}."""
    args, kwargs = call_args(inputs, dtype, jnp.asarray)
    if isinstance(model, tuple):  # Linen: (module, variables)
        return _linen_run(model[0], model[1], args, kwargs, grads)

    @nnx.jit
    def run(model, args, kwargs):
        def loss(model):
            output, state = nnx.capture(model, nnx.Intermediate, method_outputs=nnx.Intermediate)(*args, **kwargs)
            return _total(output), (output, state)

        if not grads:
            return loss(model)[1] + (None,)
        gradients, (output, state) = nnx.grad(loss, has_aux=True)(model)
        return output, state, gradients

    output, state, gradients = run(model, args, kwargs)
    named = [(tuple(str(key) for key in path), variable.get_value()) for path, variable in nnx.to_flat_state(state)]
    flat = None if gradients is None else {".".join(map(str, path)): np.asarray(g.get_value()) for path, g in nnx.to_flat_state(gradients)}
    return Run([np.asarray(leaf) for leaf in leaves(output)], _calls(named), flat)


def _linen_run(module, variables, args, kwargs, grads: bool) -> Run:
    @jax.jit
    def run(params):
        def loss(params):
            output, state = module.apply({**variables, "params": params}, *args, **kwargs, capture_intermediates=True, mutable=["intermediates"])
            return _total(output), (output, state["intermediates"])

        if not grads:
            return loss(params)[1] + (None,)
        gradients, (output, state) = jax.grad(loss, has_aux=True)(params)
        return output, state, gradients

    output, state, gradients = run(variables["params"])
    flat = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, tuple))[0]
    named = [(tuple(str(key.key) for key in path), values) for path, values in flat]
    paths = None if gradients is None else jax.tree_util.tree_leaves_with_path(gradients)
    grads_flat = None if paths is None else {".".join(str(key.key) for key in path): np.asarray(g) for path, g in paths}
    return Run([np.asarray(leaf) for leaf in leaves(output)], _calls(named), grads_flat)


def same_layout(reference: np.ndarray, port: np.ndarray) -> np.ndarray:
    """The reference's array in the port's layout: channels first -> last for every 4-D output (the
    zoo's are all feature maps, NCHW in torch and NHWC in Flax, one shape when C = H = W), or
    broadcast ((1, T, D) -> (B, T, D))."""
    if reference.ndim == port.ndim == 4 and np.moveaxis(reference, 1, -1).shape == port.shape:
        return np.moveaxis(reference, 1, -1)
    return reference if reference.shape == port.shape else np.broadcast_to(reference, port.shape)


def matched(torch_calls, flax_calls) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(path, reference output, port output) for every reference module call, in return order,
    that has a counterpart (the same path's call of the same number) in the port."""
    seen: dict[str, int] = {}
    pairs = []
    for path, value in torch_calls:
        seen[path] = seen.get(path, -1) + 1
        other = flax_calls.get((path, seen[path]))
        if other is not None:
            pairs.append((path, same_layout(value, other), other))
    return pairs


def first_parting(pairs, tol: float, skip: Container[str] = ()) -> str | None:
    """The path of the first of `matched`'s pairs that differ beyond `tol`, those at a path in `skip` aside."""
    return next((path for path, reference, port in pairs if path not in skip and max_abs_diff(reference, port) > tol), None)
