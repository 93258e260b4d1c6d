"""Names that do not correspond: paired without a map wherever conventions, call order, layer
types and shapes leave one choice (Linen's `blocks_0` for torch's `blocks.0`, a module renamed),
and the report says which; where they leave several choices, or none, the check stops (exit 2)
naming the parameters, never comparing against the port's own random weights. --write-map writes
the map the check paired by (atomically, never over an input and only into a regular file), and
the check passes with it as it did without."""

import json
import os

import torch

from mhsa.cli import main as mhsa
from mhsa.port_check import check_port, format_report
from tests.tools.port_check import library_models as lib
from tests.tools.port_check import models
from tests.tools.port_check.test_library_models import TwoScales

FACTORIES = ["tests.tools.port_check.models:torch_named", "tests.tools.port_check.models:flax_renamed"]
RENAMED = {"norm": "ln", "fc1": "dense1", "fc2": "dense2"}


def test_renamed_modules_pair_by_call_order_and_shapes_and_the_report_says_which():
    torch.manual_seed(0)
    report = check_port(models.TorchNamed(), models.FlaxRenamed(), models.activations())
    assert report.passed and report.transfer.renamed == RENAMED and report.name_map == RENAMED, format_report(report)
    assert [row.name for row in report.rows][:2] == ["norm", "fc1"] and report.rows[0].target == "ln"
    assert "  modules under other names in jax: norm -> ln, fc1 -> dense1, fc2 -> dense2" in format_report(report)
    mapped = check_port(models.TorchNamed(), models.FlaxRenamed(), models.activations(), name_map=RENAMED)
    assert mapped.passed and not mapped.transfer.renamed, format_report(mapped)


def test_a_linen_list_of_blocks_pairs_by_the_list_index_convention():
    torch.manual_seed(0)
    report = check_port(models.TorchStack(), models.linen(models.LinenStack()), models.activations())
    assert report.passed and report.transfer.renamed == {"blocks.0": "blocks_0", "blocks.1": "blocks_1"}, format_report(report)
    assert {row.name for row in report.rows} >= {"blocks.0", "blocks.1"}  # the blocks' own outputs, paired through the convention


def test_when_nothing_can_be_paired_the_check_stops_naming_the_parameters_and_the_advice_to_write_a_map():
    report = check_port(models.TorchNamed(), models.FlaxOneLayer(), models.activations())
    assert not report.rows and not report.passed
    assert report.stopped.startswith("6 parameters of the reference (torch) pair with none of the port's (jax): norm.weight, norm.bias")
    assert "give it with --map FILE" in format_report(report).splitlines()[-1]


def test_a_choice_structure_leaves_open_stops_with_the_candidates_and_no_map_is_written_for_it(tmp_path, capsys, monkeypatch):
    def two_scales():
        port = lib.FlaxWeightNormed()
        port.norm = TwoScales()
        return port, lib.sequences()

    monkeypatch.setattr(lib, "two_scales", two_scales, raising=False)
    monkeypatch.setattr(lib, "weight_normed", lambda: (lib.TorchWeightNormed().eval(), lib.sequences()), raising=False)
    written = tmp_path / "map.json"
    argv = ["port-check", "tests.tools.port_check.library_models:weight_normed", "tests.tools.port_check.library_models:two_scales"]
    assert mhsa([*argv, "--write-map", str(written)]) == 2
    out = capsys.readouterr().out
    assert "  could pair several ways: norm.weight -> norm.gamma or norm.scale" in out
    assert f"no name map to write: every name corresponds as it is ({written} not written)" in out and not written.exists()


def test_the_command_writes_the_map_it_paired_by_and_passes_with_it(tmp_path, capsys):
    written = tmp_path / "map.json"
    assert mhsa(["port-check", *FACTORIES, "--write-map", str(written)]) == 0
    out = capsys.readouterr().out
    assert f"name map written to {written}" in out and json.loads(written.read_text()) == RENAMED
    assert [name for name in os.listdir(tmp_path)] == ["map.json"]  # no temporary left behind
    assert mhsa(["port-check", *FACTORIES, "--map", str(written)]) == 0
    assert "PASS" in capsys.readouterr().out


def test_write_map_refuses_an_input_a_fifo_a_folder_and_a_link_before_any_work(tmp_path, capsys):
    given = tmp_path / "given.json"
    given.write_text(json.dumps({"norm": "ln"}))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link.json"
    link.symlink_to(given)
    source_file = models.__file__
    for target, extra, message in [
        (given, ["--map", str(given)], "is the input"),
        (fifo, [], "is not a regular file"),
        (tmp_path, [], "is a directory"),
        (link, [], "is a symbolic link"),
        (source_file, [], "is the input"),  # the factory's own module
        (tmp_path / "no" / "map.json", [], "does not exist"),
    ]:
        assert mhsa(["port-check", *FACTORIES, "--write-map", str(target), *extra]) == 2, target
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and err.startswith("mhsa port-check: error: "), (target, err)
    assert json.loads(given.read_text()) == {"norm": "ln"}


def test_a_reader_gone_from_stdout_does_not_cancel_the_map(tmp_path, monkeypatch):
    from mhsa.port_check import command

    def closed(report):  # what print meets once `| head` has exited
        raise BrokenPipeError

    monkeypatch.setattr(command, "format_report", closed)
    written = tmp_path / "map.json"
    mhsa(["port-check", *FACTORIES, "--write-map", str(written)])
    assert json.loads(written.read_text()) == RENAMED
