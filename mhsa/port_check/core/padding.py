"""Flax's 'SAME' padding against torch's explicit padding. 'SAME' pads each spatial axis so that
its output has ceil(n / stride) positions, splitting the total low-first (more at the end): the
total, (ceil(n / stride) - 1) * stride + dilation * (kernel - 1) + 1 - n, depends on n modulo the
stride. At stride 1 it is a constant (3x3: (1, 1), torch's padding=1); at stride 2 a 3x3 kernel
pads (0, 1) on an even n and (1, 1) on an odd one, where torch's padding=1 pads (1, 1) on every
size: the output shapes agree, and the values part, on every even-sized input."""

from __future__ import annotations


def same_pads(kernel: int, stride: int, dilation: int, residue: int) -> tuple[int, int]:
    """(low, high): what 'SAME' pads on one axis whose input size is `residue` modulo `stride`."""
    extent = dilation * (kernel - 1) + 1
    total = max(extent - (stride if residue == 0 else residue), 0)
    return total // 2, total - total // 2


def resolve_same(kernel: tuple, strides: tuple, dilation: tuple) -> tuple | None:
    """((low, high), ...) per axis when 'SAME' pads the same on every input size (every stride 1,
    or a kernel no wider than its stride: a 1x1 conv of stride 2); None when it depends on the size."""
    options = [{same_pads(k, s, d, residue) for residue in range(s)} for k, s, d in zip(kernel, strides, dilation)]
    return tuple(option.pop() for option in options) if all(len(option) == 1 for option in options) else None


def explicit(value, n: int, strides: tuple, dilation: tuple, kernel: tuple) -> tuple | str:
    """A JAX library's conv padding as torch's: ((low, high), ...) per spatial axis where it does not
    depend on the input ('VALID'; 'SAME' where it pads alike on every size; an int; a sequence of
    ints or pairs), otherwise the padding's name ('SAME', 'CIRCULAR', ...)."""
    if isinstance(value, str):
        if value.upper() == "VALID":
            return ((0, 0),) * n
        resolved = resolve_same(kernel, strides, dilation) if value.upper() == "SAME" else None
        return value.upper() if resolved is None else resolved
    if isinstance(value, int):
        return ((value, value),) * n
    return tuple((int(p), int(p)) if isinstance(p, int) else (int(p[0]), int(p[1])) for p in value)


def explain_same(kernel: tuple, strides: tuple, dilation: tuple) -> str:
    """Why a 'SAME' that depends on the input size is not a fixed padding: what it pads for each
    size of one axis (the axes alike: said once), e.g. "'SAME' at stride 2 pads by the input's
    size: (0, 1) where it is even, (1, 1) where it is odd; torch pads the same on every size"."""
    axes = []
    for k, s, d in zip(kernel, strides, dilation):
        pads = [same_pads(k, s, d, residue) for residue in range(s)]
        if s == 2:
            axes.append(f"{pads[0]} where it is even, {pads[1]} where it is odd")
        else:
            axes.append(", ".join(f"{pad} where it is {residue} modulo {s}" for residue, pad in enumerate(pads)))
    strides_shown = strides[0] if len(set(strides)) == 1 else strides
    shown = axes[0] if len(set(axes)) == 1 else "; ".join(f"axis {axis}: {text}" for axis, text in enumerate(axes))
    return f"'SAME' at stride {strides_shown} pads by the input's size: {shown}; torch pads the same on every size"
