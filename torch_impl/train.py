"""Train TinyLM on the copy task with PyTorch: train_step, train_epoch, train (loss_fn is in model.py),
and compile_step for the opt-in torch.compile of a run.

Run it: `python -m torch_impl.train --help`.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command line belongs to the tools layer: parse flags before importing torch
    import sys

    try:  # Ctrl-C while the command line is still being imported: one line and 130, as at any later moment
        from mhsa.train_cli import main
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(main("torch"))

import contextlib
import time
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import numpy as np
import torch

from shared import checks, training
from shared.adam_state import AdamState
from shared.config import ModelConfig, TrainConfig
from shared.history import History
from torch_impl.device import resolve
from torch_impl.model import TinyLM, from_exchange, loss_fn

# torch.compile's backend for compile_step: its default, inductor, which writes and builds C++
# (cached across processes); tests plant "aot_eager" (the same graphs, run without code generation)
COMPILE_BACKEND: str | Callable[..., Any] = "inductor"

StepFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # a whole training step: x, y -> loss


def train_step(model: torch.nn.Module, optimizer: FusedAdam, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One Adam step; returns the loss before the update (a 0-d tensor, no host sync)."""
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model, x, y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def train_epoch(
    model: torch.nn.Module, optimizer: FusedAdam, batches: Iterable[tuple[np.ndarray, np.ndarray]], step: StepFn | None = None
) -> np.ndarray:
    """Every step of `batches` (an epoch, or a run of its steps), on the model's device: train_step,
    eagerly, or `step` (the compiled whole step of compile_step); returns the per-step losses as a
    NumPy array (one copy to the host, after the last step)."""
    device = next(model.parameters()).device
    run = step or (lambda x, y: train_step(model, optimizer, x, y))
    losses = [run(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)) for x, y in batches]
    return torch.stack(losses).cpu().numpy()


def train(
    model_config: ModelConfig,
    train_config: TrainConfig,
    init: str = "shared",
    on_step: Callable[[int, float], object] | None = None,
    resume: AdamState | None = None,
    device: str = "cpu",
    compile: bool = False,
) -> History:
    """Train from `init` ("shared", "native" or a weights file); returns the History with the
    model and optimizer.

    resume: an AdamState saved with those weights (by either backend): the run continues
    where it stopped, with the same moments, step count and remaining batches.
    on_step(step, loss) is called for every step once its run of steps has finished.
    device: "cpu" or "cuda" (torch's first CUDA device); the returned model and optimizer live
    there, and everything that takes a model (predict, attend, generate, to_exchange) runs there.
    compile: every step runs as one graph of torch.compile (forward, backward and Adam's update:
    compile_step), compiled before the first step; its seconds are History.compile_seconds. It
    pays only on long runs (benchmarks/RESULTS.md). The returned model is
    the plain TinyLM either way.
    Data parallel is torch_impl.parallel.train, which runs this file's train_step on every rank.
    Raises ValueError before any work for a device torch does not have,
    ValueError when torch.compile fails, and training.NonFiniteLossError naming the first step
    whose loss was NaN or infinite.
    """
    target = resolve(training.check_device(device))
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
    compiled: StepFn | None = None
    compile_seconds = None
    if compile:  # opt-in: every batch shape of the run compiled now, not inside the first steps
        first = next(training.epochs(model_config, train_config, start=start_epoch), [])  # every epoch has the same shapes
        compiled, compile_seconds = compile_step(model, optimizer, first)
    losses: list[float] = []
    for batches in training.epochs(model_config, train_config, start=start_epoch):
        with _ids_checked_per_epoch(model, batches):  # not per step: the forward's min/max of the ids is a host sync
            for chunk in training.chunks(batches):  # a few steps at a time: progress as it happens
                epoch_losses = train_epoch(model, optimizer, chunk, compiled)
                training.finish_epoch(losses, epoch_losses, train_config, start_epoch, on_step)
    return training.history("torch", model_config, train_config, losses, started, model, optimizer, start_epoch, compile_seconds)


