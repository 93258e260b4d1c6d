"""`mhsa port-check`: the example pairs agree; the classic porting bugs, planted one at a time in
copies of them, are each named at the right module (and by the lint or a probe where that
applies); this project's TinyLM through the generic path reaches `mhsa parity`'s verdict."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import linen as nn
from flax import nnx

from examples import flax_block, torch_block
from examples.torch_block import D, H, T
from jax_impl.attention import MultiHeadSelfAttention
from mhsa.cli import main as mhsa
from mhsa.port_check import (
    PortCheckError,
    check_port,
    format_report,
    lint,
    map_name,
    transfer_weights,
)
from mhsa.port_check.core.findings import LintDifference, Switch
from mhsa.port_check.readers.flax import reader as jax_port
from mhsa.port_check.readers.protocol import ModuleInfo
from mhsa.port_check.report.findings import line
from tests.tiers import first_fast

OUTPUTS = ["ln1", "attn.qkv_proj", "attn.out_proj", "attn", "ln2", "mlp.fc1", "mlp.fc2", "mlp.drop", "mlp", "(model output)"]


def nnx_pair():
    return torch_block.block()[0], flax_block.block()[0], torch_block.example_inputs()


def outputs(report):
    return [row.name for row in report.rows if row.section == "output"]


def first(report):
    failure = report.first_failure
    assert failure is not None, format_report(report)
    return failure.name


@pytest.mark.parametrize("dtype", first_fast(["float32", "float64"]))
@pytest.mark.parametrize("port", first_fast(["block", "linen_block"]))
def test_the_example_pairs_agree_at_every_output_and_gradient(dtype, port):
    report = check_port(torch_block.block()[0], getattr(flax_block, port)()[0], torch_block.example_inputs(), dtype=dtype, grads=True)
    assert report.passed, format_report(report)
    assert outputs(report) == OUTPUTS
    assert [row.name for row in report.rows if row.section == "gradient"] == list(torch_block.block()[0].state_dict())
    assert len(report.transfer.paired) == 12 and not report.transfer.port_left
    assert report.unmatched_source == ["mlp.act"]  # the torch GELU module; Flax calls jax.nn.gelu inline
    assert all(row.abs_diff > 0 for row in report.rows[:3])  # real numbers from two frameworks, not one twice


def test_flax_layernorm_left_at_its_default_eps_is_named_by_the_lint_and_parts_in_float64():
    source, target, x = nnx_pair()
    target.ln2 = nnx.LayerNorm(D, rngs=nnx.Rngs(0))  # epsilon 1e-6, torch's 1e-5
    report = check_port(source, target, x, dtype="float64")
    assert LintDifference("ln2", "LayerNorm", "eps", 1e-5, 1e-6) in report.lint, report.lint
    assert first(report) == "ln2"
    assert any(probe.switch == Switch("eps", "ln2", 1e-5, 1e-6) and probe.outcome == "closes" and probe.moves_to is None for probe in report.probes)
    # a difference the numbers of this batch hide is named by the lint, as a warning: no output shows it
    target.ln2 = nnx.LayerNorm(D, epsilon=1.0001e-5, rngs=nnx.Rngs(0))
    hidden = check_port(source, target, x, dtype="float32")
    assert hidden.first_failure is None and hidden.passed and len(hidden.lint) == 1
    assert "; warning: 1 setting(s) differ (lint above) that no output shows on this batch" in format_report(hidden)


class TanhMLP(flax_block.MLP):
    def __call__(self, x):
        return self.drop(self.fc2(jax.nn.gelu(self.fc1(x))))  # jax.nn.gelu's default: the tanh approximation


def test_gelu_tanh_instead_of_erf_parts_at_the_layer_after_it_and_names_the_gelu():
    source, target, x = nnx_pair()
    target.mlp = TanhMLP(D, rngs=nnx.Rngs(0))
    report = check_port(source, target, x)
    assert first(report) == "mlp.fc2"
    assert [row.name for row in report.rows if row.passed][-1] == "mlp.fc1"
    # the torch GELU switched to tanh closes the gap: that probe is the evidence, the hints retire
    assert [(probe.switch, probe.outcome, probe.row, probe.moves_to) for probe in report.probes] == [
        (Switch("approximate", "mlp.act", "tanh"), "closes", "mlp.fc2", None)
    ]
    assert [line(probe, report.sides) for probe in report.probes] == [  # the sentence a probe prints
        "probe: 'mlp.act' (GELU, no counterpart in jax) switched to approximate='tanh' in torch: closes the gap at 'mlp.fc2' "
        f"({report.first_failure.abs_diff:.2e} -> {report.probes[0].after:.2e}); every output then agrees"
    ]
    assert report.hints == []


def test_a_square_kernel_copied_without_transposing_is_named_by_the_weights_and_the_transpose_probe():
    source, target, x = nnx_pair()
    jax_port.load_parameters(
        target,
        jax_port.parameters(target)
        | {name: value for name, value in source.state_dict().items() if name != "attn.out_proj.weight"}
        | {"attn.qkv_proj.weight": source.state_dict()["attn.qkv_proj.weight"].numpy()},
    )
    # the planted bug: a hand-written copy that forgets the transpose of one (D, D) kernel
    target.attn.out_proj.kernel[...] = jnp.asarray(source.attn.out_proj.weight.detach().numpy())
    report = check_port(source, target, x)  # the port holds converted weights: checked as it is by default
    assert not report.transfer.copied
    assert [(difference.name, difference.how) for difference in report.transfer.differing] == [("attn.out_proj.weight", "holds its transpose")]
    assert first(report) == "attn.out_proj"
    closing = [probe for probe in report.probes if probe.outcome == "closes" and probe.moves_to is None]
    assert [probe.switch for probe in closing] == [Switch("transpose", "attn.out_proj")], report.probes


def test_dropout_left_active_is_named_by_the_lint_and_at_the_dropout():
    source, target, x = nnx_pair()
    target.mlp.drop = nnx.Dropout(0.1, deterministic=False, rngs=nnx.Rngs(1))
    report = check_port(source, target, x)
    assert LintDifference("mlp.drop", "Dropout", "active", False, True) in report.lint
    assert "mlp.drop: Dropout active in jax only (train mode in torch / deterministic=False in Flax)" in [line(f, report.sides) for f in report.lint]
    assert first(report) == "mlp.drop"


class PlantedAttention(MultiHeadSelfAttention):
    """A copy of jax_impl's explicit attention with one bug planted by name (none by default)."""

    def __call__(self, x):
        B, T, D = x.shape
        q, k, v = jnp.split(self.qkv_proj(x), 3, axis=-1)  # 3 x (B, T, D)
        if self.bug == "split":  # (B, T, d_head, H): the head split in the wrong order
            q, k, v = (t.reshape(B, T, self.d_head, self.n_heads).swapaxes(-1, -2) for t in (q, k, v))
        else:
            q, k, v = (t.reshape(B, T, self.n_heads, self.d_head) for t in (q, k, v))  # (B, T, H, d_head)
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))  # (B, H, T, d_head)
        scores = (q / math.sqrt(self.d_head)) @ k.swapaxes(-2, -1)  # (B, H, T, T)
        scores = jnp.where(self.causal_mask[:T, :T], scores, -jnp.inf)
        weights = jax.nn.softmax(scores, axis=-2 if self.bug == "softmax" else -1)  # (B, H, T, T)
        context = weights @ v  # (B, H, T, d_head)
        return self.out_proj(context.transpose(0, 2, 1, 3).reshape(B, T, D))  # (B, T, D)


