"""Ctrl-C at any moment of the train command prints one line and exits 130, never a traceback
(also while the launcher is still importing), and keeps what it can, saying what is on disk:
during training with --save, the last complete epoch as a bound checkpoint that --resume
continues exactly (mhsa/epoch_keeper.py); after training, the run's own checkpoint; a second
Ctrl-C during that save leaves no half pair.

The keeping needs a trainer whose train() hands over its model and optimizer at every epoch's end
(on_epoch). Where a registered trainer lacks the hook, these tests give it one the honest way: the
real trainer run one epoch at a time, each part resuming the last through the public resume
protocol, with on_epoch called between the parts (epoch_by_epoch)."""

import contextlib
import dataclasses
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from mhsa import registry
from mhsa.epoch_keeper import has_on_epoch
from shared import checkpoint, files, weights
from shared.history import History
from shared.training import epoch_means
from tests.backends import names, package
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


@pytest.mark.parametrize(
    "fail_at, message",
    [
        (
            0,
            "epoch 2 could not be saved: [Errno 28] cannot write 'run.safetensors': No space left on device; "
            "nothing was replaced: a checkpoint saved there before is whole",
        ),
        (
            6,
            "saved epoch 2 (step 6) to run.safetensors and run.adam.safetensors (--resume run.safetensors continues it); "
            "its history was not written: [Errno 28] cannot write 'run.json': No space left on device",
        ),
    ],
    ids=["the pair", "the history"],
)
def test_a_full_disk_while_the_kept_epoch_is_saved_is_said_with_what_is_on_disk(tmp_path, hooked, monkeypatch, fail_at, message):
    from tests.failing_disk import FailingOs

    name = names("train")[0]
    hooked(name, interrupt_at=2 * STEPS_PER_EPOCH + 1)
    monkeypatch.setattr(files, "os", FailingOs(fail_at))  # the pair's 6 writes, fsyncs and renames, then the history's
    result = run_cli(name, *SMALL_RUN, "--epochs", "1000", "--save", "run.safetensors", "--history", "run.json", cwd=tmp_path)
    monkeypatch.undo()
    assert result.returncode == 130 and result.stderr == f"interrupted in epoch 3/1000: {message}\n"
    assert sorted(os.listdir(tmp_path)) == ([] if fail_at == 0 else ["run.adam.safetensors", "run.safetensors"])


def ctrl_c_after(real):
    """`real` (files.write_temporary or files.commit), then a Ctrl-C: landing while a pair's
    temporaries are written, or between its two renames."""

    def call(*args):
        result = real(*args)
        os.kill(os.getpid(), signal.SIGINT)
        return result

    return call


@pytest.mark.parametrize("landing", ["write_temporary", "commit"], ids=["while the temporaries are written", "between the renames"])
def test_a_second_ctrl_c_while_the_kept_epoch_is_saved_is_held_until_the_pair_is_whole(tmp_path, hooked, monkeypatch, landing):
    name = names("train")[0]
    hooked(name, interrupt_at=STEPS_PER_EPOCH + 1)
    monkeypatch.setattr(files, landing, ctrl_c_after(getattr(files, landing)))
    result = run_cli(name, *SMALL_RUN, "--epochs", "1000", "--save", "run.safetensors", "--history", "run.json", cwd=tmp_path)
    assert result.returncode == 130
    assert result.stderr == (
        "interrupted in epoch 2/1000: saved epoch 1 (step 3) to run.safetensors and run.adam.safetensors, its history to run.json "
        "(--resume run.safetensors continues it)\n"
    )
    monkeypatch.undo()
    assert checkpoint.load(tmp_path / "run.safetensors")[1].epochs_done == 1 and len(History.load(tmp_path / "run.json").losses) == 3


