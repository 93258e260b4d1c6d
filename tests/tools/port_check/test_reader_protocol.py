"""Every reader of the port check provides what readers/protocol.py's Reader says: each member, with
the protocol's parameters in its order, and `describe` returning ModuleInfo records; a reader that
lacks a function or takes other parameters fails."""

import importlib
import inspect
import types

import pytest

from mhsa.port_check.core.structure import as_inputs
from mhsa.port_check.readers import READERS, reader_of
from mhsa.port_check.readers.protocol import ModuleInfo, Reader
from tests.tools.port_check import models

MEMBERS = sorted(name for name in vars(Reader) if not name.startswith("_"))


def mismatches(reader: types.ModuleType) -> list[str]:
    """'name: why' for every member of the protocol that `reader` lacks or takes other parameters for."""
    found = []
    for name in MEMBERS:
        member, function = getattr(Reader, name), getattr(reader, name, None)
        if not callable(function):
            found.append(f"{name}: missing")
        elif not isinstance(member, property):  # a property's value is a context-manager factory, its own signature
            wanted = [parameter for parameter in inspect.signature(member).parameters if parameter != "self"]
            given = list(inspect.signature(function).parameters)
            if given != wanted:
                found.append(f"{name}: takes {given}, the protocol {wanted}")
    return found


@pytest.mark.parametrize("side", READERS)
def test_every_reader_satisfies_the_protocol(side):
    assert MEMBERS, "the protocol lists no member"
    assert mismatches(importlib.import_module(READERS[side])) == []


# built in the test, not at collection (every worker collects every module)
@pytest.mark.parametrize("build", [models.TorchMLP, models.NNXMLP, lambda: models.linen(models.LinenNamedBlock())], ids=["torch", "nnx", "linen"])
def test_describe_gives_a_module_info_per_submodule(build):
    model = build()
    _, reader = reader_of(model)
    described = reader.describe(model, as_inputs(models.activations()))
    assert described and all(isinstance(info, ModuleInfo) for info in described.values()), described
    assert "" in described  # the model itself


def test_a_reader_that_lacks_a_function_or_renames_a_parameter_fails():
    reader = types.ModuleType("planted")
    for name in MEMBERS:
        setattr(reader, name, getattr(importlib.import_module(READERS["torch"]), name))
    assert mismatches(reader) == []
    del reader.trace
    reader.owns = lambda thing: True
    assert mismatches(reader) == ["owns: takes ['thing'], the protocol ['model']", "trace: missing"]
