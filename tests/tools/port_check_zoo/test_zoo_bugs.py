"""Every planted bug of the zoo is a real bug, checked without the port checker: in float64 the
port's outputs part from the reference's far beyond the tolerance (precision cannot explain it),
and the first submodule output that differs is the one the table names; a gradient-only bug keeps
the outputs and parts one gradient; a lint-only bug keeps the outputs and parts the running
statistics after a training step."""

import jax
import pytest
import torch

from examples.zoo import catalog, inputs, vit_bugs, vit_convert, vit_torch
from shared.tolerances import max_abs_diff, tolerance
from tests.tiers import first_fast
from tests.tools.port_check_zoo import sides

FAR = 1000  # a planted bug parts the models by more than FAR times the float64 tolerance


def pair_of(bug: catalog.Bug) -> catalog.Pair:
    return next(pair for pair in catalog.FAITHFUL.values() if pair.reference == bug.reference)


def converter_of(bug: catalog.Bug):
    return catalog.resolve(pair_of(bug).convert)


@pytest.mark.parametrize("name", first_fast(list(catalog.BUGS)))
def test_every_planted_bug_parts_the_models_where_the_table_says(name):
    bug = catalog.BUGS[name]
    (reference, x), (port, y) = catalog.build(bug.reference), catalog.build(bug.port, dtype=bug.dtype)
    grads = bug.section == "gradient"
    expected = sides.torch_run(reference, x, bug.dtype, converter_of(bug) if grads else None)
    actual = sides.flax_run(port, y, bug.dtype, grads=grads)
    tol = tolerance("stage", bug.dtype)
    gap = max(max_abs_diff(a, b) for a, b in zip(actual.outputs, expected.outputs))
    if bug.section in ("gradient", "lint"):
        assert gap <= tol, f"{name} was meant to keep the outputs, but they part by {gap:.2e}"
    else:  # an output bug parts the models at its module; a parameter the port has no room for, at that parameter's
        assert gap > FAR * tol, f"{name}: the outputs part by {gap:.2e} only"
        where = bug.parts_at.rpartition(".")[0] if bug.section == "unpaired" else bug.parts_at
        assert (sides.first_parting(sides.matched(expected.calls, actual.calls), tol, skip=sides.SPLIT.get(bug.reference, {})) or "") == where
    if grads:
        compared = set(expected.grads) - set(pair_of(bug).unread)
        differing = {
            variable for variable, g in actual.grads.items() if variable in compared and max_abs_diff(g, expected.grads[variable]) > FAR * tol
        }
        assert {variable.rsplit(".", 1)[0] for variable in differing} == {bug.parts_at.rsplit(".", 1)[0]}, differing


def test_batchnorm_momentum_read_the_wrong_way_parts_the_running_mean_after_one_training_step():
    # float32: nnx.BatchNorm keeps its statistics in float32 whatever its param_dtype
    reference = vit_torch.build()
    features = reference.stem.conv(torch.as_tensor(inputs.images_nchw(vit_torch.TINY)))  # (B, S, H, W): what the BatchNorm sees
    reference.stem.bn.train()(features)
    nhwc = jax.numpy.asarray(features.detach().numpy().transpose(0, 2, 3, 1))
    means = {}
    for label, port in (("faithful", vit_convert.ported()[0]), ("bug", vit_bugs.batchnorm_momentum()[0])):
        port.stem.bn(nhwc, use_running_average=False)
        means[label] = max_abs_diff(port.stem.bn.mean.get_value(), reference.stem.bn.running_mean.numpy())
    assert means["faithful"] <= tolerance("stage", "float32") and means["bug"] > 0.1, means


def test_every_bug_of_the_table_has_a_factory_of_its_own_and_a_reference_with_a_converter():
    assert len(catalog.BUGS) >= 12 and len({bug.port for bug in catalog.BUGS.values()}) == len(catalog.BUGS)
    assert all(callable(catalog.resolve(bug.port)) and callable(converter_of(bug)) for bug in catalog.BUGS.values())
