"""Data-parallel training with PyTorch's own engine: N processes, torch.distributed and
DistributedDataParallel (gloo on CPU, nccl when every rank has a CUDA device).

Every rank starts from the same weights with the same seed (nanoGPT seeds rank r with
1337 + r, which makes a run differ from the single-device one) and takes its shard of the
same global batch of shared.training.epochs; DDP averages the gradients, so each step is the
single-device step: the same mathematics, only the order of the sums differs.

The launcher (train) starts the ranks itself on a free port of 127.0.0.1; rank 0 sends each
epoch's losses and the final weights and Adam state back, and the launcher alone prints,
saves and writes history. A rank that raises, or Ctrl-C or SIGTERM, stops every rank: one
message, no hang. The launcher alone handles those signals, which a terminal or `timeout` sends
to every process of the group: the rank server and the ranks ignore them from their start.
With on_epoch, rank 0 also sends the weights and Adam state after every epoch, so that the
launcher can hand them over while the ranks train on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from multiprocessing import connection
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from shared import checkpoint, training
from shared.adam_state import AdamState
from shared.config import ModelConfig, TrainConfig
from shared.history import History
from torch_impl.model import TinyLM, from_exchange, to_exchange
from torch_impl.train import new_optimizer, optimizer_from_exchange, optimizer_to_exchange, train_step

# forkserver: the ranks fork from one server that imported torch once, so a second run in the
# same process starts in a fraction of a second and no rank inherits the launcher's threads
START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
# what the server imports once: torch, and torch._dynamo that DistributedDataParallel pulls in
# (seconds per rank otherwise); not this package, or a `python -m torch_impl.train` main would run twice
PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "torch.nn.parallel", "shared.training"]


def shard(x: np.ndarray, rank: int, dp: int) -> np.ndarray:
    """Rank `rank`'s equal share of a global batch: x (..., B, T) -> (..., B // dp, T)."""
    size = x.shape[-2] // dp
    return x[..., rank * size : (rank + 1) * size, :]  # (..., B // dp, T)


