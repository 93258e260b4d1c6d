"""The PyTorch half of the port check through training (mhsa.port_check.training.check): train a
copy of the reference with its own optimizer (and scheduler), step by step, and record each step in
the neutral form of core/training_records.py; read the optimizer's settings; run the optimizer on
the lint's probe gradients.

A step is what a user's loop does: zero_grad, loss(model(*batch), *batch), backward, the optional
gradient clipping (torch.nn.utils.clip_grad_norm_ to `clip`), optimizer.step, scheduler.step. The
model, optimizer and scheduler are deep-copied together (the copied optimizer holds the copied
model's parameters, the copied scheduler the copied optimizer): the user's objects are never stepped.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import torch
from torch import nn

from mhsa.port_check.core.training_records import MOMENTS, StepRecord
from mhsa.port_check.readers.torch import reader as torch_reader

# optimizer classes whose settings the lint reads fully; any other is compared by trajectory only
READ = {torch.optim.SGD: "SGD", torch.optim.Adam: "Adam", torch.optim.AdamW: "AdamW"}
SETTINGS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "momentum", "dampening", "nesterov", "maximize", "decoupled_weight_decay")


def owns(optimizer: object) -> bool:
    """Whether `optimizer` is this side's: a torch.optim.Optimizer, or one that steps like one, says
    which (`behaves_as`: a hand-rolled fused Adam) and has param_groups, state, zero_grad and step."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return True
    return _behaves_as(optimizer) is not None and all(hasattr(optimizer, name) for name in ("param_groups", "state", "zero_grad", "step"))


def _behaves_as(optimizer: object) -> type | None:
    """The torch.optim class a hand-rolled optimizer's class steps as (`behaves_as`), or None."""
    kind = getattr(type(optimizer), "behaves_as", None)
    return kind if isinstance(kind, type) and issubclass(kind, torch.optim.Optimizer) else None


def check_setup(setup: dict) -> None:
    """Raise ValueError naming what does not fit: an optimizer over other parameters than the model's,
    a scheduler of another optimizer or one that needs a metric, a clip that is no positive number."""
    model, optimizer, scheduler = setup["model"], setup["optimizer"], setup.get("scheduler")
    own = {id(p) for p in model.parameters()}
    if not all(id(p) in own for group in optimizer.param_groups for p in group["params"]):
        raise ValueError("the torch factory's 'optimizer' must be built over its model's parameters")
    if scheduler is not None:
        if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler) or isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise ValueError(f"'scheduler' must be a torch LR scheduler stepped once per step (not {type(scheduler).__name__})")
        if scheduler.optimizer is not optimizer:
            raise ValueError("the torch factory's 'scheduler' must schedule its 'optimizer'")
    clip = setup.get("clip")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip > 0):
        raise ValueError(f"'clip' must be a positive number (the max global norm of torch.nn.utils.clip_grad_norm_); got {clip!r}")


def _copies(setup: dict, dtype: str):
    """(model, optimizer, scheduler) deep-copied together, the model and any optimizer state cast to dtype."""
    model, optimizer, scheduler = copy.deepcopy((setup["model"], setup["optimizer"], setup.get("scheduler")))
    model.to(torch_reader.DTYPES[dtype])
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step" and torch.is_tensor(value) and value.is_floating_point():
                state[key] = value.to(torch_reader.DTYPES[dtype])
    return model, optimizer, scheduler


