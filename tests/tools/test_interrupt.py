"""Ctrl-C keeps what it can and says what is on disk: during training with --save, the last
complete epoch as a bound checkpoint that --resume continues exactly (mhsa/epoch_keeper.py);
after training, the run's own checkpoint; a second Ctrl-C during that save leaves no half pair.

The keeping needs a trainer whose train() hands over its model and optimizer at every epoch's end
(on_epoch). Where a registered trainer lacks the hook, these tests give it one the honest way: the
real trainer run one epoch at a time, each part resuming the last through the public resume
protocol, with on_epoch called between the parts (epoch_by_epoch)."""

import dataclasses
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from mhsa import registry
from mhsa.epoch_keeper import EpochKeeper, has_on_epoch
from shared import checkpoint, files, weights
from shared.adam_state import AdamState
from shared.config import TrainConfig
from shared.history import History
from shared.training import epoch_means
from tests.backends import SMALL, names
from tests.commands import run_cli
from tests.paths import ROOT

SMALL_RUN = ["--n-sequences", "48", "--batch-size", "16", "--seq-len", "5", "--vocab-size", "11", "--d-model", "24"]  # 3 steps per epoch
STEPS_PER_EPOCH = 3


def epoch_by_epoch(real):
    """`real` (a trainer's train) with on_epoch: the real trainer itself where it has the hook,
    else the real trainer run one epoch at a time, each part resuming the one before from its
    weights and Adam's state (the resume protocol every trainer keeps exactly), and
    on_epoch(epochs_done, model, optimizer) called between the parts."""
    if has_on_epoch(real):
        return real
    module = sys.modules[real.__module__]
    model_module = sys.modules[real.__module__.rsplit(".", 1)[0] + ".model"]

    def train(model_config, train_config, init="shared", on_step=None, resume=None, on_epoch=None, **options):
        done = 0 if resume is None else resume.epochs_done
        first_step, losses = done * train_config.steps_per_epoch, []
        while done < train_config.epochs:
            part_config = dataclasses.replace(train_config, epochs=done + 1)
            part = real(model_config, part_config, init=init, on_step=on_step, resume=resume, **options)
            losses += part.losses
            done += 1
            resume = module.optimizer_to_exchange(part.optimizer, part.model, part_config)
            init = weights.Loaded(ROOT / f"epoch-{done}", model_module.to_exchange(part.model), model_config, train_config.dtype, "")
            if on_epoch is not None:
                on_epoch(done, part.model, part.optimizer)
        return dataclasses.replace(
            part,
            train_config=train_config,
            losses=losses,
            epoch_losses=epoch_means(losses, train_config),
            first_step=first_step,
            model=part.model,
            optimizer=part.optimizer,
        )

    return train


def interrupting_at(real, step):
    """`real` with a KeyboardInterrupt raised as step `step` is reported: a Ctrl-C landing there."""

    def train(*args, on_step=None, **options):
        def report(at, loss):
            on_step(at, loss)
            if at == step:
                raise KeyboardInterrupt

        return real(*args, on_step=report, **options)

    train.__signature__ = __import__("inspect").signature(real)  # has_on_epoch sees the hook it has
    return train


@pytest.fixture
def hooked(monkeypatch):
    """hooked(name, interrupt_at=None): the trainer of `name`, with on_epoch, and a Ctrl-C at that step."""

    def install(name, interrupt_at=None):
        module = registry.get(name).train
        trainer = epoch_by_epoch(module.train)
        if interrupt_at is not None:
            trainer = interrupting_at(trainer, interrupt_at)
        monkeypatch.setattr(module, "train", trainer)

    return install


