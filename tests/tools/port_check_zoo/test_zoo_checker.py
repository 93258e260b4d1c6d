"""`mhsa port-check` on the zoo: PASS on every faithful pair (float32 and float64, with gradients;
with our converter's weights, and as a fresh port whose weights it transfers), and every planted
bug named where the table says (examples/zoo/catalog.py)."""

import pytest

from examples.zoo import catalog, survey
from mhsa.port_check import check_port, format_report


@pytest.mark.parametrize(("name", "dtype"), [(n, d) for n in catalog.FAITHFUL for d in ("float32", "float64")])
def test_port_check_passes_every_faithful_pair_with_its_converted_weights_and_gradients(name, dtype):
    pair = catalog.FAITHFUL[name]
    (reference, x), (port, y) = catalog.build(pair.reference), catalog.build(pair.port)
    report = check_port(reference, port, x, target_inputs=y, dtype=dtype, grads=True)
    assert report.passed, format_report(report)


@pytest.mark.parametrize(("name", "dtype"), [(n, "float64") for n in catalog.FAITHFUL])
def test_port_check_passes_every_fresh_port_once_it_has_the_references_weights(name, dtype):
    pair = catalog.FAITHFUL[name]
    (reference, x), (port, y) = catalog.build(pair.reference), catalog.build(pair.fresh)
    report = check_port(reference, port, x, target_inputs=y, dtype=dtype, grads=True)
    assert report.passed, format_report(report)


@pytest.mark.parametrize(("name", "dtype"), [(n, "float64") for n in catalog.BUGS])
def test_port_check_names_every_planted_bug_where_the_models_part(name, dtype):
    bug = catalog.BUGS[name]
    (reference, x), (port, y) = catalog.build(bug.reference), catalog.build(bug.port)
    report = check_port(reference, port, x, target_inputs=y, dtype=dtype, grads=bug.section == "gradient", probes=False)
    assert not report.passed and survey.names(report, bug), format_report(report)