@pytest.mark.parametrize("bug", ["", *first_fast(["split", "softmax"])])
def test_a_head_split_in_the_wrong_order_or_a_softmax_over_the_wrong_axis_parts_inside_attn(bug):
    source, target, x = nnx_pair()
    target.attn = PlantedAttention(D, H, T, rngs=nnx.Rngs(0))
    target.attn.bug = bug
    report = check_port(source, target, x)
    if not bug:  # the copy itself is right: what fails below is the planted line
        assert report.passed, format_report(report)
        return
    assert first(report) == "attn.out_proj"
    assert [row.name for row in report.rows if row.passed][-1] == "attn.qkv_proj"
    assert any(hint.kind == "enters" and hint.path == "attn" for hint in report.hints), report.hints
    assert not report.lint


def test_a_missing_bias_stops_the_check_named_by_the_lint_and_the_transfer_report():
    source, target, x = nnx_pair()
    target.mlp.fc1 = nnx.Linear(D, 4 * D, use_bias=False, rngs=nnx.Rngs(0))
    report = check_port(source, target, x)  # the reference's bias has nowhere to go: no verdict on the other 11
    assert LintDifference("mlp.fc1", "Linear", "bias", True, False) in report.lint
    assert report.transfer.reference_left == ["mlp.fc1.bias"] and report.stopped and not report.rows
    text = format_report(report)
    assert "  mlp.fc1: Linear bias in torch only" in text and "  paired with none of jax's: mlp.fc1.bias" in text, text


