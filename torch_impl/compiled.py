"""The opt-in compiled training step of torch (train(..., compile=True)), apart from the lesson:
forward, backward and Adam's update as one torch.compile graph, compiled before the first step.

Why: one graph runs the step's many small operations without Python between them, so its steps
are faster than the eager trainer's; its compilation pays only on long runs, so the default run
stays eager (docs/performance.md, "--compile").
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from shared import checks

if TYPE_CHECKING:  # the trainer hands compile_step the model and its loss_fn
    from torch_impl.model import TinyLM

# torch.compile's backend for compile_step: its default, inductor, which writes and builds C++
# (cached across processes); tests plant "aot_eager" (the same graphs, run without code generation)
COMPILE_BACKEND: str | Callable[..., Any] = "inductor"

StepFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # a whole training step: x, y -> loss
LossFn = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]  # loss_fn(model, x, y) -> scalar


def compile_step(model: TinyLM, optimizer: torch.optim.Adam, batches: list[tuple[np.ndarray, np.ndarray]], loss_fn: LossFn) -> tuple[StepFn, float]:
    """(step, seconds it took): one training step as one torch.compile graph, step(x, y) -> the loss
    before the update, as train_step returns it; like train_step it does not check the ids (train()
    checks each epoch's batches first). The forward and backward are
    torch.func.grad_and_value of loss_fn (torch_impl.model's) over the parameters, and Adam's
    update is torch.optim.Adam's arithmetic written out (_adam_update: the fused kernel cannot be traced);
    it updates the model's parameters and the optimizer's state in place, as train_step does, so
    saving, resuming and to_exchange see the same objects. Compiled here by running the step once
    on the first batch of each shape in `batches`, after which the weights and Adam's state are
    put back as they were: the seconds are compilation, apart from the steps', and the steps that
    follow only run it. Inductor keeps what it built in its cache across processes, so a later run
    compiles faster. Raises ValueError when torch.compile fails (inductor needs a C++ compiler, for
    one; a graph break is a failure too, not a silently slower run)."""
    # imported only when asked for (it takes about as long as torch itself). Its config (the
    # recompile limit) and exceptions are private, with no public equivalent in torch 2.13.0, where
    # this was checked: tests/implementations/test_torch_compiled.py reaches the limit and plants
    # a failing backend, so a torch that moves them fails there
    import torch._dynamo
    from torch._dynamo.exc import FailOnRecompileLimitHit, TorchDynamoException

    started = time.perf_counter()
    names = [name for name, _ in model.named_parameters()]
    params: list[torch.Tensor] = [parameter for _, parameter in model.named_parameters()]
    states = _states(optimizer, params)
    group = optimizer.param_groups[0]
    lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]

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
    config = model.config
    checks.check_batches(list(shapes.values()), config.vocab_size, config.max_len)
    try:
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
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
        return compiled(params, states, x, y)

    return step, time.perf_counter() - started


@torch.no_grad()
def _states(optimizer: torch.optim.Adam, params: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """The Adam state of each of `params`, created now where it has none yet, as
    torch.optim.Adam(fused=True) creates it at its first step: the compiled step updates these
    tensors in place, so the optimizer's own state (saved, resumed, stepped eagerly) is the same."""
    for parameter in params:
        if not optimizer.state[parameter]:
            optimizer.state[parameter] = {
                "step": torch.zeros((), dtype=torch.float32, device=parameter.device),  # fused Adam keeps the count beside its parameter
                "exp_avg": torch.zeros_like(parameter, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(parameter, memory_format=torch.preserve_format),
            }
    return [optimizer.state[parameter] for parameter in params]


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
