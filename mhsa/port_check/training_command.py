"""`mhsa port-check TORCH_FACTORY FLAX_FACTORY --train N`: the port check through training.

With --train each factory returns a mapping (mhsa.port_check.training.check): "model",
"optimizer", "loss", "inputs", and optionally "model_inputs", "scheduler" and "clip" (torch).
The batches come from the factories, so --inputs and --input-shape do not apply; the weights are
always copied from the reference, so --no-transfer does not either. Exit 0 when every step and
setting agrees, 1 when the trainings part or a setting differs, 2 on a flag error (with the usage)
or a factory it cannot load or use (one line).

Importing this module starts no framework: the command's parser can take add_train_arguments
without loading torch or JAX.
"""

from __future__ import annotations

import argparse

from mhsa.exit_status import DIFFERENT, OK
from mhsa.flags import int_flag
from mhsa.port_check.factories import call_factory

# flags of the forward check that a training check refuses: attribute -> {value given: flag}
REFUSED = {
    "input_shape": "--input-shape",
    "inputs": "--inputs",
    "int_range": "--int-range",
    "transfer": {True: "--transfer", False: "--no-transfer"},
    "grads": "--grads",
    "write_map": "--write-map",
}


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--train",
        type=int_flag("port-check --train"),
        metavar="N",
        help="train both N steps from the reference's weights and compare every step: each factory returns "
        "{model, optimizer, loss, inputs} (mhsa.port_check.training.check)",
    )


def _given(flag, value) -> str | None:
    """The flag the user gave for a refused attribute's value, or None where it was not given."""
    return flag.get(value) if isinstance(flag, dict) else flag if value else None


def run_train(args, name_map: dict[str, str] | None = None) -> int:
    """The command with --train N (args as the forward check's parser and add_train_arguments
    give them; name_map: the --map file, already read by the command): the report on stdout, and
    the exit status the module's docstring gives. A factory it cannot load or use, or one that
    raised, is a ValueError, which command.run says in one line as it says the forward check's."""
    # here, not at the top: `mhsa port-check --help` and the forward check do not start torch and JAX for it
    from mhsa.port_check.report.training import format_train_report
    from mhsa.port_check.training.check import check_setup, check_training

    refused = [given for attribute, flag in REFUSED.items() if (given := _given(flag, getattr(args, attribute, None)))]
    if refused:
        args.parser.error(f"{', '.join(refused)}: not with --train (its batches and weights come from the factories)")
    reference = check_setup(call_factory(args.torch_factory, "TORCH_FACTORY"), "reference")
    port = check_setup(call_factory(args.flax_factory, "FLAX_FACTORY"), "port")
    report = check_training(reference, port, args.train, dtype=args.dtype, name_map=name_map, probes=not args.no_probes)
    print(format_train_report(report))
    return OK if report.passed else DIFFERENT
