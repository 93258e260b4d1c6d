"""Names that do not correspond get advice, never a comparison against the
port's own random weights.

The check stops (exit 2) and proposes a name map by structure: call order, layer types and
parameter shapes, shortened to the renamed prefix where it can be (`blocks.0` -> `blocks_0`).
--write-map writes it atomically, never over an input and never into anything but a regular
file; run again with it and the port passes. When no structure pairs the names, the check stops
with the advice to write a map."""

import json
import os

import torch

from mhsa.cli import main as mhsa
from mhsa.port_check import check_port, format_report
from tests.tools.port_check import models

FACTORIES = ["tests.tools.port_check.models:torch_named", "tests.tools.port_check.models:flax_renamed"]


def test_names_that_differ_stop_the_check_with_a_map_proposed_by_call_order_and_shapes():
    torch.manual_seed(0)
    report = check_port(models.TorchNamed(), models.FlaxRenamed(), models.activations())
    assert not report.rows and not report.hints and not report.passed  # nothing compared against random weights
    assert report.stopped.startswith("names do not correspond: 6 parameter(s) of torch have no counterpart in jax, and 6 of jax none in torch")
    assert report.proposed_map == {"norm": "ln", "fc1": "dense1", "fc2": "dense2"}
    text = format_report(report)
    assert "unconsumed" not in text and "hint" not in text
    assert text.splitlines()[-1] == "NOT CHECKED: the two models' names do not correspond (see above); nothing was compared"
    mapped = check_port(models.TorchNamed(), models.FlaxRenamed(), models.activations(), name_map=report.proposed_map)
    assert mapped.passed, format_report(mapped)


def test_a_linen_list_of_blocks_gets_its_renamed_prefixes():
    torch.manual_seed(0)
    report = check_port(models.TorchStack(), models.linen(models.LinenStack()), models.activations())
    assert report.proposed_map == {"blocks.0": "blocks_0", "blocks.1": "blocks_1"}
    assert check_port(models.TorchStack(), models.linen(models.LinenStack()), models.activations(), name_map=report.proposed_map).passed


def test_when_nothing_can_be_paired_the_check_stops_with_the_advice_to_write_a_map():
    report = check_port(models.TorchNamed(), models.FlaxOneLayer(), models.activations())
    assert not report.rows and not report.passed
    assert report.stopped.startswith("names do not correspond and no structure pairs them") and not report.proposed_map
    assert "give it with --map" in report.stopped


def test_the_command_exits_2_with_the_proposal_and_writes_it_for_the_next_run(tmp_path, capsys):
    written = tmp_path / "map.json"
    assert mhsa(["port-check", *FACTORIES, "--write-map", str(written)]) == 2
    out = capsys.readouterr().out
    assert '  as JSON: {"norm": "ln", "fc1": "dense1", "fc2": "dense2"}' in out and f"name map written to {written}" in out
    assert json.loads(written.read_text()) == {"norm": "ln", "fc1": "dense1", "fc2": "dense2"}
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
    assert json.loads(written.read_text()) == {"norm": "ln", "fc1": "dense1", "fc2": "dense2"}