def test_ctrl_c_during_the_save_after_training_says_what_was_written(tmp_path, monkeypatch):
    # each file is renamed into place with Ctrl-C held: it is whole, and the message names it
    monkeypatch.setattr(files, "commit", ctrl_c_after(files.commit))
    name = names("train")[0]
    result = run_cli(name, "--quiet", *SMALL_RUN, "--epochs", "1", "--save", "run.safetensors", "--history", "run.json", cwd=tmp_path)
    assert result.returncode == 130
    assert result.stderr == "interrupted after training: saved run.safetensors and run.adam.safetensors, run.json\n"
    monkeypatch.undo()
    assert checkpoint.load(tmp_path / "run.safetensors")[1].epochs_done == 1 and History.load(tmp_path / "run.json").losses


# --- a real Ctrl-C in a real process ------------------------------------------------------------

REAL_RUN = textwrap.dedent("""
    import atexit, sys, time
    from mhsa import registry, train_cli
    from tests.tools.test_interrupt import epoch_by_epoch

    name = sys.argv.pop(1)
    module = registry.get(name).train
    module.train = epoch_by_epoch(module.train)
    atexit.register(time.sleep, 1.0)  # an exit as slow as a framework's teardown: a Ctrl-C lands in it
    sys.exit(train_cli.main(name))  # its own command line, as a launcher runs it
""")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_real_ctrl_c_keeps_the_last_complete_epoch_and_more_of_them_change_nothing(tmp_path):
    name = names("train")[0]
    path = tmp_path / "run.safetensors"
    argv = [sys.executable, "-c", REAL_RUN, name, *SMALL_RUN, "--epochs", "100000", "--save", str(path)]
    child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        while not child.stdout.readline().startswith("epoch 2/"):
            pass
        child.send_signal(signal.SIGINT)
        time.sleep(0.01)
        child.send_signal(signal.SIGINT)  # a second one, landing while it saves or says so
        line = child.stderr.readline()
        child.send_signal(signal.SIGINT)  # and a third while it exits
        out, rest = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 130 and rest == "", line + rest  # one line, no traceback from a Ctrl-C while exiting
    saved = re.fullmatch(rf"interrupted in epoch (\d+)/100000: saved epoch (\d+) \(step \d+\) to {re.escape(str(path))} and .*\n", line)
    assert saved is not None, line
    # epoch 2 was printed; it is kept unless the Ctrl-C came before the trainer handed it over
    assert int(saved.group(2)) >= 1 and int(saved.group(1)) > int(saved.group(2))
    assert sorted(os.listdir(tmp_path)) == ["run.adam.safetensors", "run.safetensors"]
    _, state = checkpoint.load(path)
    assert state.epochs_done == int(saved.group(2)) and np.isfinite(state.exp_avg["lm_head.bias"]).all()


# --- Ctrl-C in a real process at any moment: one line, exit 130 -----------------------------------


def interrupted(argv, wait_for=None, delay=0.0, stream="stdout"):
    """Start argv, send SIGINT once `wait_for` appears on `stream` (or after `delay`), return
    (returncode, stdout, stderr lines other than -X importtime's)."""
    child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        seen = ""
        while wait_for is not None and wait_for not in seen:
            line = getattr(child, stream).readline()
            assert line, f"{wait_for!r} never appeared"
            seen += line
        time.sleep(delay)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    lines = [line for line in (seen if stream == "stderr" else "").splitlines() + err.splitlines() if not line.startswith("import time:")]
    return child.returncode, out, lines


@pytest.mark.slow
def test_ctrl_c_while_python_m_impl_train_imports_its_command_line_prints_one_line_and_exits_130():
    # -X importtime reports each finished import on stderr: numpy's comes while the launcher
    # imports mhsa.train_cli, before any handler of train_cli exists (the interpreter's
    # own start-up, before the first line of the program, is beyond any program's reach)
    argv = [sys.executable, "-X", "importtime", "-m", f"{package(names('train')[0])}.train", "--quiet"]
    code, out, err = interrupted(argv, wait_for=" numpy\n", stream="stderr")
    assert code == 130 and err == ["interrupted"], err


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.5, 1.5])
def test_ctrl_c_later_in_python_m_impl_train_prints_one_line_and_exits_130(delay):
    # a run long enough in every backend that the signal lands while it imports or trains
    argv = [sys.executable, "-m", f"{package(names('train')[0])}.train", "--quiet", "--epochs", "100000", "--n-sequences", "64"]
    code, out, err = interrupted(argv, delay=delay)
    assert code == 130 and err == ["interrupted"], err


