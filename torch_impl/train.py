"""Train TinyLM on the copy task with PyTorch: train_step, train_epoch, train (loss_fn is in model.py),
and compile_model for the opt-in torch.compile of a run.

Run it: `python -m torch_impl.train --help`.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command line belongs to the tools layer: parse flags before importing torch
    import sys

    try:  # Ctrl-C while the command line is still being imported: one line and 130, as at any later moment
        from shared.tools.train_cli import main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(main("torch"))

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import numpy as np
import torch

from shared import checks, training
from shared.adam_state import AdamState
from shared.config import ModelConfig, TrainConfig
from shared.history import History
from torch_impl.model import TinyLM, from_exchange, loss_fn

# torch.compile's backend for compile_model: its default, inductor, which writes and builds C++
# (cached across processes); tests plant "aot_eager" (the same graphs, run without code generation)
COMPILE_BACKEND: str | Callable[..., Any] = "inductor"


def train_step(model: torch.nn.Module, optimizer: FusedAdam, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One Adam step; returns the loss before the update (a 0-d tensor, no host sync)."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model, x, y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def train_epoch(model: torch.nn.Module, optimizer: FusedAdam, batches: Iterable[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Every step of `batches` (an epoch, or a run of its steps), eagerly, on the model's device;
    returns the per-step losses as a NumPy array (one copy to the host, after the last step)."""
    device = next(model.parameters()).device
    losses = [train_step(model, optimizer, torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)) for x, y in batches]
    return torch.stack(losses).cpu().numpy()


def train(
    model_config: ModelConfig,
    train_config: TrainConfig,
    init: str = "shared",
    on_step: Callable[[int, float], object] | None = None,
    resume: AdamState | None = None,
    dp: int = 1,
    device: str = "cpu",
    compile: bool = False,
) -> History:
    """Train from `init` ("shared", "native" or a weights file); returns the History with the
    model and optimizer.

    resume: an AdamState saved with those weights (by either backend): the run continues
    where it stopped, with the same moments, step count and remaining batches.
    on_step(step, loss) is called for every step once its run of steps has finished.
    dp: data-parallel ranks; dp > 1 splits every batch over dp devices (torch_impl.parallel).
    device: "cpu" or "cuda" (torch's first CUDA device); the returned model and optimizer live
    there, and everything that takes a model (predict, attend, generate, to_exchange) runs there.
    compile: the steps run torch.compile(model), compiled before the first step (compile_model);
    its seconds are History.compile_seconds. It pays only on long runs (benchmarks/RESULTS.md);
    one device only (dp=1). The returned model is the plain TinyLM either way.
    Raises ValueError before any work for a device torch does not have or compile with dp > 1,
    ValueError when torch.compile fails, and training.NonFiniteLossError naming the first step
    whose loss was NaN or infinite.
    """
    training.check_device(device, dp)
    if compile and dp != 1:
        raise ValueError(f"compile with dp={dp}: torch.compile runs on one device here (dp=1)")
    if dp != 1:  # the same run over dp devices: the framework's own data-parallel engine
        from torch_impl import parallel

        return parallel.train(model_config, train_config, dp, init, on_step, resume)
    target = _device(device)
    started = time.perf_counter()
    start_epoch = training.first_epoch(resume, train_config)

    # 1. model: the shared NumPy init, identical for every backend, unless init says otherwise
    torch.manual_seed(train_config.seed)
    arrays = training.initial_weights(init, model_config, train_config)
    model = TinyLM(model_config, dtype=train_config.dtype) if arrays is None else from_exchange(arrays, model_config)
    model = model.to(target)  # before the optimizer: its moments are created beside the parameters

    # 2. optimizer: Adam with TrainConfig's lr, betas and eps
    # (torch: handed the parameters, it keeps their moments and updates them in place)
    optimizer = new_optimizer(model, train_config)
    if resume is not None:
        optimizer_from_exchange(resume, optimizer, model)

    # 3. epochs: the same batches as every other backend
    stepped: torch.nn.Module = model
    compile_seconds = None
    if compile:  # opt-in: every batch shape of the run compiled now, not inside the first steps
        first = next(training.epochs(model_config, train_config, start=start_epoch), [])  # every epoch has the same shapes
        stepped, compile_seconds = compile_model(model, first)
    losses: list[float] = []
    for batches in training.epochs(model_config, train_config, start=start_epoch):
        with _ids_checked_per_epoch(model, batches):  # not per step: the forward's min/max of the ids is a host sync
            for chunk in training.chunks(batches):  # a few steps at a time: progress as it happens
                epoch_losses = train_epoch(stepped, optimizer, chunk)
                training.finish_epoch(losses, epoch_losses, train_config, start_epoch, on_step)
    return training.history("torch", model_config, train_config, losses, started, model, optimizer, start_epoch, compile_seconds)