class LinenDefaultEps(flax_block.LinenBlock):
    def setup(self):
        self.ln1 = nn.LayerNorm(epsilon=1e-5)
        self.attn = flax_block.LinenAttention(self.d_model, self.n_heads)
        self.ln2 = nn.LayerNorm()  # Flax's default epsilon 1e-6
        self.mlp = flax_block.LinenMLP(self.d_model)


def test_linen_ports_are_linted_and_compared_too():
    module, x = LinenDefaultEps(), torch_block.example_inputs()
    report = check_port(torch_block.block()[0], (module, module.init(jax.random.key(0), x)), x, dtype="float64")
    assert LintDifference("ln2", "LayerNorm", "eps", 1e-5, 1e-6) in report.lint
    assert first(report) == "ln2"
    # a Linen module's settings are frozen fields: the probe runs a clone of it with torch's eps
    assert [(probe.switch, probe.outcome, probe.moves_to) for probe in report.probes] == [(Switch("eps", "ln2", 1e-5, 1e-6), "closes", None)]


def test_names_that_do_not_correspond_are_matched_through_a_name_map():
    class Renamed(flax_block.Block):
        def __init__(self, *, rngs):
            super().__init__(rngs=rngs)
            self.ffn = flax_block.MLP(D, rngs=rngs)
            del self.mlp

        def __call__(self, x):
            x = x + self.attn(self.ln1(x))  # (B, T, D)
            return x + self.ffn(self.ln2(x))  # (B, T, D)

    source, x = torch_block.block()
    target = Renamed(rngs=nnx.Rngs(0))
    unmapped = check_port(source, target, x)  # one module renamed, its layers' call order, types and shapes leaving one choice
    assert unmapped.passed and unmapped.transfer.renamed == {"mlp": "ffn"} and unmapped.name_map == {"mlp": "ffn"}, format_report(unmapped)
    assert "  modules under other names in jax: mlp -> ffn" in format_report(unmapped)
    report = check_port(source, target, x, name_map={"mlp": "ffn"})
    assert report.passed and not report.transfer.renamed, format_report(report)
    assert map_name("mlp.fc1[0]", {"mlp": "ffn", "m": "x"}) == "ffn.fc1[0]" and map_name("mlps.a", {"mlp": "ffn"}) == "mlps.a"


class RawMatmul(nnx.Module):  # a hand-rolled layer: weight (in, out) used as x @ weight
    def __init__(self, width=7):
        self.proj = nnx.Module()
        self.proj.weight = nnx.Param(jnp.zeros((D, width)))

    def __call__(self, x):
        return x @ self.proj.weight


def test_a_hand_rolled_layer_whose_weight_fits_only_transposed_is_copied_transposed_and_says_so():
    source = torch.nn.Module()
    source.proj = torch.nn.Linear(D, 7, bias=False)
    target, report = transfer_weights(source, RawMatmul())
    assert [(group.reference, group.port, group.words()) for group in report.groups] == [(("proj.weight",), ("proj.weight",), "transposed")]
    assert not report.transposed_only
    assert report.layouts == [
        "Linear in torch / Module in jax: 2-d weights taken transposed ('proj.weight' (7, 24) fits 'proj.weight' (24, 7) only so)"
    ]
    np.testing.assert_array_equal(np.asarray(target.proj.weight[...]), source.proj.weight.detach().numpy().T)
    source.proj = torch.nn.Linear(D, 7)  # a bias the port has no room for: nothing is copied, and it is said why
    with pytest.raises(PortCheckError, match=r"^1 parameter of the reference \(torch\) pairs with none of the port's \(jax\): proj.bias$"):
        transfer_weights(source, RawMatmul())


def test_a_standard_layer_that_fits_only_transposed_is_named_and_not_copied():
    source = torch.nn.Module()
    source.proj = torch.nn.Linear(D, 7)
    port = nnx.Module()
    port.proj = nnx.Linear(7, D, rngs=nnx.Rngs(0))  # built the wrong way round
    with pytest.raises(PortCheckError) as refused:
        transfer_weights(source, port, copy=True)
    assert "1 parameter of standard layers fit only transposed (is the port's layer built with its sizes swapped?): 'proj.weight' (7, 24)" in str(
        refused.value
    )
    assert "'proj.bias' (7,) vs 'proj.bias' (24,)" in str(refused.value)


