"""The port check reads an Equinox port as it reads a Flax one (readers/equinox/): parameters under
torch's names and layouts, a model called per example under jax.vmap unless it says it takes the
batch, every submodule call captured in call order (a layer called twice, or assigned twice, kept
apart), gradients, float64, derived tolerances, the lint and the probes naming planted bugs; no
class changed by a run, even one that raises; without equinox, one line that says how to install it."""

import subprocess
import sys

import jax
import numpy as np
import optax
import pytest
import torch

pytest.importorskip("equinox")
import equinox as eqx  # noqa: E402

from examples import equinox_block, torch_block  # noqa: E402
from mhsa.cli import main as mhsa  # noqa: E402
from mhsa.port_check import PortCheckError, check_port  # noqa: E402
from mhsa.port_check.core import cotangents  # noqa: E402
from mhsa.port_check.core.findings import LintDifference  # noqa: E402
from mhsa.port_check.core.structure import as_inputs  # noqa: E402
from mhsa.port_check.readers import reader_of  # noqa: E402
from mhsa.port_check.readers.equinox import reader, record  # noqa: E402
from mhsa.port_check.readers.protocol import ModuleInfo  # noqa: E402
from tests.paths import ROOT  # noqa: E402
from tests.tools.port_check import equinox_models as em  # noqa: E402
from tests.tools.port_check import models  # noqa: E402

M = "tests.tools.port_check.equinox_models"


def test_an_equinox_model_is_read_by_the_equinox_reader():
    side, found = reader_of(em.EqxMLP())
    assert side == "equinox" and found is reader


def test_parameters_carry_the_torch_reference_names_and_shapes():
    torch.manual_seed(0)
    expected = {name: tuple(value.shape) for name, value in models.TorchMLP().state_dict().items()}
    assert {name: value.shape for name, value in reader.parameters(em.EqxMLP()).items()} == expected


def test_a_conv_bias_is_torch_shaped_out_and_back_and_its_settings_are_torch_conventions():
    conv = eqx.nn.Conv2d(2, 5, (3, 1), stride=(2, 1), padding=1, key=jax.random.key(0))
    params = reader.parameters(conv)
    assert {name: value.shape for name, value in params.items()} == {"weight": (5, 2, 3, 1), "bias": (5,)}  # OIHW, as torch's
    loaded = reader.load_parameters(conv, {"bias": np.arange(5.0, dtype=np.float32)})
    assert loaded.bias.shape == (5, 1, 1) and np.array_equal(np.asarray(loaded.bias).ravel(), np.arange(5.0))
    settings = reader.describe(conv, as_inputs(()))[""].settings
    assert settings == {"bias": True, "stride": (2, 1), "padding": ((1, 1), (1, 1)), "dilation": (1, 1), "groups": 1, "kernel_size": (3, 1)}


def test_describe_reads_linear_bias_layernorm_eps_and_the_gelu_lambda_in_torch_words():
    described = reader.describe(em.EqxMLP(eps=1e-6, approximate=True, bias=False), as_inputs(()))
    assert {path: (info.kind, info.settings) for path, info in described.items()} == {
        "": ("EqxMLP", {}),
        "norm": ("LayerNorm", {"eps": 1e-6, "bias": True}),
        "fc1": ("Linear", {"bias": False}),
        "act": ("GELU", {"approximate": "tanh"}),
        "fc2": ("Linear", {"bias": True}),
    }


def test_the_probes_switches_give_new_models_with_one_setting_changed_and_the_original_untouched():
    model, x = em.EqxMLP(eps=1e-6, approximate=True), em.inputs()
    eps = reader.switched(model, "eps", "norm", 1e-5)
    gelu = reader.switched(model, "approximate", "act", "none")
    assert reader.describe(eps, as_inputs(()))["norm"].settings["eps"] == 1e-5
    assert reader.describe(gelu, as_inputs(()))["act"].settings == {"approximate": "none"}
    assert reader.describe(model, as_inputs(()))["norm"].settings["eps"] == 1e-6 and model.act.fn.keywords == {"approximate": True}
    faithful = reader.run(em.EqxMLP(), as_inputs(x))[0][-1].value
    both = reader.run(reader.switched(eps, "approximate", "act", "none"), as_inputs(x))[0][-1].value
    np.testing.assert_allclose(both, faithful, rtol=1e-6, atol=1e-6)
    square = em.EqxMLP(hidden=em.D)
    transposed = reader.switched(square, "transpose", "fc1")
    np.testing.assert_array_equal(transposed.fc1.weight, np.asarray(square.fc1.weight).T)
    assert reader.switched(model, "transpose", "fc1") is None  # (48, 24): a transpose cannot fit
    conv = eqx.nn.Conv1d(2, 3, 3, key=jax.random.key(0))
    assert reader.switched(conv, "padding", "", ((1, 1),)).padding == ((1, 1),) and conv.padding == ((0, 0),)


