"""`mhsa port-check TORCH_FACTORY FLAX_FACTORY`: factories, inputs and the command."""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import sys
import zipfile

import numpy as np

from mhsa.port_check.compare import check_port
from mhsa.port_check.records import backend_of
from mhsa.port_check.report import format_report
from mhsa.threads import add_threads_argument
from shared.config import DTYPES
from shared.files import read_regular


def load_factory(spec: str):
    """'package.module:function' -> what the function returns: a model, or (model, inputs)."""
    module_name, _, function = spec.partition(":")
    if not module_name or not function:
        raise ValueError(f"factory must be package.module:function; got {spec!r}")
    if os.getcwd() not in sys.path:  # the user's own package, as `python -m` would find it
        sys.path.insert(0, os.getcwd())
    try:
        factory = getattr(importlib.import_module(module_name), function)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot load factory {spec!r}: {error}") from None
    result = factory()
    if _readable(result):
        return result, None
    if isinstance(result, tuple) and len(result) == 2 and _readable(result[0]):
        return result
    raise ValueError(f"factory {spec!r} returned {type(result).__name__}; expected a model or (model, inputs)")


def _readable(model) -> bool:
    try:
        backend_of(model)
    except TypeError:
        return False
    return True


MAP_BYTES = 1 << 20  # a name map is a few lines of JSON
INPUT_BYTES = 1 << 30  # one batch of inputs


def read_map(path: str) -> dict[str, str]:
    """--map: a JSON object {reference prefix: port prefix}, read as every file here is read:
    a regular file only (a FIFO or a device is refused at once), bounded in size."""
    raw = read_regular(path, "--map file", MAP_BYTES)
    try:
        name_map = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
        raise ValueError(f"--map file {path!r} is not a JSON object of names to names") from None
    if not isinstance(name_map, dict) or not all(isinstance(value, str) for value in name_map.values()):
        raise ValueError(f"--map file {path!r} must hold a JSON object of names to names")
    return name_map


def read_input_file(path: str) -> tuple[np.ndarray, ...]:
    """--inputs: the arrays of a .npy file, or of a .npz archive in its order; never unpickled."""
    raw = read_regular(path, "--inputs file", INPUT_BYTES)
    try:
        loaded = np.load(io.BytesIO(raw), allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                return tuple(loaded[key] for key in loaded.files)
        return (loaded,)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"--inputs file {path!r} is not a .npy or .npz file of arrays: {error}") from None


def read_inputs(args, source_inputs, target_inputs, from_file=None):
    """(inputs for the reference, inputs for the port) from --inputs (already read: `from_file`),
    --input-shape or the factories."""
    if from_file is not None:
        return from_file, from_file
    if args.input_shape:
        rng = np.random.default_rng(args.seed)
        if args.int_range:
            x = rng.integers(0, args.int_range, args.input_shape)
        else:
            x = rng.standard_normal(args.input_shape).astype(np.float32)
        return (x,), (x,)
    if source_inputs is None and target_inputs is None:
        raise ValueError("no inputs: give --input-shape or --inputs, or let a factory return (model, inputs)")
    return source_inputs if source_inputs is not None else target_inputs, target_inputs


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"input shape must be positive integers like 3,5,24; got {text!r}") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"input shape must be positive integers like 3,5,24; got {text!r}")
    return shape


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mhsa.flags import int_flag

    add_threads_argument(parser)
    parser.add_argument("torch_factory", metavar="TORCH_FACTORY", help="package.module:function returning the reference model, or (model, inputs)")
    parser.add_argument(
        "flax_factory",
        metavar="FLAX_FACTORY",
        help="package.module:function returning the port (nnx.Module or Linen (module, variables)), or (model, inputs)",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--input-shape", type=_shape, help="random normal float32 inputs of this shape, e.g. 3,5,24")
    source.add_argument("--inputs", help="inputs from a .npy file, or a .npz file (one array per positional argument)")
    parser.add_argument("--int-range", type=int_flag("--int-range"), help="with --input-shape: integer ids in [0, N) instead")
    parser.add_argument("--map", help="JSON file {reference prefix: port prefix} for names that do not correspond")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="cast both models and the inputs (default float32)")
    parser.add_argument("--grads", action="store_true", help="also compare d sum(output) / d every parameter")
    parser.add_argument("--no-transfer", action="store_true", help="keep the port's own weights and compare them")
    parser.add_argument("--no-probes", action="store_true", help="skip the re-runs with likely causes switched")
    parser.add_argument("--seed", type=int_flag("--seed"), default=0, help="seed of --input-shape's inputs (default 0)")
    parser.set_defaults(parser=parser)


def run(args) -> int:
    if args.int_range and not args.input_shape:
        args.parser.error("--int-range goes with --input-shape")
    try:  # the files first, before the factories import and build anything
        name_map = read_map(args.map) if args.map else None
        from_file = read_input_file(args.inputs) if args.inputs else None
        source, source_inputs = load_factory(args.torch_factory)
        target, target_inputs = load_factory(args.flax_factory)
        inputs, target_inputs = read_inputs(args, source_inputs, target_inputs, from_file)
    except (ValueError, TypeError, OSError) as error:
        args.parser.error(str(error))
    report = check_port(
        source,
        target,
        inputs,
        target_inputs=target_inputs,
        name_map=name_map,
        transfer=not args.no_transfer,
        dtype=args.dtype,
        grads=args.grads,
        probes=not args.no_probes,
    )
    print(format_report(report))
    return 0 if report.passed else 1
