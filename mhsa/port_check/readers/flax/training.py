"""The Flax half of the port check through training (mhsa.port_check.training.check): train an NNX
port with its optax transformation, step by step, and record each step in the neutral form of
core/training_records.py; run the transformation on the lint's probe gradients.

A step is the functional form of `nnx.Optimizer(model, tx, wrt=nnx.Param)`: the model split into
parameters, batch statistics and the rest, the loss and gradients by nnx.value_and_grad, then
tx.update and optax.apply_updates, compiled as one function. Every tree (the moments as
readers/optax_steps.py finds them) is read in the exchange convention by flax_reader.neutral.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from mhsa.port_check.core.training_records import StepRecord
from mhsa.port_check.readers import optax_steps
from mhsa.port_check.readers.flax import reader as flax_reader

owns = optax_steps.owns  # an optax GradientTransformation


def check_setup(setup: dict) -> None:
    """Raise ValueError where the port cannot be trained here: a Linen pair, a clip or scheduler
    key (optax puts both inside the transformation)."""
    if not isinstance(setup["model"], nnx.Module):
        raise ValueError("the training check takes an NNX port (a Linen (module, variables) pair is compared by the forward check only)")
    for key in ("clip", "scheduler"):
        if setup.get(key) is not None:
            raise ValueError(
                f"the Flax factory's '{key}' belongs inside its optax transformation (optax.clip_by_global_norm, a schedule as learning_rate)"
            )


def moments(names: dict, state) -> dict[tuple[str, str], np.ndarray]:
    """{(torch's moment name, neutral name): array} of every moment in the optax `state`, `names` as
    flax_reader.variable_names gives them (a masked-out leaf is left out)."""
    trees = optax_steps.moment_trees(state, (nnx.State,))
    return {(kind, name): value for kind, tree in trees for name, value in flax_reader.neutral(names, tree).items()}


class Trainer:
    """Trains the port (weights already transferred) in `dtype` with its optax transformation;
    step(batch) -> StepRecord. A float64 trainer turns JAX's 64-bit types on during its calls only."""

    def __init__(self, setup: dict, model: nnx.Module, dtype: str):
        self.x64 = dtype == "float64"
        with optax_steps.x64(self.x64):
            self._start(setup, flax_reader.cast(model, dtype)[0])

    def _start(self, setup, model):
        self.names = flax_reader.variable_names(model)
        self.graphdef, self.params, self.stats, self.rest = nnx.split(model, nnx.Param, nnx.BatchStat, ...)
        self.tx = setup["optimizer"]
        self.opt_state = jax.jit(self.tx.init)(self.params)  # one program, not one per leaf shape
        self.dtype = next(
            (np.dtype(leaf.dtype) for leaf in jax.tree.leaves(self.params) if jnp.issubdtype(leaf.dtype, jnp.floating)), np.dtype(np.float32)
        )
        self._step = jax.jit(_step_function(self.graphdef, self.tx, setup["loss"], setup.get("model_inputs")))

    def step(self, batch: tuple) -> StepRecord:
        with optax_steps.x64(self.x64):
            # NumPy in: the compiled step takes the arrays as they are, without an eager conversion each
            arrays = tuple(np.asarray(x, dtype=self.dtype) if np.issubdtype(np.asarray(x).dtype, np.floating) else np.asarray(x) for x in batch)
            loss, grads, self.params, self.stats, self.rest, self.opt_state = self._step(self.params, self.stats, self.rest, self.opt_state, arrays)
            params = flax_reader.neutral(self.names, self.params) | flax_reader.neutral(self.names, self.stats)
            return StepRecord(float(loss), flax_reader.neutral(self.names, grads), params, moments(self.names, self.opt_state))


def _step_function(graphdef, tx, loss_fn, model_inputs):
    def step(params, stats, rest, opt_state, batch):
        # nnx.value_and_grad on the merged model (not jax's on the parameters): a BatchNorm
        # writes its statistics during the call, which NNX allows only through its own transforms
        model = nnx.merge(graphdef, params, stats, rest)
        value, grads = nnx.value_and_grad(lambda model: loss_fn(model(*batch[:model_inputs]), *batch))(model)
        _, _, new_stats, new_rest = nnx.split(model, nnx.Param, nnx.BatchStat, ...)
        updates, opt_state = tx.update(grads, opt_state, params)
        return value, grads, optax.apply_updates(params, updates), new_stats, new_rest, opt_state

    return step


def probe(setup: dict, model: nnx.Module, scenarios: list[tuple[float, list[float]]]) -> tuple[list[list[dict]], int]:
    """optax_steps.probe of the port's transformation on the model's own parameter tree (so masks
    and labels apply), its arrays named as the reader names them."""
    names = flax_reader.variable_names(model)
    template = nnx.state(model, nnx.Param)
    return optax_steps.probe(
        setup["optimizer"], template, lambda tree: flax_reader.neutral(names, tree), lambda state: moments(names, state), scenarios
    )