class Trainer:
    """Trains a copy of the reference in `dtype`; step(batch) -> StepRecord."""

    def __init__(self, setup: dict, dtype: str):
        self.model, self.optimizer, self.scheduler = _copies(setup, dtype)
        self.loss, self.clip = setup["loss"], setup.get("clip")
        self.model_inputs = setup.get("model_inputs")
        self.names = {id(p): name for name, p in self.model.named_parameters()}

    def step(self, batch: tuple) -> StepRecord:
        tensors = _tensors(self.model, batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(self.model(*tensors[: self.model_inputs]), *tensors)
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise ValueError(f"the torch factory's 'loss' must return a scalar tensor; got {_describe(loss)}")
        loss.backward()
        grads = {
            name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().numpy().copy() for name, p in self.model.named_parameters()
        }
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        _step(self.optimizer, self.scheduler)
        return StepRecord(float(loss.item()), grads, snapshot(self.model), self.moments())

    def moments(self) -> dict[tuple[str, str], np.ndarray]:
        found = {}
        for p, state in self.optimizer.state.items():
            for key, value in state.items():
                if key in MOMENTS and torch.is_tensor(value) and id(p) in self.names:
                    found[(key, self.names[id(p)])] = value.detach().cpu().numpy().copy()
        return found

    def model_at(self, params: dict[str, np.ndarray]) -> nn.Module:
        """A copy of the model holding `params` (neutral arrays, as a StepRecord's)."""
        model = copy.deepcopy(self.model)
        return torch_reader.load_parameters(model, {name: value for name, value in params.items() if name in model.state_dict()})


def snapshot(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The model's parameters now, copied: torch_reader.parameters gives views, which the next
    optimizer step would change under whoever holds them."""
    return {name: value.copy() for name, value in torch_reader.parameters(model).items()}


def _step(optimizer, scheduler) -> None:
    optimizer.step()
    if scheduler is not None:
        with warnings.catch_warnings():  # a deep-copied optimizer loses the scheduler's step-order tracker, not its order
            warnings.filterwarnings("ignore", message="Seems like `optimizer.step\\(\\)` has been overridden")
            scheduler.step()


def _tensors(model, batch) -> list[torch.Tensor]:
    # floating arrays take the model's dtype, integer ones (token ids, labels) stay as they are
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return [
        torch.as_tensor(np.asarray(x), dtype=dtype) if np.issubdtype(np.asarray(x).dtype, np.floating) else torch.as_tensor(np.asarray(x))
        for x in batch
    ]


def _describe(value) -> str:
    return f"a tensor of shape {tuple(value.shape)}" if torch.is_tensor(value) else type(value).__name__


def settings(optimizer: torch.optim.Optimizer) -> tuple[str, str | None, list[dict]]:
    """(class name, the name the lint reads it by or None, each param group's settings)."""
    groups = [{key: _plain(group[key]) for key in SETTINGS if key in group} for group in optimizer.param_groups]
    read = READ.get(type(optimizer)) or READ.get(_behaves_as(optimizer) or type(optimizer))
    return type(optimizer).__name__, read, groups


def _plain(value):
    if torch.is_tensor(value):
        return value.item() if value.numel() == 1 else value.tolist()
    return tuple(_plain(v) for v in value) if isinstance(value, tuple) else value


def probe(setup: dict, scenarios: list[tuple[float, list[float]]]) -> tuple[list[list[dict]], int]:
    """Run a float64 copy of the optimizer (with its scheduler and clip) on each scenario:
    (p0, [g_1, ..., g_n]) sets every element of every parameter to p0 and every gradient element at
    step t to g_t. Returns (per scenario, per step: {"update": {name: value}, "param": {name: value
    after the step}, "moment": {(moment, name): value}}, the number of elements of all parameters
    together), each value read at the first element (every element moves alike)."""
    runs = []
    for p0, gradients in scenarios:
        model, optimizer, scheduler = _copies(setup, "float64")
        names = {id(p): name for name, p in model.named_parameters()}
        params = [p for group in optimizer.param_groups for p in group["params"] if p.numel()]
        with torch.no_grad():
            for p in params:
                p.fill_(p0)
        steps = []
        for g in gradients:
            before = {names[id(p)]: float(p.detach().reshape(-1)[0]) for p in params}
            for p in params:
                p.grad = torch.full_like(p, g)
            if setup.get("clip") is not None:
                torch.nn.utils.clip_grad_norm_(params, setup["clip"])
            _step(optimizer, scheduler)
            after = {names[id(p)]: float(p.detach().reshape(-1)[0]) for p in params}
            moments = {
                (key, names[id(p)]): float(value.reshape(-1)[0])
                for p, state in optimizer.state.items()
                for key, value in state.items()
                if key in MOMENTS and torch.is_tensor(value) and value.numel()
            }
            steps.append({"update": {name: after[name] - before[name] for name in after}, "param": after, "moment": moments})
        runs.append(steps)
    size = sum(p.numel() for group in setup["optimizer"].param_groups for p in group["params"])
    return runs, size
