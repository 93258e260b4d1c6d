"""`copy_weights`: a PyTorch model's weights copied into your port (Flax NNX or Linen) with the port
check's own pairing and layout rules, for a user who has no converter yet: the same steps as the
first half of check_port (forward/check.py's pair_models), then the copy, and what was done."""

from __future__ import annotations

import json
from typing import Any

from mhsa.port_check.core.records import PortCheckError, PortReport, Transfer
from mhsa.port_check.forward import weights
from mhsa.port_check.forward.check import pair_models, unpaired


def copy_weights(reference, port, inputs, *, port_inputs=None, name_map: dict[str, str] | None = None) -> tuple[Any, Transfer]:
    """Your port holding the reference's weights, and what was done.

    reference: a torch.nn.Module; port: an nnx.Module (changed in place and returned) or a Linen
    (module, variables) pair (a new pair is returned). inputs: one batch the reference is called
    with (and the port too, unless port_inputs is given), as check_port takes it: both models are
    traced on it, to read which variables the port's forward pass reads (a converter's leftover is
    not paired) and, where names differ, to propose a map by call order. name_map: {reference
    prefix: port prefix} for names that do not correspond.

    Parameters pair as the check pairs them: by name through name_map, then the conventional
    renames (weight/kernel/scale/embedding, weight_g/weight_v), each by module type and shape; each
    is laid out as its module needs (a Linear's (out, in) weight as an (in, out) kernel, a Conv's
    OIHW as HWIO). Returns (port, Transfer): Transfer.filled lists every pair (reference name, port
    name, shape, taken transposed), .layouts the layouts inferred, .unconsumed_source and
    .unconsumed_target what stayed unpaired (an unpaired parameter of the port keeps its own
    values), .unread_target the port's variables its forward pass never reads. Raises
    PortCheckError, in one line with the proposed name map, where the names leave more than one
    pairing or none."""
    paired = pair_models(reference, port, inputs, target_inputs=port_inputs, name_map=name_map, dtype=None)
    if isinstance(paired, PortReport):  # names that do not correspond: the user decides
        then = f"check this map and pass it: name_map={json.dumps(paired.proposed_map)}" if paired.proposed_map else "pass a name_map"
        raise PortCheckError(f"names do not correspond ({unpaired(paired)}), so nothing was copied; {then}")
    transfer, target = paired.report.transfer, paired.target
    if target.traced.read is not None:
        transfer.unread_target = [name for name in target.reader.parameters(target.model) if name not in target.traced.read]
    transfer.copied, transfer.decision = True, "copied by copy_weights"
    return target.reader.load_parameters(target.model, weights.arrays_to_copy(transfer, paired.params[0])), transfer