# --- Ctrl-C and SIGTERM as a terminal and `timeout` send them: to every process of the group ------


def live_members(group: int, within: float = 5.0) -> list[str]:
    """The processes of process group `group` still running (zombies aside) once they have had
    `within` seconds to end: '(pid) command'. A process killed a moment ago is still exiting on a
    busy machine (its state not yet Z), and is not one the command left behind."""
    deadline = time.monotonic() + within
    while (found := _running(group)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def _running(group: int) -> list[str]:
    """The processes of process group `group` running now (zombies aside): '(pid) command'."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, rest = stat.read_text().split(" ", 1)
        except OSError:  # ended meanwhile
            continue
        fields = rest.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        if int(fields[2]) == group and fields[0] != "Z":  # proc(5): state, ppid, pgrp
            found.append(f"({pid}) {rest.split(')', 1)[0][1:]}")
    return found


@pytest.fixture
def scratch():
    """A TMPDIR of the command's own, short: the rank server's socket lies in a folder made in it,
    and a socket's path has at most 107 bytes (pytest's tmp_path is too deep for that)."""
    folder = Path(tempfile.mkdtemp(prefix="mhsa-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def temporary_leftovers(folder: Path) -> list[str]:
    """What multiprocessing left in `folder`, the TMPDIR of a command that has ended: its temporary
    folders (pymp-*, the rank server's socket) go with an ordinary exit and with an interrupted one."""
    return sorted(path.name for path in folder.glob("pymp-*"))


def signalled_group(argv, signum, wait_for, scratch):
    """Start argv as the leader of a process group of its own (TMPDIR `scratch`), send `signum` to
    the whole group once `wait_for` appears on its stdout, and return (returncode, stderr, the
    group's processes still running a moment after it ended)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(scratch)}
    child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        seen = ""
        while wait_for not in seen:
            line = child.stdout.readline()
            assert line, f"{wait_for!r} never appeared: {child.stderr.read()}"
            seen += line
        os.killpg(child.pid, signum)
        _, err = child.communicate(timeout=120)
        return child.returncode, err, live_members(child.pid)
    finally:
        child.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "name, dp, signum",
    [(name, 2, signal.SIGINT) for name in names("dp")]
    + [(names("dp")[0], 2, signal.SIGTERM), (names("train")[0], 1, signal.SIGINT), (names("train")[0], 1, signal.SIGTERM)],
    ids=lambda value: getattr(value, "name", str(value)),
)
def test_a_signal_to_the_whole_group_keeps_the_last_complete_epoch_in_one_line_and_leaves_no_process(tmp_path, scratch, name, dp, signum):
    path = tmp_path / "run.safetensors"
    argv = [sys.executable, "-m", f"{package(name)}.train", *SMALL_RUN, "--dp", str(dp), "--epochs", "100000", "--save", str(path)]
    code, err, left = signalled_group(argv, signum, wait_for="epoch 2/", scratch=scratch)
    by = "" if signum == signal.SIGINT else " by SIGTERM"
    saved = re.fullmatch(
        rf"interrupted{by} in epoch (\d+)/100000: saved epoch (\d+) \(step (\d+)\) to {re.escape(str(path))} and \S+ "
        rf"\(--resume {re.escape(str(path))} continues it\)\n",
        err,
    )
    assert code == 128 + signum and saved is not None, (code, err)
    assert left == [], f"still running after the command ended: {left}"
    assert temporary_leftovers(scratch) == []
    _, state = checkpoint.load(path)
    kept = int(saved.group(2))
    assert kept >= 1 and state.epochs_done == kept and state.step == int(saved.group(3)) == kept * STEPS_PER_EPOCH
    if signum != signal.SIGINT:  # the pair is saved by the one code path whichever signal stopped the run: resumed once, after Ctrl-C
        return
    # the resumed run in a fresh process too, as a user starts it: JAX fixes its device count when this
    # process first uses it (an earlier in-process test's one CPU device), and --dp 2 needs two
    resume = ["--quiet", *SMALL_RUN, "--dp", str(dp), "--epochs", str(kept + 1), "--resume", str(path), "--history", "h.json"]
    resumed = subprocess.run([sys.executable, "-m", f"{package(name)}.train", *resume], cwd=tmp_path, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    history = History.load(tmp_path / "h.json")
    assert history.first_step == kept * STEPS_PER_EPOCH and len(history.losses) == STEPS_PER_EPOCH


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("section", ["parity [1/", "parity [2/", "parity [4/"])
def test_ctrl_c_to_the_group_of_mhsa_parity_prints_one_line_exits_130_at_once_and_leaves_no_process(section, scratch):
    # its progress is written to a terminal only: stderr is one (a pseudo-terminal), and the Ctrl-C
    # lands as the section starts, while other lanes compile, train and run the torch ranks and their server
    leader, follower = os.openpty()
    argv = [sys.executable, "-m", "mhsa.parity", "--epochs", "2"]
    env = {**os.environ, "TMPDIR": str(scratch)}
    child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=follower, start_new_session=True, env=env)
    os.close(follower)
    try:
        seen = b""
        while section.encode() not in seen:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: every writer has closed it
                chunk = b""
            assert chunk, f"{section!r} never appeared: {seen.decode(errors='replace')}"
            seen += chunk
        os.killpg(child.pid, signal.SIGINT)
        sent = time.monotonic()
        child.wait(timeout=60)
        seconds = time.monotonic() - sent
        rest = b""
        with contextlib.suppress(OSError):  # EIO once every writer has closed it
            while select.select([leader], [], [], 1.0)[0] and (chunk := os.read(leader, 4096)):
                rest += chunk
        left = live_members(child.pid)
    finally:
        os.close(leader)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
    after = [line.strip() for line in rest.decode(errors="replace").replace("\r", "\n").splitlines()]
    after = [line for line in after if line and not line.startswith("parity [")]
    # the last section's line is shown once its rows are awaited, which may be when they are done: there, a
    # Ctrl-C landing after the work exits as the finished command (status 0, nothing on stderr), never with a traceback
    totals = {int(total) for total in re.findall(r"parity \[\d+/(\d+)\]", (seen + rest).decode(errors="replace"))}
    endings = [(130, ["interrupted"])] + [(0, [])] * (totals == {int(section.split("[")[1].rstrip("/"))})
    assert (child.returncode, after) in endings, (child.returncode, after)
    assert seconds < 15, f"exited {seconds:.1f} s after the Ctrl-C"
    assert left == [], f"still running after the command ended: {left}"
    assert temporary_leftovers(scratch) == []


A_RANK_BEING_STARTED = """
import multiprocessing, signal, threading, time
from multiprocessing import forkserver
from mhsa.cli import leave_busy_threads

multiprocessing.set_start_method("forkserver")
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as torch_impl.parallel.prepare starts the server
forkserver.ensure_running()
signal.signal(signal.SIGINT, signal.default_int_handler)
sent = threading.Event()

def launch():  # a lane starting a rank: the server has forked it, its process object is not sent yet
    forkserver._forkserver.connect_to_new_process([])
    sent.set()
    time.sleep(60)

threading.Thread(target=launch).start()
sent.wait()
time.sleep(0.5)
leave_busy_threads(130)
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the server's ranks are found in /proc")
def test_an_interrupted_command_ends_the_rank_a_lane_is_starting_before_it_can_print_a_traceback():
    # the rank would read its process object from a process that is gone: an EOFError's traceback
    # on the terminal, after the command's one line (a data-parallel lane of mhsa parity starts ranks so)
    child = subprocess.Popen(
        [sys.executable, "-c", A_RANK_BEING_STARTED], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = child.communicate(timeout=60)  # until every process holding the pipes has ended
        assert (child.returncode, out, err) == (130, "", "")
        assert live_members(child.pid) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
