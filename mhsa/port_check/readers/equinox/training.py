"""The Equinox half of the port check through training: train an eqx.Module port with its optax
transformation, step by step, and record each step in the neutral form of core/training_records.py;
run the transformation on the lint's probe gradients. The same members as readers/flax/training.py
(owns, check_setup, Trainer, probe): the training check finds it through readers.TRAINERS, as it
finds the Flax one; what both do with optax alike is readers/optax_steps.py.

A step is Equinox's own: the model partitioned into its floating arrays (eqx.is_inexact_array) and
the rest, the loss and gradients by jax.value_and_grad on the arrays, then tx.update and
optax.apply_updates, compiled as one function; the model is called as the forward check calls it
(per example under jax.vmap, unless it sets port_check_batched). An array assigned to two fields is
two leaves here, trained apart, as Equinox trains it. Moments are found in the optax state by type,
as the Flax trainer finds them, and named as reader.parameters names the arrays.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import numpy as np
import optax

from mhsa.port_check.core.structure import Inputs
from mhsa.port_check.core.training_records import StepRecord
from mhsa.port_check.readers import optax_steps
from mhsa.port_check.readers.equinox import reader

owns = optax_steps.owns  # an optax GradientTransformation


def check_setup(setup: dict) -> None:
    """Raise ValueError where the port cannot be trained here: no eqx.Module, a clip or scheduler
    key (optax puts both inside the transformation)."""
    if not isinstance(setup["model"], eqx.Module):
        raise ValueError(f"the Equinox trainer takes an eqx.Module; got {type(setup['model']).__name__}")
    for key in ("clip", "scheduler"):
        if setup.get(key) is not None:
            raise ValueError(
                f"the Equinox factory's '{key}' belongs inside its optax transformation (optax.clip_by_global_norm, a schedule as learning_rate)"
            )


def neutral_names(model: Any) -> dict[tuple, tuple[str, str | None]]:
    """key path of each floating array (as jax.tree_util flattens the model) -> (neutral name,
    layout): the names and layouts reader.parameters gives."""
    kinds = {path: info.kind for path, info in reader.describe(model, Inputs()).items()}
    names = {}
    for path, _ in jax.tree_util.tree_flatten_with_path(eqx.filter(model, eqx.is_inexact_array))[0]:
        keys = tuple(_key(entry) for entry in path)
        module = ".".join(str(key) for key in keys[:-1])
        layout = "conv_bias" if kinds.get(module) == "Conv" and keys[-1] == "bias" else None
        names[keys] = (".".join(str(key) for key in keys), layout)
    return names


def _key(entry) -> Any:
    return getattr(entry, "name", getattr(entry, "idx", getattr(entry, "key", entry)))


def neutral(names: dict, tree) -> dict[str, np.ndarray]:
    """A tree shaped like the model's floating arrays (gradients, a moment) -> {neutral name: array
    in torch's layout}; a leaf that is no array (optax.MaskedNode) is left out."""
    out = {}
    for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
        keys = tuple(_key(entry) for entry in path)
        if keys in names and hasattr(value, "shape"):
            name, layout = names[keys]
            array = np.asarray(value)
            out[name] = array.reshape(-1) if layout == "conv_bias" else array
    return out


def moments(names: dict, state) -> dict[tuple[str, str], np.ndarray]:
    return {(kind, name): value for kind, tree in optax_steps.moment_trees(state) for name, value in neutral(names, tree).items()}


class Trainer:
    """Trains the port (weights already transferred) in `dtype` with its optax transformation;
    step(batch) -> StepRecord. A float64 trainer computes with JAX's 64-bit types on during its own
    calls only."""

    def __init__(self, setup: dict, model: Any, dtype: str):
        self.x64 = dtype == "float64"
        with optax_steps.x64(self.x64):
            self._start(setup, reader.cast(model, dtype)[0])

    def _start(self, setup, model):
        self.names = neutral_names(model)
        self.params, static = eqx.partition(model, eqx.is_inexact_array)
        self.tx = setup["optimizer"]
        self.opt_state = jax.jit(self.tx.init)(self.params)
        floats = jax.tree_util.tree_leaves(self.params)  # every leaf is a floating array
        self.dtype = np.dtype(floats[0].dtype) if floats else np.dtype(np.float32)
        self._step = jax.jit(_step_function(static, self.tx, setup["loss"], setup.get("model_inputs"), reader.batched(model)))

    def step(self, batch: tuple) -> StepRecord:
        with optax_steps.x64(self.x64):
            arrays = tuple(np.asarray(x, dtype=self.dtype) if np.issubdtype(np.asarray(x).dtype, np.floating) else np.asarray(x) for x in batch)
            loss, grads, self.params, self.opt_state = self._step(self.params, self.opt_state, arrays)
            return StepRecord(float(loss), neutral(self.names, grads), neutral(self.names, self.params), moments(self.names, self.opt_state))


def _step_function(static, tx, loss_fn, model_inputs, batched: bool):
    def step(params, opt_state, batch):
        def objective(params):
            model = eqx.combine(params, static)
            inputs = batch[:model_inputs]
            output = model(*inputs) if batched else jax.vmap(model)(*inputs)  # per example, as the forward check calls it
            return loss_fn(output, *batch)

        value, grads = jax.value_and_grad(objective)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return value, grads, optax.apply_updates(params, updates), opt_state

    return step


def probe(setup: dict, model: Any, scenarios: list[tuple[float, list[float]]]) -> tuple[list[list[dict]], int]:
    """Run the transformation on each scenario, as the Flax trainer's probe does: (p0, [g_1, ...,
    g_n]) sets every element of every array to p0 and every gradient element at step t to g_t, on
    the model's own tree (so masks and labels apply). Returns (per scenario, per step: {"update":
    {name: value}, "param": {name: value after the step}, "moment": {(moment, name): value}}, the
    number of elements of all arrays together), read at the first element."""
    names = neutral_names(model)
    template = eqx.filter(model, eqx.is_inexact_array)
    return optax_steps.probe(setup["optimizer"], template, lambda tree: neutral(names, tree), lambda state: moments(names, state), scenarios)
