"""What a framework's reader provides to the port check: the `Reader` protocol and the records it
returns. A reader is a module (`readers/torch/reader.py`, `readers/flax/reader.py`) whose functions
are the protocol's members; the checks above reach one only through `reader_of`
(readers/__init__.py), typed as `Reader`. mypy (the TYPE_CHECKING block below) and
tests/tools/port_check/test_reader_protocol.py (at run time) check every reader against it.

Everything a reader hands over is framework-neutral: parameters as NumPy arrays under torch's
state_dict names and layouts (the exchange convention), outputs as `Output` leaves in the order
their calls return (core/structure.py), settings in torch's conventions (`ModuleInfo`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from mhsa.port_check.core.cotangents import Direction
from mhsa.port_check.core.structure import Inputs, Output, Traced

Model = Any  # a framework's model as the user gives it (a torch.nn.Module, an nnx.Module, a Linen pair)


@dataclass(frozen=True)
class ModuleInfo:
    """One submodule as the lint reads it."""

    kind: str  # its neutral type ("Linear", "LayerNorm", "Conv", ..., or the class name of a layer written by hand)
    # the settings the lint compares, in torch's conventions ({"eps": 1e-05, "bias": True, ...}; None where the call decides)
    settings: dict[str, Any] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)  # the attributes holding a floating compute dtype ({"dtype": "float32"})


class Reader(Protocol):
    """A framework's reader. Names are neutral (torch's state_dict names, module paths joined by
    "."; "" is the model itself), arrays NumPy in torch's layouts."""

    def owns(self, model: object) -> bool:
        """Whether this reader reads `model`."""
        ...

    def describe(self, model: Model, inputs: Inputs, traced: Traced | None = None) -> dict[str, ModuleInfo]:
        """module path -> what the lint reads of it, every submodule (a reader that knows its
        submodules only while the model runs traces it on `inputs`, or reads `traced`)."""
        ...

    def parameters(self, model: Model) -> dict[str, np.ndarray]:
        """Every floating-point parameter and persistent buffer: neutral name -> array."""
        ...

    def frozen(self, model: Model) -> frozenset[str]:
        """The parameters the model does not train."""
        ...

    def tied(self, model: Model) -> dict[str, str]:
        """{parameter name: the earlier name it shares its storage with}."""
        ...

    def load_parameters(self, model: Model, arrays: dict[str, np.ndarray]) -> Model:
        """`model` (or a new one, for an immutable framework) holding `arrays` (neutral names,
        already paired and shape-checked)."""
        ...

    def cast(self, model: Model, dtype: str) -> tuple[Model, list[str]]:
        """`model` with every floating-point variable (and compute dtype) in `dtype`, and one line
        per compute-dtype attribute changed."""
        ...

    def trace(self, model: Model, inputs: Inputs) -> Traced:
        """What can be known before a run: the variables the forward pass reads, the modules as
        called, each output's layout."""
        ...

    def run(
        self,
        model: Model,
        inputs: Inputs,
        grads: Direction | None = None,
        each: Callable[[Output], Output] | None = None,
        traced: Traced | None = None,
        each_gradient: Callable[[str, np.ndarray], None] | None = None,
        later: bool = False,
    ) -> tuple[list[Output], Any]:
        """Every leaf of every submodule call's output, in the order the calls return (a child
        before its parent; the model itself last, path ""), each through `each` as it is recorded
        (to reduce it), and with `grads` d <r, output> / d every parameter, r the direction `grads`
        gives the output's leaves (core/cotangents.py), in neutral names and layouts; from one
        forward (and backward) pass. `traced`: trace()'s record of this model on these inputs, to reuse.
        `each_gradient(name, array)`: each parameter's gradient handed over as soon as it is complete
        and let go by the reader after (the returned dict is then empty), so that a large model's
        gradients need not all exist at once. `later` (with `grads`): the backward pass is not run
        now; the second value returned is a function of an each_gradient that runs it, called
        once (a reader that cannot keep its forward pass for it runs both again then)."""
        ...

    def switched(self, model: Model, switch: str, path: str, value: Any = None) -> Model | None:
        """A copy of `model` with one likely cause of a difference switched, for the probes
        ("transpose", "eps", "approximate", "padding", "load"); None where it does not apply."""
        ...

    def float64_twin(self, model: Model, grads: bool = False) -> AbstractContextManager[Model]:
        """A context manager giving `model` in float64 for the block (the tolerances' reference
        run; `grads`: its gradients are taken too), the model as it was after it, even on error."""
        ...

    def float64_twin_bytes(self, model: Model, grads: bool = False) -> int:
        """About the most memory float64_twin's run holds beyond the model at once (its float64
        weights and, with `grads`, gradients), for the check to refuse a run that cannot fit."""
        ...

    def highest_precision(self) -> AbstractContextManager[None]:
        """A context manager with full float32 matmuls (no TF32) for the block."""
        ...


if TYPE_CHECKING:  # mypy checks every reader against the protocol; nothing is imported at run time
    from mhsa.port_check.readers.equinox import reader as _equinox_reader
    from mhsa.port_check.readers.flax import reader as _flax_reader
    from mhsa.port_check.readers.torch import reader as _torch_reader

    _READERS: tuple[Reader, ...] = (_torch_reader, _flax_reader, _equinox_reader)
