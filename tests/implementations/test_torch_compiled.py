"""torch_impl/compiled.py, the opt-in torch.compile of the whole step (train(..., compile=True),
the command's --compile): it compiles every batch shape before step 0, trains and resumes as the
eager run does, leaves the weights and Adam's state as they were, compiles per run (no recompile
limit builds up), names a failed compilation in one line, and the command reports its seconds
apart.

The tests plant torch.compile's "aot_eager" backend: the same captured graphs and autograd,
without inductor's C++ build (seconds per graph on a cold cache); benchmarks/train.py runs the
real inductor path."""

import dataclasses
import json
import re

import numpy as np
import pytest
import torch

from shared import training, weights
from shared.config import TrainConfig
from shared.tolerances import tolerance
from tests.backends import SMALL as SMALL_MODEL
from tests.commands import run_cli
from torch_impl import compiled as compiled_module
from torch_impl import train as train_module
from torch_impl.model import TinyLM, from_exchange, loss_fn, to_exchange
from torch_impl.train import new_optimizer, train, train_step

SMALL = TrainConfig(epochs=2, n_sequences=96)  # 3 steps per epoch: seconds


@pytest.fixture
def counted_compiles(monkeypatch):
    """torch.compile's backend for the trainer, planted: aot_eager, recording each graph it is
    handed (a new batch shape, or a guard that failed, is a new graph)."""
    import torch._dynamo

    graphs = []

    def counting(graph, example_inputs):
        graphs.append([tuple(value.shape) for value in example_inputs if isinstance(value, torch.Tensor)])
        return torch._dynamo.lookup_backend("aot_eager")(graph, example_inputs)

    torch._dynamo.reset()  # no graph of another test is reused
    monkeypatch.setattr(compiled_module, "COMPILE_BACKEND", counting)
    yield graphs
    torch._dynamo.reset()


@pytest.mark.slow
def test_compile_builds_every_batch_shape_before_step_0_and_trains_as_the_eager_run(counted_compiles):
    config = TrainConfig(epochs=2, batch_size=8, n_sequences=28, seed=5, dtype="float64")  # 3 batches of 8 and a last of 4 per epoch
    seen = []  # graphs compiled by the time each step is reported
    compiled = train(SMALL_MODEL, config, compile=True, on_step=lambda step, loss: seen.append(len(counted_compiles)))
    eager = train(SMALL_MODEL, config)
    assert len(counted_compiles) == 2 and seen == [2] * 8  # the full batch and the last one, both before step 0; none later
    assert type(compiled.model) is TinyLM  # the plain model is returned: saved, served and resumed as any other
    assert eager.compile_seconds is None and 0 < compiled.compile_seconds <= compiled.seconds
    gap = np.abs(np.asarray(compiled.losses) - np.asarray(eager.losses)).max()
    assert gap <= tolerance("trajectory", "float64"), (
        f"loss trajectory: compiled vs eager differ by {gap:.2e} > {tolerance('trajectory', 'float64'):.0e}"
    )
    for name, value in eager.model.state_dict().items():
        np.testing.assert_allclose(compiled.model.state_dict()[name].numpy(), value.numpy(), rtol=0, atol=1e-10, err_msg=name)
    assert all(parameter.grad is None or parameter.grad.abs().sum() > 0 for parameter in compiled.model.parameters())
    compiled_adam = train_module.optimizer_to_exchange(compiled.optimizer, compiled.model, config)
    eager_adam = train_module.optimizer_to_exchange(eager.optimizer, eager.model, config)
    assert compiled_adam.step == eager_adam.step == 8
    for moment in ("exp_avg", "exp_avg_sq"):  # Adam's state is the optimizer's own, updated in place by the compiled step
        for name, value in getattr(eager_adam, moment).items():
            np.testing.assert_allclose(getattr(compiled_adam, moment)[name], value, rtol=1e-9, atol=1e-14, err_msg=f"{moment} {name}")


@pytest.mark.slow
def test_compile_resumes_as_the_eager_run(counted_compiles, tmp_path):
    config = TrainConfig(epochs=2, batch_size=8, n_sequences=32, seed=5, dtype="float64")  # one batch shape: one graph
    first = train(SMALL_MODEL, dataclasses.replace(config, epochs=1))
    weights.save(tmp_path / "epoch1.safetensors", to_exchange(first.model), SMALL_MODEL)
    state = train_module.optimizer_to_exchange(first.optimizer, first.model, first.train_config)
    eager = train(SMALL_MODEL, config, init=tmp_path / "epoch1.safetensors", resume=state)
    compiled = train(SMALL_MODEL, config, init=tmp_path / "epoch1.safetensors", resume=state, compile=True)
    assert len(compiled.losses) == len(eager.losses) == 4  # epoch 2 only, from the saved moments and step count
    gap = np.abs(np.asarray(compiled.losses) - np.asarray(eager.losses)).max()
    assert gap <= tolerance("trajectory", "float64"), (
        f"resumed loss trajectory: compiled vs eager differ by {gap:.2e} > {tolerance('trajectory', 'float64'):.0e}"
    )


