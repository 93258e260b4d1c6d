"""jax_impl/compiled.py's start-up: Adam's zero state built without compiling equals nnx.Optimizer's leaf for
leaf and updates alike, and a run compiles its programs, not one small program per parameter
shape."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import optax  # noqa: E402
from flax import nnx  # noqa: E402

from jax_impl import compiled, model, train  # noqa: E402
from shared import training  # noqa: E402
from shared.config import ModelConfig, TrainConfig  # noqa: E402
from tests.backends import SMALL  # noqa: E402

CONFIG = TrainConfig(epochs=2, n_sequences=100, batch_size=6)


def test_adam_built_without_compiling_equals_nnx_optimizer_leaf_for_leaf():
    m = model.from_exchange(training.initial_weights("shared", SMALL, CONFIG), SMALL)
    built = compiled.zeros_optimizer(m, CONFIG)
    tx = optax.adam(CONFIG.lr, *CONFIG.betas, eps=CONFIG.eps)
    eager = nnx.Optimizer(m, tx, wrt=nnx.Param)
    got, expected = nnx.state(built), nnx.state(eager)
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    # the same transformation: one update from each moves the weights identically
    grads = jax.tree.map(lambda leaf: jax.device_put(np.full(leaf.shape, 0.1, leaf.dtype)), nnx.state(m, nnx.Param))  # copies, not the model's own
    assert type(built.tx) is type(eager.tx) and built.wrt == eager.wrt
    twin = model.from_exchange(model.to_exchange(m), SMALL)
    built.update(m, grads)
    eager_twin = nnx.Optimizer(twin, tx, wrt=nnx.Param)
    eager_twin.update(twin, grads)
    for name, value in model.to_exchange(m).items():
        assert np.array_equal(value, model.to_exchange(twin)[name]), name


def test_a_run_compiles_its_programs_not_one_per_parameter_shape():
    """A config no other test trains, so its steps are not cached: the non-parameter buffers and the
    scanned steps are one compiled program each, Adam's zero state none (eagerly, the random key,
    each zeros_like and each transposed weight compiled one small program per shape)."""
    programs = []

    def listen(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            programs.append(event)

    fresh = ModelConfig(vocab_size=13, d_model=20, n_heads=5, max_len=9)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        train.train(fresh, TrainConfig(epochs=1, n_sequences=32, batch_size=8))
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    # at most: the buffers' program is a constant mask that another test's TinyLM of the same
    # max_len may have compiled already (JAX reuses a compilation of identical HLO)
    assert len(programs) <= 2, f"{len(programs)} programs compiled, expected at most 2 (the buffers, the scanned steps)"