def test_token_ids_go_per_example_to_an_embedding_and_its_table_is_a_torch_weight():
    model = eqx.nn.Embedding(models.V, em.D, key=jax.random.key(0))

    class Lookup(eqx.Module):
        wte: eqx.nn.Embedding

        def __call__(self, ids):  # (T,) -> (T, D)
            return jax.vmap(self.wte)(ids)

    ids = models.token_ids()
    outputs = reader.run(Lookup(model), as_inputs(ids))[0]
    assert [(output.path, output.shape) for output in outputs] == [("wte", (3, 5, 24)), ("", (3, 5, 24))]
    np.testing.assert_array_equal(outputs[-1].value, np.asarray(model.weight)[ids])
    assert {name: value.shape for name, value in reader.parameters(Lookup(model)).items()} == {"wte.weight": (models.V, em.D)}
    assert reader.describe(Lookup(model), as_inputs(()))["wte"] == ModuleInfo("Embedding", {"padding_idx": None})


def test_an_array_assigned_twice_is_one_parameter_tied_under_its_second_name():
    model = em.Twice()
    assert sorted(reader.parameters(model)) == ["fc.bias", "fc.weight"]
    assert reader.tied(model) == {"again.weight": "fc.weight", "again.bias": "fc.bias"}
    loaded = reader.load_parameters(model, {"fc.bias": np.ones(em.D, np.float32)})
    assert np.array_equal(loaded.fc.bias, np.ones(em.D)) and np.array_equal(loaded.again.bias, np.ones(em.D))  # both places


def test_a_layer_called_twice_and_assigned_twice_gives_one_row_per_call_under_its_first_path():
    model, x = em.Twice(), em.inputs()
    outputs = reader.run(model, as_inputs(x))[0]
    assert [(output.call, output.path, output.shape) for output in outputs] == [(0, "fc", (3, 5, 24)), (1, "fc", (3, 5, 24)), (2, "", (3, 5, 24))]
    weight, bias = np.asarray(model.fc.weight), np.asarray(model.fc.bias)
    first = x @ weight.T + bias
    np.testing.assert_allclose(outputs[0].value, first, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outputs[1].value, np.maximum(first, 0) @ weight.T + bias, rtol=1e-5, atol=1e-5)


def test_a_model_is_called_per_example_unless_it_says_it_takes_the_batch():
    x = em.inputs()
    summed = reader.run(em.SumOverFirstAxis(), as_inputs(x))[0]  # per example: x.sum(axis=0) sums the T positions
    assert [(output.path, output.shape) for output in summed] == [("proj", (3, 24)), ("", (3, 24))]
    model = em.SumOverFirstAxis()
    np.testing.assert_allclose(summed[-1].value, x.sum(axis=1) @ np.asarray(model.proj.weight).T + np.asarray(model.proj.bias), rtol=1e-5, atol=1e-5)
    assert not reader.batched(em.EqxMLP()) and reader.batched(em.BatchedMLP())
    for said in (1, "yes", None):  # not a yes or no: refused, not taken as per example
        with pytest.raises(PortCheckError, match=rf"^SaysAmbiguously.port_check_batched = {said!r}: expected True .* or False "):
            reader.batched(type("SaysAmbiguously", (em.EqxMLP,), {"port_check_batched": said})())
    per_example = reader.run(em.EqxMLP(), as_inputs(x))[0]
    whole = reader.run(em.BatchedMLP(), as_inputs(x))[0]  # the same weights, called once on (B, T, D)
    assert [(output.path, output.shape) for output in whole] == [(output.path, output.shape) for output in per_example]
    for a, b in zip(per_example, whole):
        np.testing.assert_allclose(a.value, b.value, rtol=1e-6, atol=1e-6)


