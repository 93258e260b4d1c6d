"""The `--train` factories of docs/port-check.md (examples/train_pair.py): the faithful AdamW port
agrees at every one of the guide's 20 steps; the port left at optax.adamw's default weight decay
parts at step 1, at the update (its forward pass and gradients agree), and the optimizer lint
names the setting."""

import pytest

from examples import train_pair
from mhsa.port_check.report.training import format_train_report
from mhsa.port_check.training.check import check_training


@pytest.mark.slow  # 20 steps of both trainings, each in float32 and float64
def test_the_guides_faithful_adamw_pair_agrees_at_every_one_of_20_steps():
    report = check_training(train_pair.torch_adamw(), train_pair.flax_adamw(), 20)
    text = format_train_report(report)
    assert report.passed and not report.lint and not report.config_lint, text
    assert len(report.summaries) == 20 and all(summary.failing == 0 for summary in report.summaries), text


@pytest.mark.slow  # both trainings, each in float32 and float64
def test_optax_adamws_default_weight_decay_parts_at_the_first_update_and_the_lint_names_it():
    report = check_training(train_pair.torch_adamw(), train_pair.flax_adamw_default_decay(), 2)
    text = format_train_report(report)
    first = report.first_failure
    assert first is not None and first.step == 1 and first.kind == "param", text
    assert report.forward is not None and report.forward.first_failure is None, text
    assert not any(row.kind in ("loss", "grad") and not row.passed for row in report.rows if row.step == 1), text
    assert [(finding.setting, finding.optax, finding.extra) for finding in report.lint] == [("adamw default", 1e-4, 0.01)], text
