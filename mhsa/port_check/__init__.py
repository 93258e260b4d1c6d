"""`mhsa port-check`: check your own port. Take a PyTorch model (the reference, the source of the
weights) and its Flax (NNX or Linen) or Equinox port, pair their parameters (or propose a name map
when the names do not correspond), check the port's own weights when it holds converted ones (your
converter is part of the port) or copy the reference's into a fresh one, lint the settings that
classically differ, run both on one batch, and compare every submodule's output in call order,
whatever its structure: the first row beyond tolerance is where the two models part. Probes then
re-run with likely causes switched and say which closes the gap.

Its layers (a reader per framework in readers/, under the framework-neutral core/, forward/,
training/, report/ and command line) are drawn in docs/DESIGN.md's "Checking another port", and the
reason for the readers in its "Why the port check has readers of its own".

    from mhsa.port_check import check_port, format_report
    report = check_port(torch_model, flax_model, x, dtype="float64", grads=True)
    print(format_report(report))
"""

from mhsa.port_check.command import add_arguments, load_factory, read_inputs, run
from mhsa.port_check.core.records import PortCheckError, PortReport, Row, Transfer, map_name
from mhsa.port_check.core.structure import Inputs
from mhsa.port_check.files import read_input_file, read_map
from mhsa.port_check.forward.check import check_port, copy_weights, lint, transfer_weights
from mhsa.port_check.report.forward import format_report, format_transfer

__all__ = [
    "Inputs",
    "PortCheckError",
    "PortReport",
    "Row",
    "Transfer",
    "add_arguments",
    "check_port",
    "copy_weights",
    "format_report",
    "format_transfer",
    "lint",
    "load_factory",
    "map_name",
    "read_input_file",
    "read_inputs",
    "read_map",
    "run",
    "transfer_weights",
]
