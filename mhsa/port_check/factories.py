"""A factory named on the command line: 'package.module:function', imported from the user's
working directory (as `python -m` would find their package) and called without arguments. Shared
by the forward check and the check through training (command.py)."""

from __future__ import annotations

import importlib
import os
import sys

from mhsa.port_check.core.records import PortCheckError
from mhsa.port_check.forward.check import one_line
from mhsa.port_check.readers import install_hint


def call_factory(spec: str, what: str):
    """What the factory `spec` returns. A bad spec, a module that cannot be found or a name that
    is not a function is a ValueError (one line, exit 2); the user's module or factory raising is a
    PortCheckError naming `what` (TORCH_FACTORY or FLAX_FACTORY)."""
    module_name, _, function = spec.partition(":")
    if not module_name or not function:
        raise ValueError(f"factory must be package.module:function; got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"cannot load factory {spec!r}: {error}{install_hint(error.name)}") from None
    except Exception as error:  # the user's module fails while it is imported
        raise PortCheckError(f"importing {module_name!r} for {what} failed: {one_line(error)}") from error
    factory = getattr(module, function, None)
    if not callable(factory):
        raise ValueError(f"cannot load factory {spec!r}: {module_name} has no function {function!r}")
    try:
        return factory()
    except Exception as error:
        raise PortCheckError(f"{what} {spec!r} raised {one_line(error)}") from error