def compile_model(model: TinyLM, batches: list[tuple[np.ndarray, np.ndarray]]) -> tuple[torch.nn.Module, float]:
    """(torch.compile(model), seconds it took): compiled here, by one forward and backward of the
    first batch of each shape in `batches` (the gradients are dropped, the weights untouched), so
    the steps that follow only run it; the seconds are compilation, apart from the steps'.
    Inductor keeps what it built in its cache across processes, so a later run compiles faster.
    Raises ValueError when torch.compile fails (inductor needs a C++ compiler, for one)."""
    from torch._dynamo.exc import TorchDynamoException  # torch._dynamo is imported only when asked for

    started = time.perf_counter()
    compiled = cast(torch.nn.Module, torch.compile(model, backend=COMPILE_BACKEND))  # an OptimizedModule; typed as a callable
    device = next(model.parameters()).device
    shapes: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
    for x, y in batches:  # the first batch of each shape, the full one first: the last batch's is then a second graph
        shapes.setdefault(x.shape, (x, y))
    with _ids_checked_per_epoch(model, list(shapes.values())):  # as the steps run it: one graph
        try:
            for x, y in shapes.values():
                loss_fn(compiled, torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)).backward()
        except TorchDynamoException as error:
            cause = getattr(error, "inner_exception", None) or error  # BackendCompilerFailed wraps what the backend raised
            backend = getattr(COMPILE_BACKEND, "__name__", COMPILE_BACKEND)
            first = (str(cause).strip().splitlines() or [""])[0]
            raise ValueError(f"torch.compile (backend {backend!r}) failed: {type(cause).__name__}: {first}") from error
        finally:
            for parameter in model.parameters():
                parameter.grad = None
    return compiled, time.perf_counter() - started


def _device(device: str) -> torch.device:
    """The torch device for a checked `device` name: the CPU, or the first CUDA device.
    Raises ValueError when torch sees no GPU (a CPU-only build has no CUDA)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device 'cuda': torch sees no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)")
    return torch.device(device)


@contextlib.contextmanager
def _ids_checked_per_epoch(model: TinyLM, batches: list[tuple[np.ndarray, np.ndarray]]) -> Iterator[None]:
    """Check the token ids of a whole epoch once, on the host arrays, then let the forward skip
    its own min/max of the ids for the epoch's steps (a reduction and a host sync per step,
    a wait for the GPU on cuda). The same check, and the same message, as the forward's."""
    config = model.config
    for x, _ in batches:  # shape and dtype of every batch first, as the forward checks them
        checks.check_tokens(x.shape, x.dtype.name, config.vocab_size, config.max_len)
    for x, _ in batches:  # then the smallest and largest id of each batch: the first bad one is named, as the forward names it
        checks.check_tokens(x.shape, x.dtype.name, config.vocab_size, config.max_len, int(x.min()), int(x.max()))
    model.ids_checked = True
    try:
        yield
    finally:
        model.ids_checked = False