def uninterrupted_losses(name, epochs, tmp_path):
    result = run_cli(name, "--quiet", *SMALL_RUN, "--epochs", str(epochs), "--history", "whole.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return History.load(tmp_path / "whole.json").losses


@pytest.mark.parametrize("name", names("train"))
def test_ctrl_c_in_an_epoch_saves_the_last_complete_one_and_resume_continues_exactly(tmp_path, hooked, monkeypatch, name):
    hooked(name, interrupt_at=2 * STEPS_PER_EPOCH + 1)  # the second step of epoch 3
    result = run_cli(name, *SMALL_RUN, "--epochs", "1000", "--save", "run.safetensors", "--history", "run.json", cwd=tmp_path)
    assert result.returncode == 130
    assert result.stderr == (
        "interrupted in epoch 3/1000: saved epoch 2 (step 6) to run.safetensors and run.adam.safetensors, its history to run.json "
        "(--resume run.safetensors continues it)\n"
    )
    loaded, state = checkpoint.load(tmp_path / "run.safetensors")
    assert (state.epochs_done, state.step) == (2, 6)
    part = History.load(tmp_path / "run.json")
    assert part.first_step == 0 and len(part.losses) == 6
    monkeypatch.undo()  # the command's own trainer from here on
    resumed = run_cli(name, "--quiet", *SMALL_RUN, "--epochs", "4", "--resume", "run.safetensors", "--history", "rest.json", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    whole = uninterrupted_losses(name, 4, tmp_path)
    rest = History.load(tmp_path / "rest.json")
    assert part.losses == whole[:6]
    assert rest.first_step == 6 and rest.losses == whole[6:], f"{name}: the resumed run's losses differ from the uninterrupted run's"


def test_ctrl_c_before_the_first_epoch_ends_saves_nothing_and_says_why(tmp_path, hooked):
    name = names("train")[0]
    hooked(name, interrupt_at=1)
    result = run_cli(name, *SMALL_RUN, "--epochs", "1000", "--save", "run.safetensors", cwd=tmp_path)
    assert result.returncode == 130 and result.stderr == "interrupted in epoch 1/1000: nothing was saved (no epoch was complete)\n"
    assert os.listdir(tmp_path) == []


def test_a_trainer_without_on_epoch_keeps_nothing_as_before(tmp_path, monkeypatch):
    name = names("train")[0]
    module = registry.get(name).train
    real = module.train

    def without_hook(model_config, train_config, init="shared", on_step=None, resume=None):
        return interrupting_at(real, STEPS_PER_EPOCH + 1)(model_config, train_config, init=init, on_step=on_step, resume=resume)

    monkeypatch.setattr(module, "train", without_hook)
    result = run_cli(name, *SMALL_RUN, "--epochs", "1000", "--save", "run.safetensors", cwd=tmp_path)
    assert result.returncode == 130
    assert result.stderr == "interrupted in epoch 2/1000: nothing was saved (this trainer hands over its model only at the end)\n"
    assert os.listdir(tmp_path) == []


def test_a_second_ctrl_c_while_the_kept_epoch_is_written_leaves_no_half_pair_and_says_so(tmp_path, hooked, monkeypatch):
    name = names("train")[0]
    hooked(name, interrupt_at=STEPS_PER_EPOCH + 1)
    real = files.write_temporary

    def second_ctrl_c(path, payload):
        temporary = real(path, payload)
        os.kill(os.getpid(), signal.SIGINT)  # while the pair's temporaries are written
        return temporary

    monkeypatch.setattr(files, "write_temporary", second_ctrl_c)
    result = run_cli(name, *SMALL_RUN, "--epochs", "1000", "--save", "run.safetensors", cwd=tmp_path)
    assert result.returncode == 130
    assert result.stderr == "interrupted in epoch 2/1000, and again while epoch 1 was being saved: nothing was saved\n"
    assert os.listdir(tmp_path) == []


def test_a_second_ctrl_c_while_the_kept_pair_is_renamed_is_held_until_it_is_whole(tmp_path, hooked, monkeypatch):
    name = names("train")[0]
    hooked(name, interrupt_at=STEPS_PER_EPOCH + 1)
    real = files.commit

    def second_ctrl_c(temporary, path):
        real(temporary, path)
        os.kill(os.getpid(), signal.SIGINT)  # between the two renames

    monkeypatch.setattr(files, "commit", second_ctrl_c)
    result = run_cli(name, *SMALL_RUN, "--epochs", "1000", "--save", "run.safetensors", cwd=tmp_path)
    assert result.returncode == 130
    assert result.stderr == (
        "interrupted in epoch 2/1000: saved epoch 1 (step 3) to run.safetensors and run.adam.safetensors (--resume run.safetensors continues it)\n"
    )
    monkeypatch.undo()
    assert checkpoint.load(tmp_path / "run.safetensors")[1].epochs_done == 1


def test_ctrl_c_during_the_save_after_training_says_what_was_written(tmp_path, monkeypatch):
    # the pair is renamed into place with Ctrl-C held: it is whole, and the message says so
    real = files.commit

    def ctrl_c_while_renaming(temporary, path):
        real(temporary, path)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(files, "commit", ctrl_c_while_renaming)
    name = names("train")[0]
    result = run_cli(name, "--quiet", *SMALL_RUN, "--epochs", "1", "--save", "run.safetensors", "--history", "run.json", cwd=tmp_path)
    assert result.returncode == 130
    assert result.stderr == "interrupted after training: saved run.safetensors and run.adam.safetensors, run.json\n"
    monkeypatch.undo()
    assert checkpoint.load(tmp_path / "run.safetensors")[1].epochs_done == 1 and History.load(tmp_path / "run.json").losses


# --- a real Ctrl-C in a real process ------------------------------------------------------------

REAL_RUN = textwrap.dedent("""
    import sys
    from mhsa import registry, train_cli
    from tests.tools.test_interrupt import epoch_by_epoch

    module = registry.get(sys.argv[1]).train
    module.train = epoch_by_epoch(module.train)
    sys.exit(train_cli.main(sys.argv[1], sys.argv[2:]))
""")


@pytest.mark.timeout(180)
def test_a_real_ctrl_c_keeps_the_last_complete_epoch_and_a_second_one_leaves_no_half_pair(tmp_path):
    name = names("train")[0]
    path = tmp_path / "run.safetensors"
    argv = [sys.executable, "-c", REAL_RUN, name, *SMALL_RUN, "--epochs", "100000", "--save", str(path)]
    child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        while not child.stdout.readline().startswith("epoch 2/"):
            pass
        child.send_signal(signal.SIGINT)
        time.sleep(0.01)
        child.send_signal(signal.SIGINT)  # a second one, landing in the save or after it
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 130 and len(err.splitlines()) == 1, err
    saved = re.fullmatch(rf"interrupted in epoch (\d+)/100000: saved epoch (\d+) \(step \d+\) to {re.escape(str(path))} and .*\n", err)
    if saved is None:  # the second Ctrl-C came while the pair's temporaries were written
        assert re.fullmatch(r"interrupted in epoch \d+/100000, and again while epoch \d+ was being saved: nothing was saved\n", err), err
        assert os.listdir(tmp_path) == []
        return
    assert int(saved.group(2)) >= 2 and int(saved.group(1)) == int(saved.group(2)) + 1
    assert sorted(os.listdir(tmp_path)) == ["run.adam.safetensors", "run.safetensors"]
    _, state = checkpoint.load(path)
    assert state.epochs_done == int(saved.group(2)) and np.isfinite(state.exp_avg["lm_head.bias"]).all()


# --- what the keeper keeps ------------------------------------------------------------------------


class LiveModel:
    """A trainer's model and optimizer as a backend hands them over: live arrays, changed in place by the next step."""

    def __init__(self):
        self.arrays = weights.init_weights(SMALL, 0)
        self.step = 0


class LiveBackend:
    """The two functions of a backend the keeper calls, returning the live arrays themselves (as torch's views do)."""

    class model:
        @staticmethod
        def to_exchange(live):
            return live.arrays

    class train:
        @staticmethod
        def optimizer_to_exchange(live, model, train_config):
            return AdamState(live.step, train_config.epochs, live.arrays, live.arrays, train_config)


def test_the_keeper_copies_what_it_is_handed_and_keeps_an_epoch_only_once_its_steps_are_reported():
    run = TrainConfig(epochs=10, n_sequences=48, batch_size=16)  # 3 steps per epoch
    keeper, live = EpochKeeper(LiveBackend, run, steps_before=0), LiveModel()
    for step in range(3):
        keeper.on_step(step)
    live.step = 3
    keeper.on_epoch(1, live, live)
    live.step = 6
    keeper.on_epoch(2, live, live)  # handed over before its last steps are reported, as a pipelined trainer does
    before = live.arrays["lm_head.bias"].copy()
    live.arrays["lm_head.bias"] += 1.0  # the next steps change the live arrays in place
    kept = keeper.last_complete()
    assert kept.epochs_done == 1 and kept.state.step == 3 and kept.state.epochs_done == 1
    assert (kept.arrays["lm_head.bias"] == before).all() and (kept.state.exp_avg["lm_head.bias"] == before).all()
    for step in range(3, 6):
        keeper.on_step(step)
    assert keeper.last_complete().epochs_done == 2 and [kept.epochs_done for kept in keeper.copies] == [2]
