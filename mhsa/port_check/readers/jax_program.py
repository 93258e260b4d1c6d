"""A JAX model as one program of its arrays, for every reader of a JAX library (readers/flax/,
readers/equinox/): what does not depend on how the library keeps its variables or calls its
submodules. A reader builds a `Program`; `record` turns its calls into the program's outputs, each
floating-point array once; `trace` traces it and reads what it says of them (readers/jaxpr.py);
`run` runs it compiled, with the gradients along a direction in the same program (`with_gradients`),
and hands the values back as `Output` records, one at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mhsa.port_check.core import progress
from mhsa.port_check.core.cotangents import Direction
from mhsa.port_check.core.structure import Inputs, Output, Traced, as_inputs, dtype_name, flatten, is_float_dtype, split_arrays
from mhsa.port_check.readers import jax_widened, jaxpr


@dataclasses.dataclass
class Program:
    """A model as a function of its arrays."""

    leaves: list
    names: list[str | None]  # each leaf's neutral name (None: not a parameter)
    layouts: list[str | None]  # each leaf's layout in the neutral form ("linear", "conv" or None)
    differentiated: list[bool]
    # call(leaves, inputs, eager=False) runs the model on them: ([(path, output)] of every call, the model's output),
    # traced and interpreted (readers/marks.py), or eagerly: a model that cannot be traced
    call: Any
    modules: dict | None = None  # Linen's {path: module} as last called


def is_array(value) -> bool:
    return isinstance(value, jax.Array)


def on_device(array, dtype=None) -> jax.Array:
    """`array` (NumPy) as a JAX array in `dtype` (its own by default) with a buffer of its own:
    jax.device_put of a fresh NumPy copy, where jnp.asarray or jnp.array would compile a staging
    program for every shape and dtype (hundreds in a port check of many small models). The source
    may be a view of a torch tensor that an optimizer then changes in place, hence the copy."""
    return jax.device_put(np.array(np.asarray(array), dtype=dtype, copy=True))


def numpy(value) -> np.ndarray:
    """A NumPy view of a JAX array (read-only, no copy on the CPU); bfloat16 and float16 as float32
    copies: NumPy computes nothing in bfloat16 (ml_dtypes stores it), and float32 holds every such value exactly."""
    array = np.asarray(value)
    return array.astype(np.float32) if array.dtype.kind == "V" or dtype_name(array.dtype) in ("bfloat16", "float16") else array


def input_arrays(inputs: Inputs, dtype) -> tuple[list, Any]:
    """(the input arrays as JAX arrays, rebuild) as structure.split_arrays gives them: floating
    inputs take `dtype` (the model's), integer ones (token ids) stay as they are."""
    arrays, rebuild = split_arrays(as_inputs(inputs))

    def convert(x):
        wanted = dtype if is_float_dtype(x.dtype) else None
        return (x if wanted is None else jnp.asarray(x, dtype=wanted)) if is_array(x) else on_device(numpy(x), wanted)

    return [convert(x) for x in arrays], rebuild


def record(calls, labels: list) -> list:
    """The floating-point arrays of every call's output, each once (a value several calls return,
    the model's logits that are its head's, is one output of the program); `labels` is filled with
    (call, path, label, dtype or kind, shape, index in the returned list or None) per leaf."""
    values: list = []
    slots: dict[int, int] = {}
    labels[:] = []
    for call, (path, output) in enumerate(calls):
        for label, value in flatten(output, is_array):
            kind = dtype_name(value.dtype) if is_array(value) else type(value).__name__
            shape = tuple(value.shape) if is_array(value) else ()
            slot = None
            if is_array(value) and is_float_dtype(value.dtype):
                slot = slots.setdefault(id(value), len(values))
                if slot == len(values):
                    values.append(value)
            labels.append((call, path, label, kind, shape, slot))
    return values


def trace(program: Program, arrays: list, rebuild) -> Traced:
    """Reader.trace (readers/protocol.py) of `program` on `arrays` by jax.jit(...).trace, without
    running it (an untraceable one raises JAX's error), its outputs every call's floating-point
    arrays (`record`): the names it reads (readers/jaxpr.py), the modules as called (Program.modules),
    every call's output leaves with shapes and layouts, and (program, trace, labels) for `run`."""
    labels: list = []

    def forward(leaves, arrays):
        calls, _ = program.call(leaves, rebuild(arrays))
        return record(calls, labels)

    traced = jax.jit(forward).trace(program.leaves, arrays)
    read = jaxpr.read_inputs(traced.jaxpr)[: len(program.leaves)]
    marks = [0] * len(traced.jaxpr.jaxpr.outvars)
    for call, *_, slot in labels:
        if slot is not None:
            marks[slot] |= 1 << call
    flows = jaxpr.flow(traced.jaxpr, marks)
    outputs = [
        Output(call, path, label, None, kind, shape, *(flows[slot] if slot is not None else (None, -1, None)))
        for call, path, label, kind, shape, slot in labels
    ]
    names = frozenset(name for name, used in zip(program.names, read) if name is not None and used)
    modules = None if program.modules is None else dict(program.modules)
    program.leaves = []  # the values are read again when the program runs: a fresh port's are not held meanwhile
    return Traced(names, modules, outputs, (program, traced, labels))


def run(
    current: Program, arrays: list, rebuild, traced: Traced, grads: Direction | None, each, to_torch, each_gradient=None, later=False
) -> tuple[list[Output], Any]:
    """A JAX reader's run (readers/protocol.py): `traced`'s program compiled and run on `current`'s
    leaves (the model's values now: changed since the trace, maybe, not their shapes), with `grads`
    the gradients in the same program (under their neutral names, in torch's layouts: `to_torch`),
    each through `each_gradient` where given, its buffer let go after; eagerly where the model could
    not be traced (no program). `later`: the forward pass now, and a function that runs forward and
    backward again for the gradients (a compiled program keeps nothing of a run for the next)."""
    if later and grads is not None:
        outputs, _ = run(current, arrays, rebuild, traced, None, each, to_torch)

        def differentiate(each_gradient) -> dict[str, np.ndarray] | None:
            unkept = lambda output: output._replace(value=None)  # noqa: E731  (the outputs are the first run's)
            return run(current, arrays, rebuild, traced, grads, unkept, to_torch, each_gradient)[1]

        return outputs, differentiate
    if traced.program is None:  # eager: nothing is known before the model runs
        program, compiled, labels = current, None, []
    else:
        program, compiled, labels = traced.program
        program = dataclasses.replace(program, leaves=current.leaves)  # the values as they are now
    if grads is None:
        if compiled is not None:
            values = compiled.lower().compile()(program.leaves, arrays)
        else:
            calls, _ = program.call(program.leaves, rebuild(arrays), eager=True)
            values = record(calls, labels)
        gradients = None
    else:
        if traced.outputs is not None:
            # the model's own leaves: the last call recorded at the root path "" (a call is recorded when it returns)
            model_call = max((call for call, path, *_ in labels if path == ""), default=None)
            top = [output for output in traced.outputs if output.call == model_call]
        else:  # run eagerly: the model's own output leaves are known once it has run
            _, output = program.call(program.leaves, rebuild(arrays), eager=True)
            top = [
                Output(-1, "", label, None, dtype_name(v.dtype) if is_array(v) else "", tuple(getattr(v, "shape", ())))
                for label, v in flatten(output, is_array)
            ]
        values, gradients = with_gradients(program, arrays, rebuild, labels, top, grads, eager=compiled is None)
    # the Output records in call order, each through `each` as it is made, its array let go once reduced
    flows = {slot: (output.layout, output.upstream, output.floor) for output, (*_, slot) in zip(traced.outputs or [], labels) if slot is not None}
    found: list[Output] = []
    arrays_of: dict[int, np.ndarray | None] = {}
    last = {slot: index for index, (*_, slot) in enumerate(labels) if slot is not None}
    for index, (call, path, label, kind, shape, slot) in enumerate(labels):
        value = None
        if slot is not None:
            value = arrays_of.pop(slot) if slot in arrays_of else numpy(values[slot])
            values[slot] = None  # with `each`, each array is let go once reduced
            if last[slot] > index:
                arrays_of[slot] = value
        output = Output(call, path, label, value, kind, shape, *flows.get(slot, (None, -1, None)))
        found.append(output if each is None else each(output))
        if index + 1 == len(labels) or labels[index + 1][0] != call:  # the call's last leaf
            progress.called(path)
    if gradients is None:
        return found, None
    if each_gradient is None:
        named = zip(program.names, program.layouts, gradients, program.differentiated)
        return found, {name: to_torch(numpy(grad), layout) for name, layout, grad, d in named if d and name is not None}
    for index, (name, layout, d) in enumerate(zip(program.names, program.layouts, program.differentiated)):
        grad, gradients[index] = gradients[index], None  # this list holds no buffer handed over: each goes once its taker lets it go
        if d and name is not None:
            each_gradient(name, to_torch(numpy(grad), layout))
        del grad
    return found, {}


def with_gradients(program: Program, arrays, rebuild, labels: list, top: list[Output], direction: Direction, eager: bool = False):
    """(the recorded values, the gradient of every leaf of the program, None where not
    differentiated): d <r, output> / d leaf, r the weights `direction` gives `top` (the model's
    own output leaves), with the forward pass, as one compiled program unless `eager`."""
    weights = {label: on_device(value) for label, value in direction(top).items()}
    if not weights:
        raise ValueError("the model's output holds no floating-point array to differentiate")
    mask = program.differentiated

    def objective(differentiated, others, arrays, weights):
        d, o = iter(differentiated), iter(others)
        leaves = [next(d) if is_param else next(o) for is_param in mask]
        calls, output = program.call(leaves, rebuild(arrays), eager=eager)
        terms = [jnp.sum(value * weights[label].astype(value.dtype)) for label, value in flatten(output, is_array) if label in weights]
        return sum(terms), record(calls, labels)

    both = jax.value_and_grad(objective, has_aux=True)  # ((<r, output>, the recorded values), the gradients)
    differentiated = [leaf for leaf, d in zip(program.leaves, mask) if d]
    others = [leaf for leaf, d in zip(program.leaves, mask) if not d]
    (_, values), grads = (both if eager else jax.jit(both))(differentiated, others, arrays, weights)
    it = iter(grads)
    return values, [next(it) if d else None for d in mask]


def float64_twin(cast: Callable[[Any, str], tuple[Any, list[str]]]) -> Callable[[Any], contextlib.AbstractContextManager]:
    """A reader's float64_twin (readers/protocol.py) from its `cast`: a float64 copy, JAX's float64 on
    for the block only (a float32 check leaves the process's switch as it was), and float32 the
    model's code asks for by hand as float64 (readers/jax_widened.py)."""

    @contextlib.contextmanager
    def twin(model, grads: bool = False) -> Iterator[Any]:  # grads: a float64 copy serves both
        with jax.enable_x64(True), jax_widened.widening():
            yield cast(model, "float64")[0]

    return twin


def float64_twin_bytes(parameters: Callable[[Any], dict]) -> Callable[[Any, bool], int]:
    """A reader's float64_twin_bytes from its `parameters`: the twin is a float64 copy of every
    floating variable (8 bytes a value) and, with gradients, its float64 gradients (8 more)."""

    def twin_bytes(model, grads: bool = False) -> int:
        values = sum(array.size for array in parameters(model).values() if is_float_dtype(array.dtype))
        return 8 * values * (2 if grads else 1)

    return twin_bytes


@contextlib.contextmanager
def highest_precision() -> Iterator[None]:
    """Full float32 matmuls for the duration: on GPUs JAX's default uses TF32 (bf16 passes on TPUs)."""
    with jax.default_matmul_precision("highest"):
        yield
