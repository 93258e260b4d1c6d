"""Both trainers: the default run learns the copy task, torch and JAX trajectories agree,
and the command lines behave the same."""

import json
import re

import numpy as np
import pytest

from mhsa import registry
from mhsa.cli import main
from shared import training
from shared.config import ModelConfig, TrainConfig
from shared.history import KEYS, History
from shared.tolerances import assert_close, tolerance
from shared.training import NonFiniteLossError
from tests.backends import SMALL, names
from tests.commands import run_cli

TRAINERS = names("train")


def trainer(name):
    return registry.get(name).train


@pytest.fixture(scope="module")
def default_runs(tmp_path_factory):
    """The default float32 run of each backend, with a user's flags and nothing else."""
    folder = tmp_path_factory.mktemp("default")
    runs = {}
    for backend in TRAINERS:
        result = run_cli(backend, "--history", f"{backend}.json", "--save", f"{backend}.safetensors", cwd=folder)
        assert result.returncode == 0, result.stderr
        runs[backend] = (result, History.load(folder / f"{backend}.json"), folder)
    return runs


def test_default_run_learns_the_copy_task(default_runs):
    for backend, (_, history, _) in default_runs.items():
        assert abs(history.losses[0] - np.log(64)) < 0.1, backend  # starts at chance, log(64) = 4.16
        assert history.epoch_losses[-1] < 0.1, backend
        assert len(history.losses) == 3 * 64 and len(history.epoch_losses) == 3


def test_default_float32_trajectories_agree_at_every_step(default_runs):
    first, *others = TRAINERS
    assert others, "at least two trainers to compare"
    for other in others:
        assert_close(
            f"float32 loss trajectory {other} vs {first}",
            default_runs[other][1].losses,
            default_runs[first][1].losses,
            tolerance("trajectory", "float32"),
        )


def test_cli_output_and_history_schema_are_the_same_for_both_backends(default_runs):
    lines = {}
    for backend, (result, _, folder) in default_runs.items():
        out = result.stdout
        assert out.startswith(f"backend {backend}\nmodel  vocab_size=64 d_model=32 n_heads=4 (d_head=8) max_len=12")
        for epoch in (1, 2, 3):
            assert f"epoch {epoch}/3  mean loss " in out
        assert "final loss " in out and "head 0 of 4" in out and "shade:" in out
        assert result.stderr == ""  # not a terminal: no progress bar
        data = json.loads((folder / f"{backend}.json").read_text())
        assert sorted(data) == sorted(KEYS + ("first_step", "init", "source", "source_sha256", "compile_seconds"))
        assert data["backend"] == backend and data["first_step"] == 0 and data["init"] == "shared" and data["source"] is None
        assert data["compile_seconds"] is None  # no --compile
        # identical lines apart from the backend's name and the numbers
        lines[backend] = [re.sub(r"\d[\d,]*(\.\d+)?(e-?\d+)?", "N", line.replace(backend, "BACKEND")) for line in out.splitlines()]
    first, *others = TRAINERS
    assert all(lines[other] == lines[first] for other in others), lines
    heatmap_rows = [line for line in default_runs[first][0].stdout.splitlines() if line.strip()[:1].isdigit() and "|" in line]
    assert len(heatmap_rows) == 12


def test_the_saved_weights_reload_and_the_heatmap_shows_the_causal_triangle(default_runs):
    from shared import weights

    for backend, (result, _, folder) in default_runs.items():
        arrays, config = weights.load(folder / f"{backend}.safetensors")
        assert config == ModelConfig()
        rows = [line.split("|")[1] for line in result.stdout.splitlines() if line.count("|") == 2 and line.strip()[:1].isdigit()]
        assert len(rows) == 12, f"{backend}: the heatmap has {len(rows)} query rows, expected 12"
        for query, row in enumerate(rows):
            cell = len(row) // 12
            assert row[(query + 1) * cell :].strip() == "", f"{backend}: row {query} shows a later key"
            assert row[query * cell : (query + 1) * cell].strip() != ""


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_in_process_trajectories_agree(dtype):
    config = TrainConfig(epochs=2, n_sequences=320, dtype=dtype)
    first, *others = [trainer(name).train(SMALL, config) for name in TRAINERS]
    for name, history in zip(TRAINERS[1:], others):
        assert_close(f"{dtype} trajectory {name} vs {TRAINERS[0]}", history.losses, first.losses, tolerance("trajectory", dtype))
    assert first.epoch_losses[-1] < first.losses[0] / 2


