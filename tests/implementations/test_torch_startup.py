"""torch_impl/startup.py: FusedAdam is torch.optim.Adam(fused=True), bit for bit: the trainer uses
it only to avoid the optimizer's import of torch._dynamo at start-up (docs/performance.md,
"Start-up"). It calls the private torch._fused_adam_ kernel: these tests pin it to the public
optimizer."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from shared.config import TrainConfig
from shared.weights import init_weights
from tests.backends import SMALL


def steps(optimizer_for, dtype, n=25):
    """n Adam steps on TinyLM from the same weights and batches; the weights after each step."""
    from torch_impl.model import from_exchange, loss_fn

    model = from_exchange(init_weights(SMALL, 3, dtype), SMALL)
    optimizer = optimizer_for(model.parameters())
    rng = np.random.default_rng(4)
    seen = []
    for _ in range(n):
        tokens = torch.from_numpy(rng.integers(0, SMALL.vocab_size, (3, 5)))
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model, tokens, tokens.roll(1, dims=1)).backward()
        optimizer.step()
        seen.append([parameter.detach().clone() for parameter in model.parameters()])
    return seen, optimizer


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_adam_equals_torch_adam_bit_for_bit(dtype):
    from torch_impl.startup import FusedAdam

    config = TrainConfig(lr=0.05, betas=(0.8, 0.99), eps=1e-6)
    ours, optimizer = steps(lambda params: FusedAdam(params, config.lr, config.betas, config.eps), dtype)
    theirs, reference = steps(lambda params: torch.optim.Adam(params, lr=config.lr, betas=config.betas, eps=config.eps, fused=True), dtype)
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), f"step {step}: the weights differ"
    for mine, its in zip(optimizer.state.values(), reference.state.values(), strict=True):
        assert set(mine) == set(its) and all(torch.equal(mine[key], its[key]) for key in mine)


def test_a_wrong_formula_would_be_caught():
    from torch_impl.startup import FusedAdam

    ours, _ = steps(lambda params: FusedAdam(params, 0.05, (0.8, 0.99), 1e-6), "float64", n=3)
    theirs, _ = steps(lambda params: torch.optim.Adam(params, lr=0.05, betas=(0.8, 0.99), eps=1e-5, fused=True), "float64", n=3)
    assert not all(torch.equal(x, y) for x, y in zip(ours[-1], theirs[-1]))  # eps 1e-6 vs 1e-5 shows


@pytest.mark.slow
def test_the_default_run_never_imports_torch_dynamo():
    code = (
        "import sys; from shared.config import ModelConfig, TrainConfig; import torch_impl.train as t; "
        "t.train(ModelConfig(), TrainConfig(epochs=1, n_sequences=64)); print('torch._dynamo' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
