"""The torch trainer's speed paths and its device: the token ids are checked once per epoch
(instead of a min/max and a host sync in every forward) with the forward's own message, the
trajectory is the step-by-step one bit for bit, and `device` is checked before any work
("cuda" without a GPU is refused in one line). The cuda run itself needs a GPU."""

import numpy as np
import pytest
import torch

from shared import training
from shared.config import ModelConfig, TrainConfig
from torch_impl.model import from_exchange, predict
from torch_impl.train import FusedAdam, train, train_step

SMALL = TrainConfig(epochs=2, n_sequences=96)  # 3 steps per epoch: seconds


def _bad_epochs(bad_id, batch=17):
    """training.epochs with one id of one batch of the first epoch replaced by bad_id (batch 17:
    in the epoch's second run of training.PROGRESS_STEPS steps, after on_step heard of the first)."""
    real = training.epochs

    def epochs(model_config, train_config, start=0):
        for number, batches in enumerate(real(model_config, train_config, start)):
            if number == 0:
                x, y = batches[batch]
                x = x.copy()
                x[3, 5] = bad_id
                batches = [*batches[:batch], (x, y), *batches[batch + 1 :]]
            yield batches

    return epochs


@pytest.mark.parametrize("bad_id", [64, -1])
def test_a_bad_token_id_is_refused_with_the_forwards_message(monkeypatch, bad_id):
    model_config = ModelConfig()
    model = from_exchange(training.initial_weights("shared", model_config, SMALL), model_config)
    tokens = np.zeros((2, model_config.max_len), dtype=np.int64)
    tokens[1, 2] = bad_id
    with pytest.raises(ValueError) as from_forward:
        predict(model, tokens)
    expected = f"token id {bad_id} is out of range: ids must lie in [0, 64) for vocab_size=64"
    assert str(from_forward.value) == expected
    monkeypatch.setattr(training, "epochs", _bad_epochs(bad_id))
    steps = []
    with pytest.raises(ValueError) as from_trainer:
        train(model_config, TrainConfig(epochs=1, n_sequences=640), on_step=lambda step, loss: steps.append(step))
    assert str(from_trainer.value) == expected
    assert steps == []  # refused before the epoch's first step, not after the 16 steps before the bad batch


def test_the_trained_model_checks_ids_again():
    history = train(ModelConfig(), SMALL)
    assert history.model.ids_checked is False
    with pytest.raises(ValueError, match=r"^token id 64 is out of range"):
        predict(history.model, np.full((1, 4), 64, dtype=np.int64))


def test_the_trajectory_is_the_step_by_step_loop_bit_for_bit():
    """train() (ids checked per epoch, losses fetched per run of steps) against train_step
    called batch by batch with every forward checking its ids."""
    model_config = ModelConfig()
    history = train(model_config, SMALL)
    model = from_exchange(training.initial_weights("shared", model_config, SMALL), model_config)
    optimizer = FusedAdam(model.parameters(), lr=SMALL.lr, betas=SMALL.betas, eps=SMALL.eps)
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
    from shared.tools import registry  # the tools layer, only to reach the backend as the CLI does
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


def test_float_tokens_are_refused_with_the_forwards_message(monkeypatch):
    model_config = ModelConfig()
    model = from_exchange(training.initial_weights("shared", model_config, SMALL), model_config)
    with pytest.raises(TypeError) as from_forward:
        predict(model, np.zeros((2, 4)))
    real = training.epochs

    def epochs(model_config, train_config, start=0):
        for batches in real(model_config, train_config, start):
            yield [(x.astype(np.float64), y) for x, y in batches]

    monkeypatch.setattr(training, "epochs", epochs)
    with pytest.raises(TypeError) as from_trainer:
        train(model_config, SMALL)
    assert str(from_trainer.value) == str(from_forward.value)
