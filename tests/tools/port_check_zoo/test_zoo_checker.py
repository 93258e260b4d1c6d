"""`mhsa port-check` on the zoo: PASS on every faithful pair (float32 and float64, with gradients;
with our converter's weights, and as a fresh port whose weights it transfers), and every planted
bug named where the table says (examples/zoo/catalog.py). These are the checker's tests; the cases
today's checker gets wrong are marked xfail with the reason (issue 28), so that each fix shows up
as an XPASS to promote."""

import pytest

from examples.zoo import catalog, survey
from mhsa.port_check import check_port, format_report

WIDTH = "issue 28.1: a (1, T, D) position embedding against (B, T, D) is reported as a shape, inf"
GRADS = "issue 28.2: --grads on a dataclass output: AttributeError: 'int' object has no attribute 'backward'"
KEYWORDS = "issue 28.2: keyword inputs (a dict) reach torch as one object array: TypeError"
SAME = "lint: padding=1 vs 'SAME' (3x3, stride 1) and padding=0 vs 'VALID' are equal, and reported as differences"
TRANSFER = "issue 28.4: the default transfer overwrites the port's weights, and with them the converter's bug"
F32_GRAD = "a fixed 1e-5 on float32 gradients of 20 to 100 (rounding alone: ~2e-7 relative): 1.9e-5 in Llama, 3.8e-5 in GPT-2"
THEN = "; once that is fixed (main at 26fa9f8): "
# where the checker of this branch is wrong: (pair or bug, dtype) -> why; the port helper's fixes on main
# (26fa9f8) turn every case but the four float32 ones with gradients into an XPASS
TODAY = {
    ("llama", "float32"): F32_GRAD,
    ("llama_keywords", "float32"): KEYWORDS + THEN + F32_GRAD,
    ("llama_keywords", "float64"): KEYWORDS,
    ("gpt2", "float32"): GRADS + THEN + F32_GRAD,
    ("gpt2", "float64"): GRADS,
    ("gpt2_linen", "float32"): GRADS + THEN + F32_GRAD,
    ("gpt2_linen", "float64"): GRADS,
    ("vit", "float32"): SAME,
    ("vit", "float64"): SAME,
    ("transposed_square_kernel", "float64"): TRANSFER,
    ("layernorm_eps", "float64"): WIDTH,
    ("layernorm_eps_linen", "float64"): WIDTH,
    ("gelu_erf", "float64"): WIDTH,
    ("attention_scale", "float64"): WIDTH,
    ("conv1d_transposed", "float64"): WIDTH,
    ("untied_embeddings_grads", "float64"): GRADS,
    ("conv_kernel_transposed", "float64"): TRANSFER,
    ("batchnorm_stats_not_loaded", "float64"): TRANSFER,
}
FRESH = {"llama_keywords": KEYWORDS, "gpt2": GRADS, "gpt2_linen": GRADS, "vit": SAME}


def cases(names, dtypes, known):
    return [
        pytest.param(name, dtype, marks=[pytest.mark.xfail(strict=False, reason=known[name, dtype])] if (name, dtype) in known else [])
        for name in names
        for dtype in dtypes
    ]


@pytest.mark.parametrize(("name", "dtype"), cases(catalog.FAITHFUL, ["float32", "float64"], TODAY))
def test_port_check_passes_every_faithful_pair_with_its_converted_weights_and_gradients(name, dtype):
    pair = catalog.FAITHFUL[name]
    (reference, x), (port, y) = catalog.build(pair.reference), catalog.build(pair.port)
    report = check_port(reference, port, x, target_inputs=y, dtype=dtype, grads=True)
    assert report.passed, format_report(report)


@pytest.mark.parametrize(("name", "dtype"), cases(catalog.FAITHFUL, ["float64"], {(name, "float64"): why for name, why in FRESH.items()}))
def test_port_check_passes_every_fresh_port_once_it_has_the_references_weights(name, dtype):
    pair = catalog.FAITHFUL[name]
    (reference, x), (port, y) = catalog.build(pair.reference), catalog.build(pair.fresh)
    report = check_port(reference, port, x, target_inputs=y, dtype=dtype, grads=True)
    assert report.passed, format_report(report)


@pytest.mark.parametrize(("name", "dtype"), cases(catalog.BUGS, ["float64"], TODAY))
def test_port_check_names_every_planted_bug_where_the_models_part(name, dtype):
    bug = catalog.BUGS[name]
    (reference, x), (port, y) = catalog.build(bug.reference), catalog.build(bug.port)
    report = check_port(reference, port, x, target_inputs=y, dtype=dtype, grads=bug.section == "gradient", probes=False)
    assert not report.passed and survey.names(report, bug), format_report(report)