def test_calls_inside_a_jit_of_the_model_are_rows_and_inside_a_scan_only_the_caller_is():
    x = em.inputs()
    jitted = reader.run(em.Jitted(), as_inputs(x))[0]
    plain = reader.run(em.EqxMLP(), as_inputs(x))[0]
    assert [(output.path, output.shape) for output in jitted] == [(output.path, output.shape) for output in plain]
    for a, b in zip(jitted, plain):
        np.testing.assert_allclose(a.value, b.value, rtol=1e-6, atol=1e-6)
    assert [(output.path, output.shape) for output in reader.run(em.Scanned(), as_inputs(x))[0]] == [("", (3, 5, 24))]
    _, grads = reader.run(em.Scanned(), as_inputs(x), cotangents.reference)  # through the scan, its marks the identity
    assert grads is not None
    assert sorted(grads) == ["fc.bias", "fc.weight"] and all(np.isfinite(value).all() and np.abs(value).max() > 0 for value in grads.values())


def test_outputs_inside_a_library_layer_s_own_vmaps_have_the_batch_axes_first():
    # eqx.nn.MultiheadAttention vmaps its projections itself: under the check's vmap over the batch,
    # the value XLA computes is (D, B, T); it is recorded as (B, T, D), as the torch twin returns it
    model, x = em.Attention(), em.inputs()
    outputs = {output.path: output for output in reader.run(model, as_inputs(x))[0]}
    assert [(path, output.shape) for path, output in outputs.items()][:3] == [
        ("mha.query_proj", (3, 5, 24)),
        ("mha.key_proj", (3, 5, 24)),
        ("mha.value_proj", (3, 5, 24)),
    ]
    np.testing.assert_allclose(outputs["mha.query_proj"].value, x @ np.asarray(model.mha.query_proj.weight).T, rtol=1e-5, atol=1e-5)
    assert outputs["mha.dropout"].shape == (3, em.H, 5, 5)  # the attention weights: (B, H, T, S)


def _class_attributes(model) -> dict:
    classes = {cls for _, module in record.walk(model) for cls in type(module).__mro__} | set(type(model).__mro__) | {record.Recorder}
    return {cls: dict(vars(cls)) for cls in classes}


def test_no_class_and_not_the_model_is_changed_by_a_run_even_one_that_raises():
    model = em.Raising()
    before, leaves = _class_attributes(model), jax.tree_util.tree_leaves(model)
    with pytest.raises(PortCheckError, match="RuntimeError: the port's code fails here"):
        check_port(em.torch_mlp()[0], model, em.inputs())
    assert _class_attributes(model) == before
    assert all(a is b for a, b in zip(jax.tree_util.tree_leaves(model), leaves))
    assert not any(isinstance(module, record.Recorder) for _, module in record.walk(model))


def test_a_stateful_model_is_refused_in_one_line_naming_its_stateful_layers():
    model, state = eqx.nn.make_with_state(em.Stateful)()
    jax.vmap(model, in_axes=(0, None), out_axes=(0, None))(em.inputs(), state)  # a model that runs, given its state
    with pytest.raises(PortCheckError) as refused:
        check_port(em.torch_mlp()[0], model, em.inputs())
    assert str(refused.value) == (
        "'bn' (BatchNorm) keeps its state in an eqx.nn.State, which the port check does not read yet: expected an Equinox model called without one"
    )


def test_without_equinox_an_equinox_model_is_refused_in_one_line_that_says_how_to_install_it(monkeypatch):
    model, _ = em.prebuilt()
    monkeypatch.setitem(sys.modules, "equinox", None)  # import equinox now fails, as where it is not installed
    with pytest.raises(PortCheckError) as refused:
        reader_of(model)
    assert str(refused.value) == 'the model is an Equinox module (EqxMLP) and equinox is not installed: pip install -e ".[equinox]"'


