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


class TorchDroppingMLP(torch.nn.Module):
    """fc1, GELU, Dropout, Identity, fc2: in eval mode the Dropout and the Identity pass their input on as it is."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(models.D, models.D), torch.nn.Linear(models.D, models.D)
        self.act, self.drop, self.keep = torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Identity()

    def forward(self, x):
        return self.fc2(self.keep(self.drop(self.act(self.fc1(x)))))


class NNXReluMLP(nnx.Module):
    def __init__(self):
        self.fc1, self.fc2 = nnx.Linear(models.D, models.D, rngs=nnx.Rngs(0)), nnx.Linear(models.D, models.D, rngs=nnx.Rngs(1))

    def __call__(self, x):
        return self.fc2(jax.nn.relu(self.fc1(x)))


def test_a_module_that_passes_its_input_on_as_it_is_is_no_hinted_cause():
    torch.manual_seed(0)
    report = check_port(TorchDroppingMLP().eval(), NNXReluMLP(), models.activations(), probes=False)
    assert report.first_failure.name == "fc2", format_report(report)
    assert [hint.path for hint in report.hints if hint.kind == "unmatched"] == ["act"], report.hints


class TorchBranches(torch.nn.Module):
    """Two branches, x through `fc_a` and t through `fc_t`, summed, normed, through `head`: `fc_t`
    runs between `fc_a` and `norm` in call order, and only `norm` is computed from both."""

    def __init__(self):
        super().__init__()
        self.fc_a, self.fc_t = torch.nn.Linear(models.D, models.D), torch.nn.Linear(models.D, models.D)
        self.norm, self.head = torch.nn.LayerNorm(models.D), torch.nn.Linear(models.D, models.D)

    def forward(self, x, t):
        return self.head(self.norm(self.fc_a(x) + self.fc_t(t)))


class NNXBranches(nnx.Module):
    def __init__(self):
        rngs = nnx.Rngs(0)
        self.fc_a, self.fc_t = nnx.Linear(models.D, models.D, rngs=rngs), nnx.Linear(models.D, models.D, rngs=rngs)
        self.norm, self.head = nnx.LayerNorm(models.D, epsilon=1e-5, rngs=rngs), nnx.Linear(models.D, models.D, rngs=rngs)

    def __call__(self, x, t):
        return self.head(self.norm(self.fc_a(x) + self.fc_t(t)))


def _branches(scale: float, transpose_head: bool):
    """The pair, the port holding the reference's weights but fc_a's kernel times `scale` and, if
    asked, head's kernel transposed."""
    from mhsa.port_check import copy_weights

    torch.manual_seed(0)
    reference, inputs = TorchBranches(), (models.activations()[:, 0], models.activations()[:, 1])
    port, _ = copy_weights(reference, NNXBranches(), inputs)
    port.fc_a.kernel[...] = port.fc_a.kernel[...] * scale
    if transpose_head:
        port.head.kernel[...] = port.head.kernel[...].T
    return check_port(reference, port, inputs, transfer=False, probes=False)


def test_a_growth_is_measured_against_the_outputs_an_output_is_computed_from_not_the_row_before_it():
    # the difference enters at fc_a and flows on through norm at its own size: fc_t, the row before
    # norm in call order, agrees, and is no measure of how norm's difference grew
    report = _branches(1.5, transpose_head=False)
    assert report.first_failure.name == "fc_a" and report.rows[1].name == "fc_t" and report.rows[1].passed, format_report(report)
    assert not any(hint.kind == "grows" for hint in report.hints), [line(hint, report.sides) for hint in report.hints]
    # a second cause, head's kernel transposed, grows the difference far beyond that of every output feeding it
    report = _branches(1.0001, transpose_head=True)
    grows = [hint for hint in report.hints if hint.kind == "grows"]
    assert [(hint.row, hint.before) for hint in grows] == [("head", "fc_a")], format_report(report)  # the largest of its inputs' differences
    assert line(grows[0], report.sides).endswith("a second cause may sit in 'head' or in the code that feeds it")
