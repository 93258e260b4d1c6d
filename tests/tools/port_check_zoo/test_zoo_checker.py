"""`mhsa port-check` on the zoo: PASS on every faithful pair with gradients, with our converter's
weights in float32 (every row held to K times the reference's own error) and as a fresh port whose
weights it transfers in float64 (the fixed 1e-10 family), and every planted bug named where the
table says (examples/zoo/catalog.py). The keyword pair (the Llama pair called with keyword
arguments) runs once: the property it adds is the keywords. `python -m examples.zoo.survey`
runs every pair and bug in both dtypes."""

import optax
import pytest

from examples.zoo import catalog, llama_train, survey
from mhsa.port_check import check_port, format_report
from mhsa.port_check.report.training import format_train_report
from mhsa.port_check.training.check import check_training


def first_fast(cases):
    """The first case in make test, the property checked once there; every other one in the slow
    tier (make test-slow): each pair builds and compiles its own models."""
    return [pytest.param(*case, marks=[] if n == 0 else [pytest.mark.slow]) for n, case in enumerate(cases)]


@pytest.mark.parametrize(("name", "dtype"), first_fast([(name, "float32") for name in catalog.FAITHFUL]))
def test_port_check_passes_every_faithful_pair_with_its_converted_weights_and_gradients(name, dtype):
    pair = catalog.FAITHFUL[name]
    (reference, x), (port, y) = catalog.build(pair.reference), catalog.build(pair.port)
    report = check_port(reference, port, x, target_inputs=y, dtype=dtype, grads=True)
    assert report.passed, format_report(report)


@pytest.mark.parametrize(("name", "dtype"), first_fast([(name, "float64") for name in catalog.FAITHFUL if name != "llama_keywords"]))
def test_port_check_passes_every_fresh_port_once_it_has_the_references_weights(name, dtype):
    pair = catalog.FAITHFUL[name]
    (reference, x), (port, y) = catalog.build(pair.reference), catalog.build(pair.fresh)
    report = check_port(reference, port, x, target_inputs=y, dtype=dtype, grads=True)
    assert report.passed, format_report(report)


@pytest.mark.parametrize(("name", "dtype"), first_fast([(name, "float64") for name in catalog.BUGS]))
def test_port_check_names_every_planted_bug_where_the_models_part(name, dtype):
    bug = catalog.BUGS[name]
    (reference, x), (port, y) = catalog.build(bug.reference), catalog.build(bug.port)
    report = check_port(reference, port, x, target_inputs=y, dtype=dtype, grads=bug.section == "gradient", probes=False)
    # a setting that no output shows on the batch is named by the lint, as a warning: the check passes
    assert report.passed is (bug.section == "lint") and survey.names(report, bug), format_report(report)


@pytest.mark.slow
def test_the_llama_pair_trains_alike_through_the_check_and_a_port_without_the_clip_parts_at_step_1():
    # examples/zoo/llama_train.py: the zoo's faithful Llama pair with AdamW and clipping, the
    # factories of `mhsa port-check --train` and of benchmarks/port_check_train.py
    report = check_training(llama_train.reference(), llama_train.port(), 3, probes=False)
    assert report.passed, format_train_report(report)
    port = llama_train.port()
    port["optimizer"] = optax.adamw(llama_train.LR, b1=llama_train.BETAS[0], b2=llama_train.BETAS[1], weight_decay=llama_train.WEIGHT_DECAY)
    report = check_training(llama_train.reference(), port, 3, probes=False)
    assert report.first_failure is not None and report.first_failure.step == 1, format_train_report(report)
