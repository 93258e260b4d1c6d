"""Parity's trainings row: the torch and jax trainers, each as its training_setup gives train()'s
run, compared by the port check through training (mhsa.port_check.training.check) at every step;
the row passes for the project's own trainers in both dtypes and names the first step and tensor
where a planted difference makes them part."""

import dataclasses

import pytest

from mhsa import registry
from mhsa.parity.report import build_report, format_report
from mhsa.parity.rows import Report, pair_key, pairs
from mhsa.parity.table import verdict
from mhsa.parity.trajectory import checked_pairs, compare_trainings, training_row
from mhsa.port_check.core.findings import OptimizerDifference
from shared import weights
from shared.config import TrainConfig
from shared.tolerances import K, tolerance
from tests.backends import SMALL
from tests.tiers import first_fast
from tests.tools.test_parity import one_torch_thread  # noqa: F401  (its autouse fixture: torch at one thread, as `mhsa parity` runs it)

# 2 epochs of 8 steps, the last batch of each 2 sequences of 5: a batch of another shape on the way
TRAIN = TrainConfig(epochs=2, batch_size=5, n_sequences=37, seed=4)
STEPS = TRAIN.epochs * TRAIN.steps_per_epoch
PAIRS = pytest.mark.parametrize("a, b", checked_pairs(), ids=[pair_key(a, b) for a, b in checked_pairs()])
DTYPES = pytest.mark.parametrize("dtype", first_fast(["float32", "float64"]))


def trainings(a: str, b: str, dtype: str, steps: int = STEPS):
    report = compare_trainings(a, b, SMALL, dataclasses.replace(TRAIN, dtype=dtype), steps)
    return report, training_row(a, b, report, STEPS)


def test_the_pair_checked_is_torch_against_jax():
    # the training check takes a torch reference and a Flax port: the registry's order gives them so
    assert checked_pairs() == [("torch", "jax")]
    assert all("train" in registry.get(name).supports for name in registry.names("train_check"))


@PAIRS
@DTYPES
@pytest.mark.slow  # each pair trained; the trainers agree step by step in tests/implementations/test_train.py too
def test_the_projects_trainers_agree_at_every_step_in_the_trainings_row(a, b, dtype):
    report, row = trainings(a, b, dtype)
    assert row.passed, format_report(Report("trainings", [row]))
    # every step compared: the loss, a gradient, both Adam moments and the parameter of every parameter
    assert [summary.step for summary in report.summaries] == list(range(1, STEPS + 1))
    assert all(summary.compared == 1 + 4 * len(weights.param_shapes(SMALL)) for summary in report.summaries)
    # only the pair's own column, holding the value closest to its tolerance (on real numbers)
    assert {key: gap is None for key, gap in row.diffs.items()} == {pair_key(*pair): pair != (a, b) for pair in pairs()}
    worst = max((summary.worst for summary in report.summaries), key=lambda r: r.abs_diff / r.tol)
    assert (row.diffs[pair_key(a, b)], row.tol, row.step, row.at) == (worst.abs_diff, worst.tol, worst.step - 1, worst.label)
    assert 0 < worst.abs_diff <= worst.tol
    assert row.name == f"trainings at each of {STEPS} steps"
    text = format_report(Report("trainings", [row]), width=None)  # one line per row and note: the wrapping is test_parity_width.py's
    assert f"(at step {row.step}: {row.at})" in text and "as `mhsa port-check --train` compares them" in text
    if dtype == "float64":  # fixed, docs/DESIGN.md's float64 trajectory tolerance, and the table's note for it
        assert row.tol == tolerance("trajectory", "float64") and "holds docs/DESIGN.md's fixed tolerance" in text
    else:  # derived from the two trainers' own errors (its note), not numpy's: that column stays empty
        # (not held under the fixed float32 tolerance: qkv_proj's key bias has a gradient of rounding
        # noise alone, which Adam scales to whole steps, so its own errors depend on how XLA multiplies)
        assert worst.reference_error is not None and worst.port_error is not None and row.reference_error is None
        assert worst.tol >= K * max(worst.reference_error, worst.port_error)
        assert report.tolerance_note.startswith("tolerance: ") and report.tolerance_note in text and "fixed tolerance" not in text


