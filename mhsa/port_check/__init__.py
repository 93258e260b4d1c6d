"""`mhsa port-check`: check your own port. Take a PyTorch model and its Flax (NNX or Linen) or Equinox port,
pair their parameters (or propose a name map when the names do not correspond), check the port's
own weights when it holds converted ones (your converter is part of the port) or copy the
reference's into a fresh one, lint the settings that classically differ, run both on one batch,
and compare every submodule's output in call order, whatever its structure: the first row beyond
tolerance is where the two models part. Probes then re-run with likely causes switched and say
which closes the gap.

The port check is its own product inside the tools: it reads any user model, not this project's
backends, so it reaches each framework through a reader of its own (`readers/torch/`,
`readers/flax/`, `readers/equinox/`), which reads a model in the exchange convention (torch
state_dict names and layouts). Over the readers sit the forward check (`forward/`) and the check
through training (`training/`), both on what neither framework knows (`core/`, and
`mhsa/comparison.py`: the rows, tolerance rule and table they share with `mhsa parity`); the
text they print is made in `report/`, and `command.py`, `factories.py` and `files.py` are the
command line. The first model is the reference (the source of the
weights), the second the port.

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
