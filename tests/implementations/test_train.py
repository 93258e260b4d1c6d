"""The trainers as libraries (capability "train"): the default run learns the copy task, every
trainer's trajectory agrees with the first's at every step, every batch is trained, and a run
that cannot go on stops with one clear error before its first step or at the step it fails.
The train command around them: tests/tools/test_train_cli.py and test_train_output.py."""

import numpy as np
import pytest

from mhsa import registry
from shared import training, weights
from shared.config import ModelConfig, TrainConfig
from shared.tolerances import assert_close, tolerance
from shared.training import NonFiniteLossError
from shared.weights import init_weights
from tests.backends import SMALL, names, native
from tests.tiers import first_fast
from tests.weight_files import exactly

TRAINERS = names("train")


def trainer(name):
    return registry.get(name).train


@pytest.mark.parametrize("name", first_fast(TRAINERS))
def test_the_default_run_learns_the_copy_task(default_run, name):
    history = default_run(name, "float32")
    assert history.backend == name and len(history.losses) == 3 * 64 and len(history.epoch_losses) == 3
    assert abs(history.losses[0] - np.log(64)) < 0.1  # starts at chance, log(64) = 4.16
    assert history.epoch_losses[-1] < 0.1
    assert all(value.dtype == np.float32 for value in registry.get(name).model.to_exchange(history.model).values())


@pytest.mark.parametrize("dtype", first_fast(["float32", "float64"]))
@pytest.mark.parametrize("other", TRAINERS[1:])
def test_default_trajectory_matches_the_first_trainers_at_every_step(default_run, other, dtype):
    first = TRAINERS[0]
    ours, theirs = default_run(first, dtype), default_run(other, dtype)
    assert len(ours.losses) == len(theirs.losses) == 192
    assert_close(f"{dtype} loss trajectory {first} vs {other}", ours.losses, theirs.losses, tolerance("trajectory", dtype))
    if dtype == "float64":
        final = registry.get(other).model.to_exchange(theirs.model)
        for name, value in registry.get(first).model.to_exchange(ours.model).items():
            assert_close(f"final {name} {first} vs {other}", value, final[name], 1e-9)


@pytest.mark.parametrize("backend", first_fast(TRAINERS))
def test_a_smaller_last_batch_is_trained_too(backend):
    steps = []
    history = trainer(backend).train(SMALL, TrainConfig(epochs=2, n_sequences=70, batch_size=32), on_step=lambda step, loss: steps.append(step))
    assert steps == list(range(6)) and len(history.losses) == 6  # 32 + 32 + 6 per epoch


@pytest.mark.parametrize("backend", first_fast(names("layers")))  # the framework layers' own initializers
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
    arrays = init_weights(SMALL, 0)
    arrays["lm_head.bias"][3] = np.nan
    weights.save(tmp_path / "nan.safetensors", arrays, SMALL)
    with pytest.raises(NonFiniteLossError, match=r"at step 0 \(epoch 1\): nan"):
        # one batch: the run of test_the_trained_model_checks_its_ids_again, so JAX compiles its steps once
        trainer(backend).train(SMALL, TrainConfig(epochs=1, n_sequences=32), init=tmp_path / "nan.safetensors")


def _bad_epochs(bad, batch=17):
    """training.epochs with one batch of the first epoch made bad (batch 17: in the epoch's second
    run of training.PROGRESS_STEPS steps, after on_step heard of the first): one id replaced by
    `bad`, or, for "float64", its ids as floats."""
    real = training.epochs

    def epochs(model_config, train_config, start=0):
        for number, batches in enumerate(real(model_config, train_config, start)):
            if number == 0:
                x, y = batches[batch]
                x = x.astype(np.float64) if bad == "float64" else x.copy()
                if bad != "float64":
                    x[3, 5] = bad
                batches = [*batches[:batch], (x, y), *batches[batch + 1 :]]
            yield batches

    return epochs


BAD_BATCHES = {
    64: (ValueError, "token id 64 is out of range: ids must lie in [0, 64) for vocab_size=64"),
    -1: (ValueError, "token id -1 is out of range: ids must lie in [0, 64) for vocab_size=64"),
    "float64": (TypeError, "tokens must be an integer array (B, T) of int32 or int64, got dtype float64"),
}


@pytest.mark.parametrize("bad", BAD_BATCHES, ids=["id 64", "id -1", "float ids"])
@pytest.mark.parametrize("backend", TRAINERS)
def test_a_bad_batch_is_refused_with_the_forwards_message_before_the_first_step(monkeypatch, backend, bad):
    """Each trainer checks an epoch's ids once, on the host, before its first step (its steps then
    skip the forward's own check: no host sync per step in torch, no ids at all under JAX's jit)."""
    model_config = ModelConfig()
    module = registry.get(backend).model
    model = module.from_exchange(training.initial_weights("shared", model_config, TrainConfig()), model_config)
    tokens = np.zeros((2, model_config.max_len), dtype=np.int64)
    if bad == "float64":
        tokens = tokens.astype(np.float64)
    else:
        tokens[1, 2] = bad
    error, expected = BAD_BATCHES[bad]
    with pytest.raises(error) as from_forward:
        module.predict(model, tokens)
    assert str(from_forward.value) == expected
    monkeypatch.setattr(training, "epochs", _bad_epochs(bad))
    steps = []
    with pytest.raises(error) as from_trainer:
        trainer(backend).train(model_config, TrainConfig(epochs=1, n_sequences=640), on_step=lambda step, loss: steps.append(step))
    assert str(from_trainer.value) == expected
    assert steps == []  # refused before the epoch's first step, not after the 16 steps before the bad batch


@pytest.mark.parametrize("name", TRAINERS)
def test_the_trained_model_checks_its_ids_again(name):
    # the trainer checks each epoch's batches and its steps check nothing: the model it hands back checks its callers' ids
    history = trainer(name).train(SMALL, TrainConfig(epochs=1, n_sequences=32))
    bad = np.full((1, 4), SMALL.vocab_size, dtype=np.int64)
    with pytest.raises(ValueError, match=r"^token id 11 is out of range"):
        registry.get(name).model.predict(history.model, bad)
    with pytest.raises(ValueError, match=r"^token id 11 is out of range"):  # its public check, on the framework's array
        history.model.check(native(name, bad))


@pytest.mark.parametrize("name", TRAINERS)
def test_a_file_in_the_wrong_dtype_for_the_run_is_refused_before_training(tmp_path, name):
    path = tmp_path / "model.safetensors"
    weights.save(path, init_weights(SMALL, 0, "float32"), SMALL)
    with pytest.raises(ValueError, match=exactly(f"weights file {str(path)!r}: weights are float32, expected float64 (the run's dtype)")):
        trainer(name).train(SMALL, TrainConfig(epochs=1, n_sequences=64, dtype="float64"), init=path)


@pytest.mark.parametrize("name", TRAINERS)
def test_the_largest_seed_trains_in_every_backend(name):
    run = trainer(name).train(SMALL, TrainConfig(epochs=1, n_sequences=32, seed=2**32 - 1))
    assert np.isfinite(run.losses).all()
