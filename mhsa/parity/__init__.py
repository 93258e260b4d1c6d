"""`mhsa parity`: load one set of weights into every registered backend and show, stage by
stage, gradient by gradient and step by step, where they agree and where they part.

The intermediates come from each implementation's real forward pass (its `trace`); the
gradients from each backend's own loss_and_grads (torch autograd, jax.grad, numpy_ref's
hand-written backward pass), the reference's also held against a fourth-order finite
difference of its loss in float64 on a sample of coordinates; the trajectories from every real
trainer; the decode rows from KV-cache generation; the data-parallel rows from each framework's
own engine. A float32 row is held to K times the reference's own error there (numpy_ref in
float32 against numpy_ref in float64, the same weights cast up and the same inputs), a float64
row to docs/DESIGN.md's fixed tolerance (shared.tolerances).

    rows.py           a row, a row over steps, a report, the compared pairs, the reference
    runs.py           the inputs, the padding mask, the trained runs the sections share, the
                      reference trainer's float64 twins
    lanes.py          one worker thread per backend: the sections' work runs side by side
    adapters.py       every backend behind one call signature; the finite difference
    stages.py, trajectory.py, decode.py, data_parallel.py    the sections
    table.py          rows as a markdown table: the gaps, the reference's error, the tolerance
    report.py         the sections in order, and the report as text
    command.py        the flags and the command (also `python -m mhsa.parity`)
"""
