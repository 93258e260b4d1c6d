"""`mhsa port-check TORCH_FACTORY FLAX_FACTORY`: factories, inputs and the command; its exit
statuses are FACTORIES' last paragraph (the help's epilog; docs/exit-status.md).

With --train N, the check through training (training/check.py): each factory returns a mapping
whose batches and weights replace the flags REFUSED names. Exit 0 when every step and setting
agrees, 1 when the trainings part or a setting differs, 2 as the forward check.

Importing this module starts no framework: `mhsa port-check --help` loads neither torch nor JAX.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from mhsa.exit_status import DIFFERENT, OK, TROUBLE
from mhsa.flags import int_flag
from mhsa.port_check.core import progress
from mhsa.port_check.core.records import PortCheckError
from mhsa.port_check.core.structure import Inputs, as_inputs
from mhsa.port_check.factories import call_factory
from mhsa.port_check.files import check_writable, read_input_file, read_map, write_map
from mhsa.port_check.forward.check import check_port
from mhsa.port_check.readers import reader_of
from mhsa.port_check.report.forward import format_report
from mhsa.threads import add_threads_argument
from shared.config import DTYPES

FACTORIES = """factories: each FACTORY is package.module:function, called without arguments. It returns
the model, or (model, inputs). TORCH_FACTORY's model is a torch.nn.Module (the reference);
FLAX_FACTORY's an nnx.Module or a Linen (module, variables) pair (the port). inputs are what
the model is called with: an array (one argument), a tuple of arrays (positional arguments), a
dict (keyword arguments), or (tuple, dict) for both; arrays may sit in nested tuples and dicts,
other values (deterministic=True) pass as they are. The reference's inputs go to the port too
unless FLAX_FACTORY returns its own. --inputs and --input-shape replace both. With --train N,
each factory returns a mapping instead: {"model", "optimizer" (a torch.optim optimizer over the
model's parameters; an optax transformation), "loss" ((output, *batch) -> scalar), "inputs" (a
list of batches, tuples of arrays, cycled over the steps)}, and optionally "model_inputs" (how
many of a batch's arrays go to the model), "scheduler" and "clip" (torch); see docs/port-check.md.

weights: the port is checked as it is when it holds converted weights (at least one parameter
whose reference values are not constant holds them, or a transform of them), so that your
converter is checked too; a fresh port gets the reference's weights. --transfer and
--no-transfer force either.

exit status: 0 pass; 1 fail (or no verdict: a module computes below float32); 2 the check
could not be made (a bad flag, file, factory or input: one line; names that do not correspond:
a proposed name map); 130 interrupted."""

# flags of the forward check that a training check refuses: attribute -> {value given: flag}
REFUSED = {
    "input_shape": "--input-shape",
    "inputs": "--inputs",
    "int_range": "--int-range",
    "transfer": {True: "--transfer", False: "--no-transfer"},
    "grads": "--grads",
    "write_map": "--write-map",
}


def load_factory(spec: str, what: str):
    """(model, Inputs or None) from what the factory `spec` returns (call_factory, whose errors pass
    on); one that returns neither a model nor (model, inputs) is a PortCheckError."""
    result = call_factory(spec, what)
    if _readable(result):
        return result, None
    if isinstance(result, tuple) and len(result) == 2 and _readable(result[0]):
        return result[0], None if result[1] is None else as_inputs(result[1])
    raise PortCheckError(f"{what} {spec!r} returned {_kind(result)}; expected a model or (model, inputs)")


def _kind(value) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(type(item).__name__ for item in value) + ")"
    return "None" if value is None else f"a {type(value).__name__}"


def _readable(model) -> bool:
    try:
        reader_of(model)
    except TypeError:
        return False
    return True


def read_inputs(args, source_inputs, target_inputs, from_file=None) -> tuple[Inputs, Inputs | None]:
    """(the reference's inputs, the port's or None: the same) from --inputs (`from_file`), --input-shape or the factories."""
    if from_file is not None:
        return from_file, None
    if args.input_shape:
        rng = np.random.default_rng(args.seed)
        if args.int_range:
            x = rng.integers(0, args.int_range, args.input_shape)
        else:
            x = rng.standard_normal(args.input_shape).astype(np.float32)
        return Inputs((x,), {}), None
    if source_inputs is None and target_inputs is None:
        raise PortCheckError("no inputs: give --input-shape or --inputs, or let a factory return (model, inputs)")
    return (source_inputs if source_inputs is not None else target_inputs), target_inputs


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(","))
    except ValueError:  # not integers: refused below, as a size below 1 is
        shape = ()
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"input shape must be positive integers like 3,5,24; got {text!r}")
    return shape


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = FACTORIES
    add_threads_argument(parser)
    parser.add_argument("torch_factory", metavar="TORCH_FACTORY", help="package.module:function returning the reference model, or (model, inputs)")
    parser.add_argument(
        "flax_factory",
        metavar="FLAX_FACTORY",
        help="package.module:function returning the port (nnx.Module or Linen (module, variables)), or (model, inputs)",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--input-shape", type=_shape, help="random normal float32 inputs of this shape, e.g. 3,5,24")
    source.add_argument("--inputs", help="inputs from a .npy file (one argument) or a .npz file (arr_0, arr_1, ... positional, other names keywords)")
    parser.add_argument("--int-range", type=int_flag("--int-range"), help="with --input-shape: integer ids in [0, N) instead")
    parser.add_argument(
        "--map", help="JSON file {reference name: port name} for names that do not correspond (patterns, splits, sums: docs/port-check.md)"
    )
    parser.add_argument(
        "--write-map", metavar="FILE", help="write the name map the check paired by (or, when it stops, the map so far) to FILE as JSON"
    )
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="cast both models and the inputs (default float32)")
    parser.add_argument("--grads", action="store_true", help="also compare d <r, output> / d every parameter, r a fixed random direction")
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument("--transfer", dest="transfer", action="store_true", default=None, help="always copy the reference's weights into the port")
    weights.add_argument("--no-transfer", dest="transfer", action="store_false", default=None, help="always check the port's own weights")
    parser.add_argument("--no-probes", action="store_true", help="skip the re-runs with likely causes switched")
    parser.add_argument("--seed", type=int_flag("--seed"), default=0, help="seed of --input-shape's inputs (default 0)")
    parser.add_argument(
        "--train",
        type=int_flag("port-check --train"),
        metavar="N",
        help="train both N steps from the reference's weights and compare every step: each factory returns "
        "{model, optimizer, loss, inputs} (mhsa.port_check.training.check)",
    )
    parser.set_defaults(parser=parser)


def run(args) -> int:
    with progress.shown():  # on stderr while the check runs (core/progress.py), ended before the report or an error line
        return _check(args)


def _check(args) -> int:
    if args.int_range and not args.input_shape:
        args.parser.error("--int-range goes with --input-shape")
    try:  # the files first, before the factories import and build anything
        if args.write_map:
            check_writable(args.write_map, [args.map, args.inputs])
        name_map = read_map(args.map) if args.map else None
        if args.train is not None:
            return _run_train(args, name_map)
        from_file = read_input_file(args.inputs) if args.inputs else None
        progress.stage("calling the factories")
        factories = _factories(args)
    except (ValueError, TypeError, OSError) as error:  # a file or factory it cannot use: one line, no usage
        return _error(str(error))
    try:
        inputs, target_inputs = read_inputs(args, factories[0][1], factories[1][1], from_file)
        models = [model for model, _ in factories]
        del factories
        report = check_port(
            models.pop(0),  # handed over, not kept here: a fresh port's initial weights go once the check has copied over them
            models.pop(0),
            inputs,
            target_inputs=target_inputs,
            name_map=name_map,
            transfer=args.transfer,
            dtype=args.dtype,
            grads=args.grads,
            probes=not args.no_probes,
        )
    except PortCheckError as error:
        advice = "; --int-range gives integer ids: does the reference take ids?" if args.int_range and "failed" in str(error) else ""
        return _error(f"{error}{advice}")
    found = report.proposed_map if report.stopped else report.name_map  # the map the check paired by (or so far)
    progress.end()
    try:
        print(format_report(report))
    finally:  # a reader gone from stdout (`| head`) does not cancel the map asked for
        if args.write_map and found:
            write_map(args.write_map, found)
    if args.write_map:
        print(
            f"name map written to {args.write_map}"
            if found
            else f"no name map to write: every name corresponds as it is ({args.write_map} not written)"
        )
    return TROUBLE if report.stopped else OK if report.passed else DIFFERENT


def _run_train(args, name_map: dict[str, str] | None) -> int:
    """The command with --train N (name_map: the --map file, already read): the report on stdout and
    the exit status. A factory it cannot load or use is a ValueError, which _check says in one line."""
    progress.stage("calling the factories")
    # here, not at the top: `mhsa port-check --help` and the forward check do not start torch and JAX for it
    from mhsa.port_check.report.training import format_train_report
    from mhsa.port_check.training.check import check_setup, check_training

    refused = [given for attribute, flag in REFUSED.items() if (given := _given(flag, getattr(args, attribute, None)))]
    if refused:
        progress.end()  # argparse's usage and error follow on stderr
        args.parser.error(f"{', '.join(refused)}: not with --train (its batches and weights come from the factories)")
    reference = check_setup(call_factory(args.torch_factory, "TORCH_FACTORY"), "reference")
    port = check_setup(call_factory(args.flax_factory, "FLAX_FACTORY"), "port")
    report = check_training(reference, port, args.train, dtype=args.dtype, name_map=name_map, probes=not args.no_probes)
    progress.end()
    print(format_train_report(report))
    return OK if report.passed else DIFFERENT


def _given(flag, value) -> str | None:
    """The flag the user gave for a refused attribute's value, or None where it was not given."""
    return flag.get(value) if isinstance(flag, dict) else flag if value else None


# each reader's framework, as a message names a model of it
FRAMEWORKS = {"torch": "a torch", "jax": "a Flax", "equinox": "an Equinox"}


def _factories(args):
    """Both factories' (model, inputs), each checked to be on its side; --write-map not to be either's source file."""
    source = load_factory(args.torch_factory, "TORCH_FACTORY")
    target = load_factory(args.flax_factory, "FLAX_FACTORY")
    for (model, _), what, reference in ((source, "TORCH_FACTORY", True), (target, "FLAX_FACTORY", False)):
        if (reader_of(model)[0] == "torch") != reference:  # the port: any JAX library's reader (Flax, Equinox)
            framework = FRAMEWORKS[reader_of(model)[0]]
            raise PortCheckError(f"{what} returned {framework} model; the torch reference comes first, then its port (Flax NNX, Linen or Equinox)")
    if args.write_map:
        files = [getattr(sys.modules.get(spec.partition(":")[0]), "__file__", None) for spec in (args.torch_factory, args.flax_factory)]
        check_writable(args.write_map, [file for file in files if file])
    return source, target


def _error(message: str) -> int:
    progress.end()
    print(f"mhsa port-check: error: {message}", file=sys.stderr)
    return TROUBLE