@pytest.mark.slow
def test_compiling_the_step_leaves_the_weights_and_adam_state_as_they_were(counted_compiles):
    config = TrainConfig(epochs=1, batch_size=8, n_sequences=28, seed=5, dtype="float64")
    model = from_exchange(training.initial_weights("shared", SMALL_MODEL, config), SMALL_MODEL)
    optimizer = new_optimizer(model, config)
    batches = next(training.epochs(SMALL_MODEL, config))[:3]  # full batches only: one graph
    for x, y in batches[:2]:  # Adam's state exists and is not zero
        train_step(model, optimizer, torch.from_numpy(x), torch.from_numpy(y))
    before = [
        tensor.clone()
        for tensor in compiled_module._step_tensors(list(model.parameters()), compiled_module._states(optimizer, list(model.parameters())))
    ]
    step, seconds = compiled_module.compile_step(model, optimizer, batches, loss_fn)
    after = compiled_module._step_tensors(list(model.parameters()), compiled_module._states(optimizer, list(model.parameters())))
    assert seconds > 0 and len(counted_compiles) == 1
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "compile_step changed the weights or Adam's state"
    x, y = (torch.from_numpy(array) for array in batches[2])
    eager_model = from_exchange(to_exchange(model), SMALL_MODEL)
    compiled_loss = step(x, y)  # called on its own, outside train(): it trains from them, as the eager step does
    assert float(compiled_loss) == pytest.approx(float(loss_fn(eager_model, x, y).detach()), rel=1e-12)


@pytest.mark.slow
def test_each_run_compiles_its_own_step_so_no_recompile_limit_builds_up_across_runs(counted_compiles):
    import torch._dynamo

    config = TrainConfig(epochs=1, batch_size=8, n_sequences=16, seed=5)
    with torch._dynamo.config.patch(recompile_limit=1):  # 8 in torch: a ninth configuration in one process would fail
        for model_config in (SMALL_MODEL, dataclasses.replace(SMALL_MODEL, max_len=SMALL_MODEL.max_len + 1)):
            assert train(model_config, config, compile=True).compile_seconds > 0
        assert len(counted_compiles) == 2
        uneven = dataclasses.replace(config, n_sequences=20)  # batches of 8, 8 and 4: a second graph, over the limit of 1
        message = r"^torch.compile: a recompile limit of torch._dynamo was reached \(recompile_limit 1 per function, "
        with pytest.raises(ValueError, match=message):  # one line that says what to do, not dynamo's traceback
            train(SMALL_MODEL, uneven, compile=True)


@pytest.mark.slow  # torch.compile traces the model
def test_compile_names_a_failed_compilation(monkeypatch):
    def failing(graph, example_inputs):
        raise RuntimeError("planted: no C++ compiler")

    import torch._dynamo

    torch._dynamo.reset()
    monkeypatch.setattr(compiled_module, "COMPILE_BACKEND", failing)
    steps = []
    with pytest.raises(ValueError) as error:
        train(SMALL_MODEL, SMALL, compile=True, on_step=lambda step, loss: steps.append(step))
    message = str(error.value)
    assert message == "torch.compile (backend 'failing') failed: RuntimeError: planted: no C++ compiler" and steps == []
    torch._dynamo.reset()


@pytest.mark.slow
def test_the_compile_flag_reports_its_seconds_apart_and_in_the_history(counted_compiles, tmp_path):
    flags = ["--quiet", "--epochs", "1", "--n-sequences", "40", "--batch-size", "8", "--history", "run.json"]
    flags += ["--d-model", "8", "--n-heads", "2", "--seq-len", "5", "--vocab-size", "7"]
    result = run_cli("torch", *flags, "--compile", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("torch.compile: compiling the whole step before step 0, about "), result.stderr
    final = next(line for line in result.stdout.splitlines() if line.startswith("final loss "))
    assert re.search(r"5 steps in [0-9.]+ s of training \(set-up and compilation included; torch.compile before step 0: [0-9.]+ s\) · ", final), final
    data = json.loads((tmp_path / "run.json").read_text())
    assert 0 < data["compile_seconds"] <= data["seconds"]
    assert len(counted_compiles) == 1
