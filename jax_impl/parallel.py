"""Data-parallel training with JAX's own engine: a Mesh over N devices, the batch split over
them with NamedSharding(mesh, P("data")), parameters and Adam state replicated (P()), and XLA
inserting the all-reduce of the gradients when it partitions the compiled epoch.

Every device holds the same weights (one shared init, one seed) and takes its shard of the
same global batch of shared.training.epochs; the loss is the global batch's mean, so each
step is the single-device step: the same mathematics, only the order of the sums differs.

On CPU the N devices are simulated: XLA_FLAGS=--xla_force_host_platform_device_count=N must be
set before JAX initializes its backend (before the first array or jax.devices()). The command
line does it (prepare); in a library call prepare(N) first, or export the variable.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_impl.compiled import scan_steps
from jax_impl.model import TinyLM, from_exchange
from jax_impl.train import new_optimizer, optimizer_from_exchange, train_step
from shared import training
from shared.adam_state import AdamState
from shared.config import ModelConfig, TrainConfig
from shared.history import History

HOST_DEVICES = "--xla_force_host_platform_device_count"


def shard(x: np.ndarray, rank: int, dp: int) -> np.ndarray:
    """Rank `rank`'s equal share of a global batch: x (..., B, T) -> (..., B // dp, T)."""
    size = x.shape[-2] // dp
    return x[..., rank * size : (rank + 1) * size, :]  # (..., B // dp, T)


def prepare(dp: int) -> None:
    """Ask XLA for at least dp CPU devices; works only before JAX initializes its backend
    (afterwards the device count is fixed and train() says how many there are)."""
    flags = os.environ.get("XLA_FLAGS", "")
    found = re.search(rf"{HOST_DEVICES}=(\d+)", flags)
    if found is None:
        os.environ["XLA_FLAGS"] = f"{flags} {HOST_DEVICES}={dp}".strip()
    elif int(found.group(1)) < dp:
        os.environ["XLA_FLAGS"] = flags.replace(found.group(0), f"{HOST_DEVICES}={dp}")


def devices(dp: int) -> tuple[int | None, str]:
    """(how many devices there are, what they are): jax.devices() of the default backend."""
    where = f"jax.devices() on {jax.default_backend()}"
    if jax.default_backend() == "cpu":
        where += f"; on CPU set XLA_FLAGS={HOST_DEVICES}={dp} before JAX starts"
    return len(jax.devices()), where


def train(
    model_config: ModelConfig,
    train_config: TrainConfig,
    dp: int,
    init: str = "shared",
    on_step: Callable[[int, float], object] | None = None,
    resume: AdamState | None = None,
    on_epoch: Callable[[int, Any, Any], object] | None = None,
    *,
    shard: Callable[[np.ndarray, int, int], np.ndarray] = shard,
) -> History:
    """jax_impl.train.train over dp devices; returns the same History (the model and Adam
    gathered back onto one device: ordinary objects, saved as usual).

    on_epoch(epochs_done, model, optimizer), if given, is called after every epoch's steps have
    been reported (epochs_done counted over the whole run), with the live replicated model and
    optimizer, valid only during the call (the next epoch donates their buffers), as
    train.train's on_epoch.

    shard(x, rank, dp): the rows of a global batch that device `rank` trains on (a named hook,
    so a test can plant a wrong split and watch the data-parallel parity rows fail).
    Raises ValueError before any work when the batches do not split or dp exceeds the devices.
    """
    started = time.perf_counter()
    training.check_data_parallel(train_config, dp, *devices(dp))
    start_epoch = training.first_epoch(resume, train_config)
    if train_config.dtype == "float64":
        jax.config.update("jax_enable_x64", True)  # off by default: float64 would silently become float32

    # 1. ranks: dp replicas of the same init and Adam state, each to train on its shard of every batch
    # (a one-axis mesh over the first dp devices; XLA all-reduces the gradients inside the scan)
    mesh = Mesh(np.array(jax.devices()[:dp]), ("data",))
    arrays = training.initial_weights(init, model_config, train_config)
    model = (
        TinyLM(model_config, dtype=train_config.dtype, rngs=nnx.Rngs(train_config.seed)) if arrays is None else from_exchange(arrays, model_config)
    )
    optimizer = new_optimizer(model, train_config)
    if resume is not None:
        optimizer_from_exchange(resume, optimizer, model)
    graphdef, state = nnx.split((model, optimizer))
    state = jax.device_put(state, NamedSharding(mesh, P()))  # replicated

    # 2. epochs: the global batch's loss at every step, checked and reported here alone
    losses: list[float] = []
    for epochs_done, batches in enumerate(training.epochs(model_config, train_config, start=start_epoch), start=start_epoch + 1):
        state, epoch_losses = train_epoch(graphdef, state, batches, mesh, shard)
        training.record_losses(losses, epoch_losses, train_config, start_epoch, on_step)
        if on_epoch is not None:
            on_epoch(epochs_done, *nnx.merge(graphdef, state))

    # 3. result: the trained weights and Adam state as ordinary single-device objects
    state = jax.device_put(state, jax.devices()[0])
    model, optimizer = nnx.merge(graphdef, state)
    return training.history("jax", model_config, train_config, losses, started, model, optimizer, start_epoch)


def train_epoch(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    batches: Sequence[tuple[np.ndarray, np.ndarray]],
    mesh: Mesh,
    shard: Callable[[np.ndarray, int, int], np.ndarray],
) -> tuple[nnx.State, np.ndarray]:
    """jax_impl.train.train_steps on batches split over the mesh: full batches under one
    jax.lax.scan, a smaller last batch as one more scanned step; XLA all-reduces the gradients."""
    size = len(batches[0][0])
    full = [batch for batch in batches if len(batch[0]) == size]
    # the full batches stacked, (steps, B, T), for one scan
    xs, ys = np.stack([x for x, _ in full]), np.stack([y for _, y in full])
    state, losses = scan_steps(train_step, graphdef, state, place(xs, mesh, shard), place(ys, mesh, shard))
    for x, y in batches[len(full) :]:
        state, loss = scan_steps(train_step, graphdef, state, place(x[None], mesh, shard), place(y[None], mesh, shard))
        losses = jax.numpy.concatenate([losses, loss])
    return state, np.asarray(losses)


def place(x: np.ndarray, mesh: Mesh, shard: Callable[[np.ndarray, int, int], np.ndarray]) -> jax.Array:
    """A NumPy global batch (steps, B, T) as one jax.Array split along B: device r holds
    shard(x, r, dp), which is what NamedSharding(mesh, P(None, "data")) says it holds."""
    dp = mesh.devices.size
    sharding = NamedSharding(mesh, P(None, "data"))  # (steps, B // dp, T) per device
    parts = [jax.device_put(shard(x, rank, dp), device) for rank, device in enumerate(mesh.devices.flat)]
    return jax.make_array_from_single_device_arrays(x.shape, sharding, parts)