def prepare(dp: int) -> None:
    """Start the ranks' server now (forkserver: one process that imports PRELOAD, seconds), so
    its start-up overlaps with this process's own work until train() starts the ranks (JAX's
    twin asks for CPU devices). Without forkserver, nothing to do: each rank starts itself."""
    if START_METHOD == "forkserver":
        from multiprocessing import forkserver

        mp.get_context(START_METHOD).set_forkserver_preload(PRELOAD)
        # the server inherits ignored signals across its exec, and its ranks inherit them from it:
        # a Ctrl-C while it imports PRELOAD would end it in a traceback, a SIGTERM would leave its
        # ranks without the server that reports their exit
        main = threading.current_thread() is threading.main_thread()  # where signal handlers can be set
        previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            forkserver.ensure_running()
        except OSError as error:  # the server's socket lies in a folder it makes in TMPDIR
            if "AF_UNIX path too long" not in str(error):
                raise
            raise OSError(
                f"TMPDIR {tempfile.gettempdir()!r}: too long for the socket of the ranks' server (a Unix socket's path holds at most 107 bytes); "
                "set TMPDIR to a shorter folder, such as /tmp"
            ) from None
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def devices(dp: int) -> tuple[int | None, str]:
    """(how many ranks can run, what they run on): CUDA devices, or any number of CPU processes."""
    if torch.cuda.is_available():
        return torch.cuda.device_count(), "CUDA devices (torch.cuda.device_count())"
    return None, "CPU processes"


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
    """torch_impl.train.train over dp ranks; returns the same History (the model and Adam
    rebuilt in this process from rank 0's final state: ordinary objects, saved as usual).

    on_epoch(epochs_done, model, optimizer), if given, is called after every epoch's steps have
    been reported (epochs_done counted over the whole run), with a model and Adam rebuilt in this
    process from rank 0's state after that epoch, as train.train's on_epoch.

    shard(x, rank, dp): the rows of a global batch that rank trains on (a named hook, so a
    test can plant a wrong split and watch the data-parallel parity rows fail).
    Raises ValueError before any work when the batches do not split or dp exceeds the devices,
    training.RankFailedError when a rank fails (all ranks are then stopped).
    """
    started = time.perf_counter()
    training.check_data_parallel(train_config, dp, *devices(dp))
    start_epoch = training.first_epoch(resume, train_config)
    if init not in training.INITS:
        training.initial_weights(init, model_config, train_config)  # a bad weights file fails here, not in N ranks

    # 1. ranks: dp replicas of the same init and Adam state, each to train on its shard of every batch
    # (dp processes on a free port of 127.0.0.1; each reports on a pipe of its own, this process prints)
    prepare(dp)  # the rank server, unless the caller started it already
    context = mp.get_context(START_METHOD)
    # pipes, not a multiprocessing.Queue: a queue's lock is a named semaphore that the resource
    # tracker must be told about, and a command interrupted as a queue is made or freed leaves it
    # a name it reports on the terminal; a pipe is a pair of file descriptors, closed by the exit
    pipes = [context.Pipe(duplex=False) for _ in range(dp)]  # per rank: this process's end, then the rank's
    port = free_port()
    keep = on_epoch is not None
    ranks = [
        # every concrete context has Process; the stub types get_context(str) as BaseContext, which lacks it
        context.Process(target=_run_rank, daemon=True, args=(rank, dp, port, model_config, train_config, init, resume, shard, pipes[rank][1], keep))  # type: ignore[attr-defined]
        for rank in range(dp)
    ]

    # 2. epochs: the global batch's loss at every step, checked and reported here alone
    losses: list[float] = []
    final = None
    receivers = {rank: receiver for rank, (receiver, _) in enumerate(pipes)}  # the ranks still able to send
    try:
        with checkpoint.deferred_interrupt():  # a rank is started whole, or not at all: every started one is stopped below
            for rank in ranks:
                rank.start()
        for _, sender in pipes:
            sender.close()  # the ranks hold theirs: a rank's pipe ends (EOF) when the rank does
        while final is None:
            message = _next_message(receivers, ranks)
            if message[0] == "epoch":
                training.record_losses(losses, message[1], train_config, start_epoch, on_step)
                if on_epoch is not None:
                    on_epoch(start_epoch + len(losses) // train_config.steps_per_epoch, *_rebuilt(model_config, train_config, *message[2:]))
            elif message[0] == "failed":
                raise training.RankFailedError(message[1], dp, message[2])
            else:
                final = message[1:]
    finally:
        _stop([rank for rank in ranks if rank.pid is not None], wait=final is not None)
        for receiver, sender in pipes:
            receiver.close()
            sender.close()

    # 3. result: the trained weights and Adam state as ordinary single-device objects
    model, optimizer = _rebuilt(model_config, train_config, *final)
    return training.history("torch", model_config, train_config, losses, started, model, optimizer, start_epoch)


def train_rank(
    rank: int,
    dp: int,
    model_config: ModelConfig,
    train_config: TrainConfig,
    init: str,
    resume: AdamState | None,
    shard: Callable[[np.ndarray, int, int], np.ndarray],
    results: Any,
    keep: bool = False,
) -> None:
    """One rank's run, inside an initialized process group: the single-device train() with the
    model wrapped in DistributedDataParallel and each batch cut to this rank's shard. results: this
    rank's end of its pipe to the launcher (a multiprocessing Connection). keep: rank 0 sends the
    weights and Adam state with every epoch's losses (the launcher's on_epoch)."""
    start_epoch = training.first_epoch(resume, train_config)
    device = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")

    # 1. model: the same seed and shared init on every rank (not nanoGPT's seed + rank)
    torch.manual_seed(train_config.seed)
    arrays = training.initial_weights(init, model_config, train_config)
    model = TinyLM(model_config, dtype=train_config.dtype) if arrays is None else from_exchange(arrays, model_config)
    model = model.to(device)
    replica = DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None)

    # 2. optimizer: Adam with TrainConfig's lr, betas and eps, on every rank
    # (each rank applies the same averaged gradients, so the replicas stay equal without a broadcast)
    optimizer = new_optimizer(model, train_config)
    if resume is not None:
        optimizer_from_exchange(resume, optimizer, model)

    # 3. epochs: every rank its shard of the same global batches
    for batches in training.epochs(model_config, train_config, start=start_epoch):
        local = [(shard(x, rank, dp), shard(y, rank, dp)) for x, y in batches]
        epoch_losses = train_epoch(replica, optimizer, local, device)  # this shard's mean loss at every step
        dist.all_reduce(epoch_losses)  # the mean over equal shards is the global batch's mean
        if rank == 0:
            kept = (to_exchange(model), optimizer_to_exchange(optimizer, model, train_config)) if keep else ()  # host copies
            results.send(("epoch", (epoch_losses / dp).cpu().numpy(), *kept))

    if rank == 0:
        results.send(("done", to_exchange(model), optimizer_to_exchange(optimizer, model, train_config)))  # host copies


