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
from tests.tiers import first_fast

# what a faithful pair's report says besides PASS, {(pair, "converted" or "fresh"): lines}: the
# encoder-decoder's converter leaves a variable nothing reads, its one embedding module is used by
# both stacks, and torch scales the embedding inside the module where Flax scales after it
SAYS = {
    ("seq2seq", "converted"): (
        "note: 1 variable(s) of the port (jax) are never read by its forward pass, and not checked: 'encoder.embed_tokens.",
        "note: tied in torch: encoder.embed_tokens.weight is shared.weight, decoder.embed_tokens.weight is shared.weight",
    ),
    ("seq2seq", "fresh"): ("note: tied in torch: encoder.embed_tokens.weight is shared.weight, decoder.embed_tokens.weight is shared.weight",),
}
SPLIT = {"seq2seq": ("note: 'split' at 'shared (call 1)': differs (the port's is the reference's scaled by 0.235702 (1/sqrt(18)))",)}
# whose weights the check takes: a converted port's as they are, a fresh port's copied from the
# reference (a table both sides build alike, the conv pair's sinusoids, is no evidence of either)
WEIGHTS = {"converted": "  the port holds converted weights", "fresh": "  a fresh port: none of the"}


def _checked(name: str, kind: str, dtype: str, grads: bool) -> None:
    pair = catalog.FAITHFUL[name]
    (reference, x), (port, y) = catalog.build(pair.reference), catalog.build(pair.port if kind == "converted" else pair.fresh)
    report = check_port(reference, port, x, target_inputs=y, dtype=dtype, grads=grads)
    text = format_report(report)
    assert report.passed, text
    lines = text.splitlines()
    for expected in (WEIGHTS[kind], *SAYS.get((name, kind), ()), *SPLIT.get(name, ())):
        assert any(line.startswith(expected) for line in lines), f"{name} ({kind}) does not say {expected!r}:\n{text}"
    assert ("split at another module boundary" in lines[-1]) is (name in SPLIT), lines[-1]


@pytest.mark.parametrize(("name", "dtype"), first_fast([(name, "float32") for name in catalog.FAITHFUL]))
def test_port_check_passes_every_faithful_pair_with_its_converted_weights_and_gradients(name, dtype):
    _checked(name, "converted", dtype, grads=True)


@pytest.mark.parametrize(("name", "dtype"), first_fast([(name, "float64") for name in catalog.FAITHFUL if name != "llama_keywords"]))
def test_port_check_passes_every_fresh_port_once_it_has_the_references_weights(name, dtype):
    _checked(name, "fresh", dtype, grads=True)


@pytest.mark.parametrize(
    ("name", "kind", "dtype"),
    first_fast(
        [("seq2seq", "converted", "float32"), ("seq2seq", "fresh", "float64"), ("convnet", "converted", "float32"), ("convnet", "fresh", "float64")]
    ),
)
def test_port_check_passes_the_pairs_of_real_architectures_defects_without_gradients_too(name, kind, dtype):
    # a shared embedding, a final LayerNorm at init, C = H = W, a scaled embedding, a weight-normed
    # conv, a deterministic table: each alike with and without gradients
    _checked(name, kind, dtype, grads=False)


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