def test_conv_kernels_are_laid_out_and_outputs_compared_channels_last():
    source = torch.nn.Conv1d(4, 6, 3, padding=1)
    target = nnx.Conv(4, 6, (3,), padding=1, rngs=nnx.Rngs(0))
    x = np.random.default_rng(0).standard_normal((3, 4, 9)).astype(np.float32)  # (B, C, L) for torch
    report = check_port(source, target, x, target_inputs=x.transpose(0, 2, 1), dtype="float64")
    assert report.passed, format_report(report)
    assert report.rows[0].note == "compared channels-last"


def test_batchnorm_momentum_and_conv_settings_are_compared_in_one_convention():
    source = {"bn": ModuleInfo("BatchNorm", {"eps": 1e-5, "momentum": 0.1}), "conv": ModuleInfo("Conv", {"stride": (2,)})}
    torch_bn = ModuleInfo("BatchNorm", jax_port._settings(nnx.BatchNorm(4, rngs=nnx.Rngs(0))))
    assert torch_bn.settings["momentum"] == pytest.approx(0.01)  # Flax's default 0.99 in torch's convention
    findings = lint(source, {"bn": torch_bn, "conv": ModuleInfo("Conv", {"stride": (1,)})})
    assert findings == [
        LintDifference("bn", "BatchNorm", "momentum", 0.1, torch_bn.settings["momentum"]),
        LintDifference("conv", "Conv", "stride", (2,), (1,)),
    ]
    assert [line(finding, ("torch", "jax")) for finding in findings] == [  # the sentences the lint prints
        "bn: BatchNorm momentum 0.1 in torch, 0.01 in jax in torch's convention (jax's own setting 0.99: torch weighs the new batch "
        "by momentum, Flax and Equinox the running statistics; torch's 0.1 is their 0.9)",
        "conv: Conv stride (2,) in torch, (1,) in jax",
    ]


def test_capture_patches_no_class_while_it_runs_nor_after_even_when_the_model_raises():
    during = []

    class Broken(nnx.Module):
        def __init__(self):
            self.fc = nnx.Linear(D, D, rngs=nnx.Rngs(0))

        def __call__(self, x):
            during.append((nnx.Linear.__dict__["__call__"], Broken.__dict__["__call__"]))
            raise RuntimeError(f"planted failure after {self.fc(x).shape}")

    originals = nnx.Linear.__dict__["__call__"], Broken.__dict__["__call__"]
    model = Broken()
    with pytest.raises(RuntimeError, match="planted failure"):
        jax_port.run(model, (torch_block.example_inputs(),))
    assert during and set(during) == {originals}  # the classes' own __call__ while the model ran
    assert (nnx.Linear.__dict__["__call__"], Broken.__dict__["__call__"]) == originals
    assert type(model) is Broken and type(model.fc) is nnx.Linear  # the user's instances untouched


def planted_eps():
    """A factory for the command-line test: the NNX block with Flax's default LayerNorm eps."""
    model, x = flax_block.block()
    model.ln1 = nnx.LayerNorm(D, rngs=nnx.Rngs(0))
    return model, x


@pytest.mark.slow  # the command, twice: models built, transferred and run
def test_the_command_exits_0_on_the_example_pair_and_1_on_a_planted_bug(capsys, tmp_path):
    assert mhsa(["port-check", "examples.torch_block:block", "examples.flax_block:block", "--dtype", "float64", "--grads"]) == 0
    assert "PASS: 12 of 12 parameters paired, all 22 comparisons (10 outputs)" in capsys.readouterr().out
    assert mhsa(["port-check", "examples.torch_block:block", "tests.tools.port_check.test_examples:planted_eps", "--dtype", "float64"]) == 1
    out = capsys.readouterr().out
    assert "| ln1 " in out and "<- the models part here" in out.split("| ln1 ")[1].splitlines()[0]
    assert "FAIL: the models part at output 'ln1' (LayerNorm)" in out
    name_map = tmp_path / "map.json"
    name_map.write_text(json.dumps({"mlp": "mlp"}))
    np.save(tmp_path / "x.npy", torch_block.example_inputs(1))
    assert (
        mhsa(
            [
                "port-check",
                "examples.torch_block:block",
                "examples.flax_block:linen_block",
                "--inputs",
                str(tmp_path / "x.npy"),
                "--map",
                str(name_map),
            ]
        )
        == 0
    )


def test_the_command_names_a_bad_factory_in_one_line(capsys):
    assert mhsa(["port-check", "examples.torch_block", "examples.flax_block:block"]) == 2
    err = capsys.readouterr().err
    assert err == "mhsa port-check: error: factory must be package.module:function; got 'examples.torch_block'\n", err