def compile_step(model: TinyLM, optimizer: FusedAdam, batches: list[tuple[np.ndarray, np.ndarray]]) -> tuple[StepFn, float]:
    """(step, seconds it took): one training step as one torch.compile graph, step(x, y) -> the loss
    before the update, as train_step returns it. The forward and backward are
    torch.func.grad_and_value of loss_fn over the parameters, and Adam's update is
    torch.optim.Adam's arithmetic written out (_adam_update: the fused kernel cannot be traced);
    it updates the model's parameters and the optimizer's state in place, as train_step does, so
    saving, resuming and to_exchange see the same objects. Compiled here by running the step once
    on the first batch of each shape in `batches`, after which the weights and Adam's state are
    put back as they were: the seconds are compilation, apart from the steps', and the steps that
    follow only run it. Inductor keeps what it built in its cache across processes, so a later run
    compiles faster. Raises ValueError when torch.compile fails (inductor needs a C++ compiler, for
    one; a graph break is a failure too, not a silently slower run)."""
    import torch._dynamo  # imported only when asked for (it takes about as long as torch itself)
    from torch._dynamo.exc import FailOnRecompileLimitHit, TorchDynamoException

    started = time.perf_counter()
    names = [name for name, _ in model.named_parameters()]
    params: list[torch.Tensor] = [parameter for _, parameter in model.named_parameters()]
    states = optimizer.states(params)
    lr, (beta1, beta2), eps = optimizer.lr, optimizer.betas, optimizer.eps

    def whole_step(params: list[torch.Tensor], states: list[dict[str, torch.Tensor]], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def loss_of(values: tuple[torch.Tensor, ...]) -> torch.Tensor:
            weights = dict(zip(names, values))
            return loss_fn(_Functional(model, weights), x, y)

        grads, loss = torch.func.grad_and_value(loss_of)(tuple(parameter.detach() for parameter in params))
        with torch.no_grad():
            for parameter, grad, state in zip(params, grads, states):
                _adam_update(parameter, grad, state, lr, beta1, beta2, eps)
        return loss.detach()

    # a code object of its own: torch.compile keeps its graphs per code object, and with the one
    # every run's whole_step shares, dynamo's limit of 8 recompilations would refuse a ninth
    # configuration compiled in the same process
    own = types.FunctionType(whole_step.__code__.replace(), whole_step.__globals__, "whole_step", None, whole_step.__closure__)
    compiled = torch.compile(own, backend=COMPILE_BACKEND, fullgraph=True, dynamic=False)
    device = next(model.parameters()).device
    shapes: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
    for x, y in batches:  # the first batch of each shape: the full one, then a shorter last one
        shapes.setdefault(x.shape, (x, y))
    with torch.no_grad():
        saved = [tensor.clone() for tensor in _step_tensors(params, states)]
    try:
        with _ids_checked_per_epoch(model, list(shapes.values())), torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
            for x, y in shapes.values():  # as the steps will run it: one graph per shape, no recompilation after
                compiled(params, states, torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
    except FailOnRecompileLimitHit as error:  # the process-wide limit still counts every run's compilations
        limits = torch._dynamo.config
        raise ValueError(
            f"torch.compile: a recompile limit of torch._dynamo was reached (recompile_limit {limits.recompile_limit} per function, "
            f"accumulated_recompile_limit {limits.accumulated_recompile_limit} per process); start a new process or call torch.compiler.reset()"
        ) from error
    except TorchDynamoException as error:
        cause = getattr(error, "inner_exception", None) or error  # BackendCompilerFailed wraps what the backend raised
        backend = getattr(COMPILE_BACKEND, "__name__", COMPILE_BACKEND)
        first = (str(cause).strip().splitlines() or [""])[0]
        raise ValueError(f"torch.compile (backend {backend!r}) failed: {type(cause).__name__}: {first}") from error
    finally:
        with torch.no_grad():  # the compiling steps' updates undone: the run starts from its own weights and state
            for tensor, value in zip(_step_tensors(params, states), saved):
                tensor.copy_(value)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if model.ids_checked:  # inside train(): the epoch's ids were checked on the host
            return compiled(params, states, x, y)
        with _ids_checked_per_epoch(model, [(x.cpu().numpy(), y.cpu().numpy())]):  # called on its own: this batch checked here
            return compiled(params, states, x, y)

    return step, time.perf_counter() - started


def _adam_update(
    parameter: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor], lr: float, beta1: float, beta2: float, eps: float
) -> None:
    """torch.optim.Adam's update of one parameter (its single-tensor algorithm, no weight decay or
    amsgrad), in place, in traceable operations; the step count and bias corrections in the
    parameter's dtype. Equal to the fused kernel within rounding, not bit for bit."""
    step = state["step"]
    step.add_(1)  # first: bias correction uses the new count
    state["exp_avg"].lerp_(grad, 1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    count = step.to(parameter.dtype)
    bias_correction1 = 1 - beta1**count
    bias_correction2 = 1 - beta2**count
    denom = (state["exp_avg_sq"].sqrt() / bias_correction2.sqrt()).add_(eps)
    parameter.sub_(lr / bias_correction1 * state["exp_avg"] / denom)


def _step_tensors(params: list[torch.Tensor], states: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    """Every tensor a step changes: the parameters, then each one's Adam state."""
    return params + [state[key] for state in states for key in ("step", "exp_avg", "exp_avg_sq")]


class _Functional(torch.nn.Module):
    """`model` called with `weights` in place of its parameters (torch.func.functional_call), so
    that loss_fn, which calls model(x, mask=mask), can be differentiated by torch.func."""

    def __init__(self, model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.model, self.weights = model, weights

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return cast(torch.Tensor, torch.func.functional_call(self.model, self.weights, (x,), {"mask": mask}))


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
    tests/implementations/test_torch_adam.py holds it equal to torch.optim.Adam, bit for bit, step by step."""

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
    def states(self, params: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        """The state of each of `params`, created on first use as torch.optim.Adam creates it."""
        for parameter in params:
            if parameter not in self.state:
                self.state[parameter] = {  # the step count beside its parameter, as fused Adam keeps it
                    "step": torch.zeros((), dtype=torch.float32, device=parameter.device),
                    "exp_avg": torch.zeros_like(parameter, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(parameter, memory_format=torch.preserve_format),
                }
        return [self.state[parameter] for parameter in params]

    @torch.no_grad()
    def step(self) -> None:
        params = [parameter for parameter in self.params if parameter.grad is not None]
        states = self.states(params)
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
