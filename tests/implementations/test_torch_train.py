"""torch_impl/train.py: train() (the ids of an epoch checked once, at its boundary, instead of a
min/max and a host sync in every forward; the losses fetched per run of steps) gives the
step-by-step trajectory bit for bit, and a run on "cuda" follows the CPU run and serves the
NumPy-facing functions (needs a GPU). What every trainer shares: test_train.py."""

import numpy as np
import pytest
import torch

from shared import training
from shared.config import ModelConfig, TrainConfig
from torch_impl.model import from_exchange, predict
from torch_impl.train import new_optimizer, train, train_step

SMALL = TrainConfig(epochs=2, n_sequences=96)  # 3 steps per epoch: seconds


def test_the_trajectory_is_the_step_by_step_loop_bit_for_bit():
    """train() (ids checked per epoch, losses fetched per run of steps) against train_step
    called batch by batch with every forward checking its ids."""
    model_config = ModelConfig()
    history = train(model_config, SMALL)
    model = from_exchange(training.initial_weights("shared", model_config, SMALL), model_config)
    optimizer = new_optimizer(model, SMALL)
    losses = [
        float(train_step(model, optimizer, torch.from_numpy(x), torch.from_numpy(y)))
        for batches in training.epochs(model_config, SMALL)
        for x, y in batches
    ]
    assert history.losses == losses
    trained = history.model.state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(trained[name], value), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_run_follows_the_cpu_run_and_its_model_serves_numpy():
    from mhsa import registry  # the tools layer, only to reach the backend as the CLI does
    from torch_impl.generate import generate
    from torch_impl.model import attend, to_exchange
    from torch_impl.train import optimizer_to_exchange

    assert "device" in registry.get("torch").supports
    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # full float32, as parity asks
    try:
        model_config = ModelConfig()
        on_cpu = train(model_config, SMALL)
        on_gpu = train(model_config, SMALL, device="cuda")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous
    assert next(on_gpu.model.parameters()).device.type == "cuda"
    np.testing.assert_allclose(on_gpu.losses, on_cpu.losses, rtol=0, atol=1e-4)
    tokens = np.arange(24, dtype=np.int64).reshape(2, 12) % 64
    np.testing.assert_allclose(predict(on_gpu.model, tokens), predict(on_cpu.model, tokens), atol=1e-3)
    x = np.random.default_rng(0).standard_normal((2, 12, model_config.d_model)).astype(np.float32)
    assert attend(on_gpu.model, x).shape == (2, 12, model_config.d_model)
    assert set(to_exchange(on_gpu.model)) == set(to_exchange(on_cpu.model))
    assert optimizer_to_exchange(on_gpu.optimizer, on_gpu.model, SMALL).step == int(on_cpu.optimizer.state[next(on_cpu.model.parameters())]["step"])
    np.testing.assert_array_equal(generate(on_gpu.model, tokens[:, :4], 6), generate(on_gpu.model, tokens[:, :4], 6, use_cache=False))