class FusedAdam:
    """torch.optim.Adam(params, lr, betas, eps, fused=True), bit for bit: the same state per
    parameter ("step", "exp_avg", "exp_avg_sq") and the same kernel, torch._fused_adam_, called
    as torch.optim.Adam calls it. Why not torch.optim.Adam itself: every torch.optim optimizer
    imports torch._dynamo on first use, which takes about as long as `import torch` and so
    nearly doubled the start-up of a default run (benchmarks/RESULTS.md); nothing else differs.
    tests/test_torch_adam.py holds it equal to torch.optim.Adam, bit for bit, step by step."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float], eps: float) -> None:
        self.params: list[torch.Tensor] = list(params)
        self.lr, self.betas, self.eps = float(lr), (float(betas[0]), float(betas[1])), float(eps)
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}  # parameter -> {"step", "exp_avg", "exp_avg_sq"}, as torch.optim.Adam's

    def zero_grad(self, set_to_none: bool = True) -> None:
        for parameter in self.params:
            if set_to_none:
                parameter.grad = None
            elif parameter.grad is not None:
                parameter.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        params = [parameter for parameter in self.params if parameter.grad is not None]
        for parameter in params:
            if parameter not in self.state:  # created on first use, like torch.optim.Adam's
                self.state[parameter] = {  # the step count beside its parameter, as fused Adam keeps it
                    "step": torch.zeros((), dtype=torch.float32, device=parameter.device),
                    "exp_avg": torch.zeros_like(parameter, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(parameter, memory_format=torch.preserve_format),
                }
        states = [self.state[parameter] for parameter in params]
        steps = [state["step"] for state in states]
        torch._foreach_add_(steps, 1)  # the step count first: bias correction uses the new one
        torch._fused_adam_(
            params,
            [parameter.grad for parameter in params],  # type: ignore[misc]  # never None: filtered above
            [state["exp_avg"] for state in states],
            [state["exp_avg_sq"] for state in states],
            [],
            steps,
            amsgrad=False,
            lr=self.lr,
            beta1=self.betas[0],
            beta2=self.betas[1],
            weight_decay=0.0,
            eps=self.eps,
            maximize=False,
            grad_scale=None,
            found_inf=None,
        )


def new_optimizer(model: TinyLM, train_config: TrainConfig) -> FusedAdam:
    """FusedAdam(model.parameters(), lr, betas, eps) with TrainConfig's settings: Adam's moments
    are created beside the parameters, on their device, at the first step."""
    return FusedAdam(model.parameters(), lr=train_config.lr, betas=train_config.betas, eps=train_config.eps)


def optimizer_to_exchange(optimizer: FusedAdam, model: TinyLM, train_config: TrainConfig) -> AdamState:
    """Adam's moments and step count in the exchange layout (after train_config.epochs epochs)."""
    names: dict[torch.Tensor, str] = {parameter: name for name, parameter in model.named_parameters()}
    moments: dict[str, dict[str, np.ndarray]] = {"exp_avg": {}, "exp_avg_sq": {}}
    step = 0
    for parameter, state in optimizer.state.items():
        for moment in moments:
            moments[moment][names[parameter]] = state[moment].detach().cpu().numpy().copy()
        step = int(state["step"])
    return AdamState(step, train_config.epochs, moments["exp_avg"], moments["exp_avg_sq"], train_config)


def optimizer_from_exchange(adam_state: AdamState, optimizer: FusedAdam, model: TinyLM) -> None:
    """Give a fresh Adam the saved moments and step count of every parameter, on its device."""
    for name, parameter in model.named_parameters():
        optimizer.state[parameter] = {
            "step": torch.tensor(float(adam_state.step), device=parameter.device),
            "exp_avg": torch.from_numpy(adam_state.exp_avg[name].copy()).to(parameter.device),
            "exp_avg_sq": torch.from_numpy(adam_state.exp_avg_sq[name].copy()).to(parameter.device),
        }