@pytest.mark.parametrize("backend", TRAINERS)
def test_a_smaller_last_batch_is_trained_too(backend):
    steps = []
    history = trainer(backend).train(SMALL, TrainConfig(epochs=2, n_sequences=70, batch_size=32), on_step=lambda step, loss: steps.append(step))
    assert steps == list(range(6)) and len(history.losses) == 6  # 32 + 32 + 6 per epoch


@pytest.mark.parametrize("backend", names("layers"))  # the framework layers' own initializers
def test_native_init_trains_and_differs_from_shared(backend):
    config = TrainConfig(epochs=1, n_sequences=64)
    native = trainer(backend).train(SMALL, config, init="native")
    shared = trainer(backend).train(SMALL, config, init="shared")
    assert np.isfinite(native.losses).all() and native.losses[0] != shared.losses[0]


@pytest.mark.parametrize("backend", TRAINERS)
def test_a_non_finite_loss_stops_training_and_names_the_step(backend):
    # lr 1e30: the first update overflows float32 (lr 1e6 does not: Adam moves each weight by
    # about lr per step and this model still learns the copy task when saturated)
    with pytest.raises(NonFiniteLossError, match=r"loss became non-finite at step 1 \(epoch 1\): (nan|inf)") as caught:
        trainer(backend).train(SMALL, TrainConfig(epochs=2, n_sequences=256, lr=1e30))
    assert caught.value.step == 1


@pytest.mark.parametrize("backend", TRAINERS)
def test_a_nan_in_the_weights_stops_training_at_step_0(backend, tmp_path):
    from shared import weights
    from shared.weights import init_weights

    arrays = init_weights(SMALL, 0)
    arrays["lm_head.bias"][3] = np.nan
    weights.save(tmp_path / "nan.safetensors", arrays, SMALL)
    with pytest.raises(NonFiniteLossError, match=r"at step 0 \(epoch 1\): nan"):
        trainer(backend).train(SMALL, TrainConfig(epochs=1, n_sequences=64), init=tmp_path / "nan.safetensors")


@pytest.mark.parametrize("backend", TRAINERS)
def test_cli_save_then_load_continues_from_the_saved_weights(backend, tmp_path):
    first = run_cli(
        backend,
        "--epochs",
        "1",
        "--n-sequences",
        "128",
        "--seq-len",
        "6",
        "--vocab-size",
        "9",
        "--save",
        "w.safetensors",
        "--history",
        "a.json",
        "--heatmap-head",
        "3",
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr
    assert "head 3 of 4" in first.stdout and "saved weights to w.safetensors" in first.stdout
    second = run_cli(backend, "--epochs", "1", "--n-sequences", "128", "--load", "w.safetensors", "--history", "b.json", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "max_len=6" in second.stdout and "init=w.safetensors" in second.stdout
    a, b = History.load(tmp_path / "a.json"), History.load(tmp_path / "b.json")
    assert b.losses[0] < a.losses[0] / 2  # starts where the first run left off, not from scratch
    clash = run_cli(backend, "--load", "w.safetensors", "--n-heads", "2", "--d-model", "32", cwd=tmp_path)
    assert clash.returncode == 2 and "--n-heads 2 (file has 4)" in clash.stderr


def test_mhsa_train_runs_a_backend(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--backend", TRAINERS[0], "--epochs", "1", "--n-sequences", "64", "--n-heads", "8"]) == 0
    out, err = capsys.readouterr()
    assert "n_heads=8 (d_head=4)" in out and "epoch 1/1" in out, err


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
@pytest.mark.parametrize("backend", TRAINERS)
def test_a_bad_token_id_is_refused_with_the_forwards_message(monkeypatch, backend, bad_id):
    """Each trainer checks an epoch's ids once, on the host, before its first step (its steps then
    skip the forward's own check: no host sync per step in torch, no ids at all under JAX's jit)."""
    model_config = ModelConfig()
    module = registry.get(backend).model
    model = module.from_exchange(training.initial_weights("shared", model_config, TrainConfig()), model_config)
    tokens = np.zeros((2, model_config.max_len), dtype=np.int64)
    tokens[1, 2] = bad_id
    with pytest.raises(ValueError) as from_forward:
        module.predict(model, tokens)
    expected = f"token id {bad_id} is out of range: ids must lie in [0, 64) for vocab_size=64"
    assert str(from_forward.value) == expected
    monkeypatch.setattr(training, "epochs", _bad_epochs(bad_id))
    steps = []
    with pytest.raises(ValueError) as from_trainer:
        trainer(backend).train(model_config, TrainConfig(epochs=1, n_sequences=640), on_step=lambda step, loss: steps.append(step))
    assert str(from_trainer.value) == expected
    assert steps == []  # refused before the epoch's first step, not after the 16 steps before the bad batch