def test_without_equinox_the_command_says_how_to_install_it_and_exits_2(monkeypatch, capsys):
    em.prebuilt()  # built while equinox is there, the factory's result kept
    monkeypatch.setitem(sys.modules, "equinox", None)
    monkeypatch.delitem(sys.modules, "examples.equinox_block", raising=False)  # a user's port that imports equinox
    assert mhsa(["port-check", f"{M}:torch_mlp", f"{M}:prebuilt"]) == 2  # a model built while it was there
    assert mhsa(["port-check", "examples.torch_block:block", "examples.equinox_block:block"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        'mhsa port-check: error: the model is an Equinox module (EqxMLP) and equinox is not installed: pip install -e ".[equinox]"',
        "mhsa port-check: error: cannot load factory 'examples.equinox_block:block': import of equinox halted; None in sys.modules; "
        'equinox is an optional extra: pip install -e ".[equinox]"',
    ]


@pytest.mark.slow
def test_in_a_python_without_equinox_the_command_says_how_to_install_it(tmp_path):
    hide = "import sys; sys.modules['equinox'] = None; from mhsa.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", hide, "port-check", "examples.torch_block:block", "examples.equinox_block:block"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.splitlines() == [
        "mhsa port-check: error: cannot load factory 'examples.equinox_block:block': import of equinox halted; None in sys.modules; "
        'equinox is an optional extra: pip install -e ".[equinox]"'
    ]


# --- whole checks: under a second for the MLP, a few for the attention block (XLA compiles both sides) ---


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("pair", ["mlp", pytest.param("block", marks=pytest.mark.slow)])
def test_a_faithful_port_passes_with_gradients(pair, dtype):
    source, target = (em.torch_mlp()[0], em.EqxMLP()) if pair == "mlp" else (torch_block.block()[0], equinox_block.block()[0])
    report = check_port(source, target, em.inputs(), grads=True, dtype=dtype)
    assert report.passed and not report.lint, [(row.name, row.abs_diff, row.tol) for row in report.rows]
    outputs = [row.target_module for row in report.rows if row.section == "output"]
    grads = {row.name for row in report.rows if row.section == "gradient"}
    expected = (
        ["norm", "fc1", "act", "fc2", ""]
        if pair == "mlp"
        else ["ln1", "attn.qkv_proj", "attn.out_proj", "attn", "ln2", "mlp.fc1", "mlp.act", "mlp.fc2", "mlp.drop", "mlp", ""]
    )
    assert outputs == expected
    assert grads == set(reader.parameters(target))
    if dtype == "float32":  # tolerances derived from the reference's own float32 error
        assert all(row.reference_error is not None and 0 < row.reference_error < row.tol for row in report.rows)


def test_a_layer_called_twice_passes_against_its_torch_twin_with_the_gradient_of_both_uses():
    report = check_port(em.torch_twice()[0], em.Twice(), em.inputs(), grads=True)
    assert report.passed and {row.name for row in report.rows if row.section == "gradient"} == {"fc.weight", "fc.bias"}


def test_layernorm_eps_and_the_tanh_gelu_are_linted_and_the_eps_probe_closes_the_first_gap():
    report = check_port(em.torch_mlp()[0], em.EqxMLP(eps=1e-6, approximate=True), em.inputs())
    assert report.lint == [
        LintDifference("norm", "LayerNorm", "eps", 1e-5, 1e-6),
        LintDifference("act", "GELU", "approximate", "none", "tanh"),
    ]
    assert report.first_failure.name == "norm"
    closes = [(probe.switch.kind, probe.switch.path, probe.outcome) for probe in report.probes]
    assert ("eps", "norm", "closes") in closes


def test_the_tanh_gelu_alone_fails_first_at_the_gelu_row():
    report = check_port(em.torch_mlp()[0], em.EqxMLP(approximate=True), em.inputs())
    assert report.lint == [LintDifference("act", "GELU", "approximate", "none", "tanh")]
    assert report.first_failure.name == "act" and report.first_failure.kind == "GELU"


def test_a_missing_bias_is_linted_and_its_reference_parameter_stops_the_check():
    report = check_port(em.torch_mlp()[0], em.EqxMLP(bias=False), em.inputs())
    assert report.lint == [LintDifference("fc1", "Linear", "bias", True, False)]
    assert report.transfer.reference_left == ["fc1.bias"] and report.stopped and not report.rows


@pytest.mark.slow
def test_a_weight_converted_transposed_is_named_and_the_transpose_probe_closes_it():
    torch.manual_seed(0)
    source = models.TorchSquare()
    port = em.converted(source, em.EqxMLP(hidden=em.D), transpose="fc1")
    report = check_port(source, port, em.inputs(), transfer=False)
    assert [(differing.name, differing.how) for differing in report.transfer.differing] == [("fc1.weight", "holds its transpose")]
    assert report.first_failure.name == "fc1"
    assert [(probe.switch.kind, probe.switch.path, probe.outcome) for probe in report.probes] == [("transpose", "fc1", "closes")]


@pytest.mark.slow
def test_heads_split_the_wrong_way_fail_first_after_the_projection_inside_the_attention():
    report = check_port(torch_block.block()[0], em.swapped_heads_block(), em.inputs())
    assert not report.lint
    rows = {row.name: row for row in report.rows}
    assert rows["attn.qkv_proj"].passed and report.first_failure.name == "attn.out_proj"
    assert [(hint.kind, hint.before, hint.row, hint.path) for hint in report.hints] == [("enters", "attn.qkv_proj", "attn.out_proj", "attn")]


# --- the Equinox trainer (readers/equinox/training.py), run beside the torch one ---


def _trained(dtype: str, steps: int = 3):
    """(torch's StepRecords, the Equinox port's) for the attention block trained by AdamW from the same weights."""
    from examples import train_pair
    from mhsa.port_check.forward.check import transfer_weights
    from mhsa.port_check.readers.equinox import training as train_equinox
    from mhsa.port_check.readers.torch import training as train_torch
    from mhsa.port_check.training.check import check_setup

    reference = check_setup(train_pair.torch_adamw(), "reference")
    port = {"model": equinox_block.block()[0], "optimizer": optax.adamw(train_pair.LR, weight_decay=1e-2), "loss": train_pair.flax_loss}
    port |= {"inputs": train_pair.batches(), "model_inputs": 1}
    train_equinox.check_setup(port)
    ref = train_torch.Trainer(reference, dtype)
    port_model, _ = transfer_weights(ref.model, reader.cast(port["model"], dtype)[0])
    trainer = train_equinox.Trainer(port, port_model, dtype)
    batches = train_pair.batches()
    return [(ref.step(batch), trainer.step(batch)) for batch in batches[:steps]]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_equinox_trainer_follows_torch_adamw_step_by_step(dtype):
    # in float32 the parameters are left out: the key bias's gradient is 0 in exact arithmetic, and
    # Adam's first step turns its rounding into +-lr (the training check's derived tolerances know)
    tol = 2e-5 if dtype == "float32" else 1e-10
    for step, (ref, port) in enumerate(_trained(dtype), 1):
        assert abs(ref.loss - port.loss) <= tol * max(1.0, abs(ref.loss)), (step, ref.loss, port.loss)
        assert port.grads.keys() == ref.grads.keys() and port.params.keys() == ref.params.keys()
        for name in ref.grads:
            np.testing.assert_allclose(port.grads[name], ref.grads[name], atol=tol * 10, err_msg=f"step {step} grad {name}")
            if dtype == "float64":
                np.testing.assert_allclose(port.params[name], ref.params[name], atol=tol * 10, err_msg=f"step {step} {name}")
        assert {kind for kind, _ in port.moments} == {"exp_avg", "exp_avg_sq"}
        np.testing.assert_allclose(port.moments[("exp_avg", "mlp.fc1.weight")], ref.moments[("exp_avg", "mlp.fc1.weight")], atol=tol * 10)


@pytest.mark.slow
def test_the_equinox_probe_of_an_optimizer_reads_as_the_flax_one_of_the_same_block():
    from examples import flax_block
    from mhsa.port_check.readers.equinox import training as train_equinox
    from mhsa.port_check.readers.flax import training as train_flax

    setup = {"optimizer": optax.adamw(1e-2, weight_decay=1e-2)}
    scenarios = [(1.0, [0.5, -0.25]), (0.0, [1e-3])]
    port = reader.cast(equinox_block.block()[0], "float32")[0]  # Equinox creates float64 arrays where x64 is on
    ours, size = train_equinox.probe(setup, port, scenarios)
    theirs, flax_size = train_flax.probe(setup, flax_block.block()[0], scenarios)
    assert size == flax_size == sum(value.size for value in reader.parameters(equinox_block.block()[0]).values())
    assert ours == theirs and ours[0][0]["param"]["mlp.fc1.weight"] != 1.0


@pytest.mark.slow  # two trainings of each side, in float32 and float64
def test_train_checks_an_equinox_port_step_by_step_and_names_optaxs_default_weight_decay():
    from examples import train_pair
    from mhsa.port_check.report.training import format_train_report
    from mhsa.port_check.training.check import check_training

    port = {"model": equinox_block.block()[0], "optimizer": optax.adamw(train_pair.LR, weight_decay=1e-2), "loss": train_pair.flax_loss}
    port |= {"inputs": train_pair.batches(), "model_inputs": 1}
    faithful = check_training(train_pair.torch_adamw(), port, 3)
    assert faithful.passed and faithful.sides == ("torch", "equinox") and not faithful.lint, format_train_report(faithful)
    planted = check_training(train_pair.torch_adamw(), port | {"optimizer": optax.adamw(train_pair.LR)}, 2)
    assert not planted.passed and planted.first_failure.step == 1 and planted.first_failure.kind == "param", format_train_report(planted)
    assert [(finding.setting, finding.optax, finding.extra) for finding in planted.lint] == [("adamw default", 1e-4, 0.01)]
