"""What makes a torch run start quickly, apart from the lesson: Adam without the import of
torch._dynamo that torch.optim makes.

Why: torch.optim's import of torch._dynamo takes about as long as `import torch` itself
(docs/performance.md, "Start-up"); benchmarks/RESULTS.md's start-up table ("Start-up: the
default run ... against its framework's bare import") holds the row `python -m torch_impl.train
--quiet` against `import torch`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from shared.config import TrainConfig

if TYPE_CHECKING:  # the model's module is the lesson; this one only builds its optimizer
    from torch_impl.model import TinyLM


class FusedAdam:
    """torch.optim.Adam(params, lr, betas, eps, fused=True), bit for bit: the same state per
    parameter ("step", "exp_avg", "exp_avg_sq") and the same kernel, torch._fused_adam_, called
    as torch.optim.Adam calls it, without the import of torch._dynamo that every torch.optim
    optimizer makes on first use (it takes about as long as `import torch`).

    torch._fused_adam_ and torch._foreach_add_ are private (torch.optim.Adam calls them itself):
    tests/implementations/test_torch_startup.py holds this class equal to torch.optim.Adam(fused=True),
    bit for bit, step by step (checked with torch 2.13.0), and checks that the default run never
    imports torch._dynamo."""

    # what it steps as, for whoever reads optimizers by their torch.optim class (the port check's lint)
    behaves_as = torch.optim.Adam

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float], eps: float) -> None:
        self.params: list[torch.Tensor] = list(params)
        self.lr, self.betas, self.eps = float(lr), (float(betas[0]), float(betas[1])), float(eps)
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}  # parameter -> {"step", "exp_avg", "exp_avg_sq"}, as torch.optim.Adam's

    @property
    def param_groups(self) -> list[dict]:
        """Its one group as torch.optim.Adam(fused=True) would list it (read-only: step() reads
        lr, betas and eps from the attributes)."""
        settings = {"lr": self.lr, "betas": self.betas, "eps": self.eps, "weight_decay": 0.0, "amsgrad": False, "maximize": False}
        return [{"params": self.params, **settings}]

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
    """torch.optim.Adam(model.parameters(), lr, betas, eps, fused=True) with TrainConfig's
    settings, as FusedAdam: Adam's moments are created beside the parameters, on their device,
    at the first step."""
    return FusedAdam(model.parameters(), lr=train_config.lr, betas=train_config.betas, eps=train_config.eps)