@PAIRS
def test_each_trainer_is_checked_as_its_train_runs(a, b):
    # the check's float32 losses are the real trainers': torch's bit for bit (both step
    # train.new_optimizer's torch.optim.Adam), jax's step compiled alone rather than scanned, within rounding
    report, _ = trainings(a, b, "float32")
    for index, name in enumerate((a, b)):
        run = registry.get(name).train.train(SMALL, TRAIN).losses
        checked = [summary.losses[index] for summary in report.summaries]
        if registry.get(name).framework == "torch":
            assert checked == run
        else:
            assert max(abs(x - y) for x, y in zip(checked, run)) < 1e-5


@DTYPES
def test_a_planted_b2_in_jax_parts_the_trainings_at_the_first_step_and_moment(monkeypatch, dtype):
    import jax_impl.compiled
    import jax_impl.train

    def b2_099(model, train_config):
        return jax_impl.compiled.zeros_optimizer(model, dataclasses.replace(train_config, betas=(train_config.betas[0], 0.99)))

    monkeypatch.setattr(jax_impl.train, "new_optimizer", b2_099)
    _, row = trainings("torch", "jax", dtype, steps=3)
    assert not row.passed and row.failing_pair() == "torch-jax"
    # the loss and the gradients of step 0 agree; Adam's second moment, (1 - b2) g^2, is the first to part
    # (mhsa parity runs the check without the lint's probes: the moments name the setting's effect)
    assert row.name.endswith(", the trainings part at step 0: exp_avg_sq tok_emb.weight (optax nu)")
    assert verdict(row, lambda key: key).startswith(f"torch-jax {row.diffs['torch-jax']:.2e} > ")


@DTYPES
def test_a_planted_loss_in_jax_parts_the_trainings_at_the_first_loss(monkeypatch, patched_jax, dtype):
    import jax_impl.model

    cross_entropy = jax_impl.model.cross_entropy
    monkeypatch.setattr(jax_impl.model, "cross_entropy", lambda logits, targets: cross_entropy(logits, targets) * (1 + 1e-4))
    _, row = trainings("torch", "jax", dtype, steps=2)
    assert not row.passed and row.name.endswith(", the trainings part at step 0: loss")
    assert row.problems == ()  # the optimizers are the same: only the steps tell


def test_a_setting_the_lint_finds_different_fails_the_row_whose_steps_agree():
    report, row = trainings("torch", "jax", "float64", steps=1)
    assert row.passed
    report.lint.append(OptimizerDifference("b1", 0.9, 0.8))  # planted
    row = training_row("torch", "jax", report, STEPS)
    assert not row.passed and row.failing_pair() is None
    assert verdict(row, lambda key: key) == "b1: torch betas[0]=0.9, optax b1=0.8"
    assert "| FAIL" in format_report(Report("trainings", [row]))


@pytest.mark.slow  # a whole parity report: trainings of every trainer
def test_a_report_with_a_planted_b2_marks_the_trainings_row_where_the_implementations_part(monkeypatch):
    import jax_impl.compiled
    import jax_impl.train

    def b2_099(model, train_config):
        return jax_impl.compiled.zeros_optimizer(model, dataclasses.replace(train_config, betas=(train_config.betas[0], 0.99)))

    monkeypatch.setattr(jax_impl.train, "new_optimizer", b2_099)
    report = build_report(SMALL, "float32", seed=3, epochs=1, samples=1, decode=False)
    first = report.first_failure
    # the loss rows see jax's real trainer part from numpy's a few steps in; the trainings row, first, names step 0 and the moment
    assert first is not None and first.name.endswith(", the trainings part at step 0: exp_avg_sq tok_emb.weight (optax nu)"), format_report(report)
    loss = next(row for row in report.rows if row.name.startswith("loss at each of"))
    assert not loss.passed and loss.step > 0
    assert "FAIL: first difference at trajectory 'trainings at each of" in format_report(report)