def train_epoch(
    model: torch.nn.Module, optimizer: torch.optim.Adam, batches: Iterable[tuple[np.ndarray, np.ndarray]], device: torch.device
) -> torch.Tensor:
    """Every step of one epoch on this rank's shards; returns the per-step losses (steps,)."""
    losses = [train_step(model, optimizer, torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)) for x, y in batches]
    return torch.stack(losses)


def _rebuilt(
    model_config: ModelConfig, train_config: TrainConfig, arrays: dict[str, np.ndarray], adam_state: AdamState
) -> tuple[TinyLM, torch.optim.Adam]:
    # rank 0's weights and Adam state as a model and optimizer of this process
    model = from_exchange(arrays, model_config)
    optimizer = new_optimizer(model, train_config)
    optimizer_from_exchange(adam_state, optimizer, model)
    return model, optimizer


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (bound to port 0, the system's choice, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run_rank(rank, dp, port, model_config, train_config, init, resume, shard, results, keep) -> None:
    # Ctrl-C and a SIGTERM to the group reach every process: the launcher alone handles them and
    # stops the ranks (a forkserver rank ignores them from its start: prepare)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # gloo talks over the loopback interface only
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // dp))  # dp processes share the cores
    try:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=dp)
        try:
            train_rank(rank, dp, model_config, train_config, init, resume, shard, results, keep)
        finally:
            dist.destroy_process_group()
    except BaseException as error:  # noqa: BLE001 - every failure becomes one line for the launcher
        frame = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
        where = f" ({os.path.basename(frame.filename)}:{frame.lineno})" if frame else ""
        with contextlib.suppress(OSError):  # a launcher that is gone is told nothing
            results.send(("failed", rank, f"{type(error).__name__}: {error}{where}"))
        sys.exit(1)
    results.close()  # every message is in the pipe: a send returns once it is written


def _next_message(receivers: dict[int, Connection], ranks: list) -> Any:
    """The next message from the ranks (rank -> this process's end of its pipe; a rank whose pipe
    has ended is taken out). A rank that died without a message (killed), or every rank ended
    without the result, fails the run."""
    while True:
        ready = connection.wait(list(receivers.values()), timeout=0.05)
        for rank, receiver in list(receivers.items()):
            if receiver in ready:
                try:
                    return receiver.recv()
                except EOFError:  # the rank has ended: it sent all it had
                    del receivers[rank]
        for rank, process in enumerate(ranks):
            if process.exitcode not in (None, 0):
                if rank in receivers and receivers[rank].poll():  # sent before it ended (its last words)
                    with contextlib.suppress(EOFError):
                        return receivers[rank].recv()
                raise training.RankFailedError(rank, len(ranks), f"exit code {process.exitcode}")
        if not receivers and all(process.exitcode is not None for process in ranks):
            raise training.RankFailedError(0, len(ranks), "every rank ended without sending the trained weights")


def _stop(ranks, wait: bool) -> None:
    """Let finished ranks exit (wait), or end them: SIGKILL (a rank ignores SIGTERM; it holds
    nothing the launcher has not received)."""
    for process in ranks:
        process.join(timeout=10 if wait else 0)
    for process in ranks:
        if process.is_alive():
            process.kill()
    for process in ranks:
        process.join()
