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
from mhsa.port_check.report.findings import line
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


# what a report on a port that changes the model's shape must say besides PASS: how the transform
# table read its kernels, or how an output was read, or why no row is missing
TRANSFORMED = {
    "heads": "  transform: blocks.0.attn.in_proj_weight (72, 24) -> blocks.0.attn.query.kernel, blocks.0.attn.key.kernel, "
    "blocks.0.attn.value.kernel: split in 3 along its first axis, each transposed and reshaped to (24, 4, 6)",
    "heads_equinox": "  modules under other names in equinox: blocks.0.attn.out_proj -> blocks.0.attn.output_proj",
    "fused": "  transform: blocks.0.attn.qkv.weight (72, 24) -> blocks.0.attn.qkv.kernel: transposed and reshaped to (24, 3, 4, 6)",
    "vae": "| attn.group_norm ",
    "lstm": "  transform: lstm.bias_ih_l0, lstm.bias_hh_l0 -> lstm.layers.0.cell.hi.bias, lstm.layers.0.cell.hf.bias, "
    "lstm.layers.0.cell.hg.bias, lstm.layers.0.cell.ho.bias: summed, split in 4 along its first axis",
    "lstm_equinox": "  transform: lstm.bias_ih_l0, lstm.bias_hh_l0 -> lstm.layers.0.bias: summed",
    "lstm_no_bias_equinox": "| lstm[0] ",
    "gru_equinox": "  transform: gru.bias_ih_l0, gru.bias_hh_l0 -> gru.layers.0.bias, gru.layers.0.bias_n: as torch's GRU biases",
    "gru_no_bias_equinox": "| gru[0] ",
    "gpt2_scan": "  transform: transformer.h.{i}.attn.c_proj.weight (20, 20) -> transformer.h.attn.c_proj.weight[{i}] for each of the 3 layers: "
    "transposed, stacked on its first axis",
    "gpt2_scan_split": "| transformer.h.2.attn.c_proj ",
    "gpt2_scan_grouped": "transformer.h.3 -> transformer.h[1].layers_1",
    "gpt2_scan_remat": "| transformer.h.1.mlp.c_fc ",
    "gpt2_scan_linen": "| transformer.h.2.ln_2 ",
}
SHAPED_MODES = [("converted", "float32", True), ("fresh", "float64", True), ("converted", "float32", False), ("fresh", "float64", False)]


@pytest.mark.parametrize(("name", "kind", "dtype", "grads"), first_fast([(name, *mode) for mode in SHAPED_MODES for name in catalog.SHAPED]))
def test_port_check_passes_every_port_that_changes_the_models_shape(name, kind, dtype, grads):
    pair = catalog.SHAPED[name]
    (reference, x), (port, y) = catalog.build(pair.reference), catalog.build(pair.port if kind == "converted" else pair.fresh)
    report = check_port(reference, port, x, target_inputs=y, dtype=dtype, grads=grads)
    text = format_report(report)
    assert report.passed and not report.transfer.reference_left, text
    assert WEIGHTS[kind] in text and TRANSFORMED[name] in text, f"{name} ({kind}) does not say {TRANSFORMED[name]!r}:\n{text}"
    assert text.splitlines()[-1].startswith(f"PASS: {len(report.transfer.paired)} of {len(report.transfer.paired)} parameters paired"), text
    if grads:  # a gradient row for every parameter of the reference, whatever group holds it
        assert {row.name for row in report.rows if row.section == "gradient"} == set(report.transfer.paired), text


@pytest.mark.parametrize("name", first_fast(list(catalog.SHAPED_BUGS)))
def test_port_check_names_every_bug_planted_in_a_port_that_changes_the_models_shape(name):
    bug = catalog.SHAPED_BUGS[name]
    (reference, x), (port, y) = catalog.build(bug.reference), catalog.build(bug.port, dtype=bug.dtype)
    report = check_port(reference, port, x, target_inputs=y, dtype=bug.dtype, grads=bug.section == "gradient", probes=False)
    assert not report.passed and survey.names(report, bug), format_report(report)


def test_a_gru_cell_without_room_for_b_hn_is_named_by_the_lint():
    bug = catalog.SHAPED_BUGS["gru_cell_without_b_hn"]
    (reference, x), (port, y) = catalog.build(bug.reference), catalog.build(bug.port)
    report = check_port(reference, port, x, target_inputs=y, probes=False)  # b_hn is zero: the outputs agree, with a warning
    assert report.passed and [line(finding, report.sides) for finding in report.lint] == [
        "gru: jax has no room for torch's b_hn (the last third of each bias_hh) (its GRU cell has no bias inside r * (W_hn h + b_hn)): "
        "copied it is lost, and its gradient is 0 there"
    ], format_report(report)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(catalog.TRAINED))
def test_the_shaped_pairs_train_alike_through_three_steps_and_summed_biases_part_at_once(name):
    reference, port, parts = catalog.TRAINED[name]
    report = check_training(catalog.build(reference), catalog.build(port), 3, probes=False)
    text = format_train_report(report)
    if not parts:
        assert report.passed, text
        return
    assert report.first_failure is not None and report.first_failure.step == parts, text
    assert "held as one array in jax" in text and "the trainings part there" in text, text
