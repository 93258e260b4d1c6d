"""Hints follow the evidence.

Probes only switch what runs at or before the first failing row (for an eps bug in the norm, no
transpose of a later square layer), and a probe that closes the gap there retires every other
hint and probe about that row (no GELU hint once the eps explains the difference). Without a
closing probe, the hints stay."""

import jax
import torch
from flax import nnx

from examples import flax_block, torch_block
from mhsa.port_check import check_port, format_report
from mhsa.port_check.core.findings import Hint, Switch
from mhsa.port_check.report.findings import line
from tests.tools.port_check import models


def test_an_eps_bug_is_probed_at_the_norm_only_and_its_probe_retires_every_other_hint():
    torch.manual_seed(0)
    report = check_port(models.TorchSquare(), models.NNXMLP(hidden=models.D, eps=1e-6), models.activations(), dtype="float64")
    assert report.first_failure.name == "norm", format_report(report)
    assert not any(probe.switch.kind == "transpose" for probe in report.probes), report.probes  # fc1 runs after the norm
    assert [(probe.switch, probe.outcome) for probe in report.probes] == [(Switch("eps", "norm", 1e-5, 1e-6), "closes")]
    assert report.hints == [], report.hints  # no GELU hint: the eps explains the whole difference


def test_probes_touch_nothing_after_the_first_failing_row():
    torch.manual_seed(0)
    port = models.NNXMLP(hidden=models.D)
    port.norm = nnx.GroupNorm(models.D, num_groups=2, epsilon=1e-5, rngs=nnx.Rngs(0))  # another norm: nothing a probe switches explains it
    report = check_port(models.TorchSquare(), port, models.activations())
    assert report.first_failure.name == "norm", format_report(report)
    failing_later = [row.name for row in report.rows if not row.passed and row.kind == "Linear"]
    assert "fc1" in failing_later  # square, failing, and after the norm: not probed
    assert report.probes and not any(probe.switch.path == "fc1" for probe in report.probes), report.probes


def test_a_closing_probe_retires_the_hint_about_its_row():
    source, x = torch_block.block()
    port = flax_block.block()[0]
    port.ln2 = nnx.LayerNorm(torch_block.D, rngs=nnx.Rngs(0))  # Flax's default eps
    report = check_port(source, port, x, dtype="float64")
    assert report.first_failure.name == "ln2" and report.hints == [], report.hints
    assert report.probes[0].outcome == "closes" and report.probes[0].moves_to is None


class ReluMLP(flax_block.MLP):
    def __call__(self, x):
        return self.drop(self.fc2(jax.nn.relu(self.fc1(x))))  # neither GELU: no probe closes


def test_without_a_closing_probe_the_hints_stay():
    source, x = torch_block.block()
    port = flax_block.block()[0]
    port.mlp = ReluMLP(torch_block.D, rngs=nnx.Rngs(0))
    report = check_port(source, port, x)
    assert report.first_failure.name == "mlp.fc2"
    gelu = Hint("unmatched", "mlp.fc2", path="mlp.act", module_kind="GELU", settings=(("approximate", "none"),))
    assert gelu in report.hints, report.hints
    assert line(gelu, report.sides).startswith("'mlp.act' (GELU: approximate='none') ran in torch just before 'mlp.fc2'")  # its sentence
    assert all(probe.outcome == "open" for probe in report.probes), report.probes