@pytest.mark.parametrize("fault", first_fast([False, True]), ids=["clean", "softmax-over-queries"])
def test_tinylm_through_the_generic_path_reaches_the_parity_verdict_stage_for_stage(fault, monkeypatch, patched_jax):
    from mhsa.parity.stages import stage_and_gradient_rows

    if fault:  # planted in jax_impl's real block, so both tools run the same broken code
        softmax = nnx.softmax
        monkeypatch.setattr(nnx, "softmax", lambda x, axis=-1: softmax(x, axis=-2))
    from examples.flax_block import tinylm as jax_tinylm
    from examples.torch_block import TINY
    from examples.torch_block import tinylm as torch_tinylm

    source, tokens = torch_tinylm()
    report = check_port(source, jax_tinylm()[0], tokens, dtype="float32", probes=False)
    parity = {row.name: row.diffs["torch-jax"] <= row.tol for row in stage_and_gradient_rows(TINY, "float32", 0, samples=1) if row.section == "stage"}
    generic = {row.name: row.passed for row in report.rows}
    both = {"qkv": "attn.qkv_proj", "attn_out": "attn.out_proj", "logits": "lm_head"}
    assert {stage: parity[stage] for stage in both} == {stage: generic[name] for stage, name in both.items()}
    assert report.passed is (not fault) and all(parity.values()) is (not fault)
    if fault:
        assert first(report) == "attn.out_proj" and parity["qkv"] and not parity["weights"]


class TwiceTorch(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(D, D)

    def forward(self, x):
        return self.fc(torch.tanh(self.fc(x)))  # one layer called twice


class TwiceFlax(nnx.Module):
    def __init__(self, bug=False):
        self.fc = nnx.Linear(D, D, rngs=nnx.Rngs(0))
        self.bug = bug

    def __call__(self, x):
        hidden = self.fc(x)
        return self.fc(jax.nn.relu(hidden) if self.bug else jnp.tanh(hidden))


@pytest.mark.parametrize("bug", [False, True])
def test_a_module_called_twice_is_compared_per_call(bug):
    report = check_port(TwiceTorch(), TwiceFlax(bug), torch_block.example_inputs(), probes=False)
    assert outputs(report) == ["fc (call 1)", "fc (call 2)", "(model output)"]
    assert [row.passed for row in report.rows] == [True, not bug, not bug]


def test_a_first_port_with_flax_defaults_gets_both_of_its_bugs_named():
    report = check_port(torch_block.block()[0], flax_block.naive_block()[0], torch_block.example_inputs())
    assert [finding.path for finding in report.lint] == ["ln1", "ln2"] and first(report) == "ln1"
    # each cause closed by its own probe, in the order they act; the GELU hides behind the eps
    assert [(probe.switch, probe.outcome) for probe in report.probes] == [
        (Switch("eps", "ln1", 1e-5, 1e-6), "closes"),
        (Switch("eps", "ln2", 1e-5, 1e-6), "closes"),
        (Switch("approximate", "mlp.act", "tanh"), "closes"),
    ]
    assert report.probes[-1].moves_to is None and report.hints == []


def test_a_model_that_reads_values_in_python_is_captured_eagerly():
    class ReadsValues(nnx.Module):
        def __init__(self):
            self.fc = nnx.Linear(D, D, rngs=nnx.Rngs(0))

        def __call__(self, x):
            hidden = self.fc(x)
            return hidden if float(hidden.sum()) > -1e9 else -hidden  # fails under jit

    calls = jax_port.run(ReadsValues(), (torch_block.example_inputs(),))[0]
    assert [output.path for output in calls] == ["fc", ""] and calls[0].value.shape == (3, T, D)


def test_the_map_and_inputs_files_are_read_like_every_other_file(tmp_path, capsys):
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    pickled = tmp_path / "objects.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"PK\x03\x04 not really a zip")
    factories = ["examples.torch_block:block", "examples.flax_block:block"]
    for flag, path, message in [
        ("--map", fifo, "is a FIFO, expected a regular file"),  # refused at once, never a hang
        ("--map", deep, "is not a JSON object of names to names"),
        ("--inputs", fifo, "is a FIFO, expected a regular file"),
        ("--inputs", pickled, "is not a .npy or .npz file of arrays"),  # never unpickled
        ("--inputs", garbage, "is not a .npy or .npz file of arrays"),
    ]:
        assert mhsa(["port-check", *factories, flag, str(path)]) == 2, (flag, path)
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and err.startswith("mhsa port-check: error: "), (flag, path, err)
