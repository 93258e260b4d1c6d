"""The optimizer lint: its inference reads back the settings each optimizer was built with, in
torch (against param_groups) and in optax (against the constructor's arguments); every classic
difference is named in the user's terms, per parameter where it holds for some only; the moments
are found in the optax state by type, wherever the transformation nests them."""

import math

import jax
import numpy as np
import optax
import pytest
import torch

from mhsa.port_check.readers.flax import reader as flax_reader
from mhsa.port_check.readers.flax import training as train_flax
from mhsa.port_check.readers.torch import training as train_torch
from mhsa.port_check.report.findings import line
from mhsa.port_check.training import lint as train_lint
from mhsa.port_check.training.check import check_setup
from tests.tools.port_check_train import models

STEPS = 6
NAMES = ["ln.weight", "ln.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def _infer_torch(side, name="fc1.weight"):
    plan = train_lint.scenarios(STEPS, float(side["optimizer"].param_groups[0].get("eps") or 1e-8))
    runs, size = train_torch.probe(side, plan)
    return train_lint.infer(runs, name, size, plan[4][1][0])


def _infer_optax(tx, name="fc1.weight", tiny=1e-8):
    side = models.flax_side(tx)
    plan = train_lint.scenarios(STEPS, tiny)
    runs, size = train_flax.probe(side, side["model"], plan)
    return train_lint.infer(runs, name, size, tiny)


def _close(a, b, rtol=1e-4):
    return math.isclose(a, b, rel_tol=rtol, abs_tol=1e-12)


@pytest.mark.parametrize(
    ("optimizer", "settings"),
    [
        ("adam", {"betas": (0.8, 0.99), "eps": 1e-6}),
        ("adam", {"weight_decay": 0.03}),
        ("adamw", {"weight_decay": 0.05, "lr": 3e-3}),
        ("adam", {"amsgrad": True}),
        ("sgd", {"lr": 0.1, "momentum": 0.7, "dampening": 0.2, "weight_decay": 0.01}),
        ("sgd", {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
        ("sgd", {"lr": 0.05, "weight_decay": 0.02}),
    ],
)
def test_the_inference_reads_torchs_own_settings_back(optimizer, settings):
    side = models.torch_side(optimizer, **settings)
    group = side["optimizer"].param_groups[0]
    found = _infer_torch(side)
    assert all(_close(rate, group["lr"]) for rate in found.lr), found.lr
    assert found.clip is None and found.amsgrad == group.get("amsgrad", False)
    if optimizer == "sgd":
        assert found.family == ("momentum" if group["momentum"] else "plain")
        if group["momentum"]:
            assert _close(found.momentum, group["momentum"]) and abs(found.dampening - group["dampening"]) < 1e-9
            assert found.nesterov == group["nesterov"]
        assert _close(found.l2, group["weight_decay"]) and found.decoupled == pytest.approx(0, abs=1e-9)
        return
    assert found.family == "adam" and _close(found.b1, group["betas"][0]) and _close(found.b2, group["betas"][1])
    assert _close(found.eps, group["eps"], 1e-3) and found.eps_root == 0
    l2, decoupled = (0.0, group["weight_decay"]) if optimizer == "adamw" else (group["weight_decay"], 0.0)
    assert found.l2 == pytest.approx(l2, abs=1e-9) and found.decoupled == pytest.approx(decoupled, rel=1e-4, abs=1e-9)


def test_torchs_scheduler_and_clip_are_read_step_by_step():
    side = models.torch_side("adam", scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.1), clip=2.5)
    found = _infer_torch(side)
    assert [round(rate, 12) for rate in found.lr] == [0.01] * 3 + [0.001] * 3
    assert _close(found.clip, 2.5, 1e-3)


@pytest.mark.parametrize(
    ("tx", "expected"),
    [
        (optax.adam(1e-2, b1=0.8, b2=0.99, eps=1e-6), {"family": "adam", "b1": 0.8, "b2": 0.99, "eps": 1e-6, "eps_root": 0.0}),
        (optax.adam(1e-2, eps=0.0, eps_root=1e-8), {"eps": 0.0, "eps_root": 1e-8}),
        (optax.adamw(3e-3, weight_decay=0.05), {"decoupled": 0.05, "l2": 0.0, "lr": 3e-3}),
        (optax.chain(optax.add_decayed_weights(0.02), optax.adam(1e-2)), {"l2": 0.02, "decoupled": 0.0}),
        (optax.chain(optax.clip_by_global_norm(2.0), optax.adam(1e-2)), {"clip": 2.0}),
        (optax.sgd(0.1, momentum=0.8, nesterov=True), {"family": "momentum", "momentum": 0.8, "dampening": 0.0, "nesterov": True}),
        (optax.sgd(0.1), {"family": "plain", "lr": 0.1, "l2": 0.0}),
    ],
)
def test_the_inference_reads_optax_constructor_settings_back(tx, expected):
    found = _infer_optax(tx)
    for key, value in expected.items():
        got = getattr(found, key)
        if key == "lr":
            assert all(_close(rate, value) for rate in got), got
        elif isinstance(value, float):
            assert _close(got, value, 1e-3) if value else abs(got) < 1e-6, (key, got)  # float32 probes
        else:
            assert got == value, (key, got)


def test_an_optax_schedule_is_read_at_every_step():
    found = _infer_optax(optax.adam(optax.linear_schedule(1e-2, 2e-3, 4)))
    assert np.allclose(found.lr, [1e-2, 8e-3, 6e-3, 4e-3, 2e-3, 2e-3], rtol=1e-5)


def _lint(torch_side, tx):
    reference, port = check_setup(torch_side, "reference"), check_setup(models.flax_side(tx), "port")
    return train_lint.optimizer_lint(reference, port, flax_reader.cast(port["model"], "float32")[0], STEPS)


@pytest.mark.parametrize(
    ("torch_side", "tx", "words"),
    [
        (
            lambda: models.torch_side("adam"),
            optax.nadam(1e-2),
            "nesterov: optax's Adam uses Nesterov momentum (optax.nadam, adam(nesterov=True)); torch's Adam does not",
        ),
        (lambda: models.torch_side("adam"), optax.adam(2e-2), "learning rate: optax's is 2 x torch's at every step"),
        (lambda: models.torch_side("adam", maximize=True), optax.adam(1e-2), "maximize: torch maximizes (maximize=True), optax minimizes"),
        (
            lambda: models.torch_side("adam", amsgrad=True),
            optax.adam(1e-2),
            "amsgrad: the maximum of the second moment is kept in torch (amsgrad=True) only",
        ),
        (
            lambda: models.torch_side("adam", clip=1.0),
            optax.adam(1e-2),
            "gradient clipping: torch clips the gradients' global norm to 1 (the factory's clip); optax does not clip",
        ),
        (lambda: models.torch_side("adam"), optax.adam(1e-2, eps=1e-6), "eps: torch eps=1e-08, optax eps=1e-06 (both outside the square root)"),
        (
            lambda: models.torch_side("sgd", lr=0.1, momentum=0.9),
            optax.sgd(0.1, momentum=0.9, nesterov=True),
            "nesterov: torch nesterov=False, optax nesterov=True",
        ),
        (
            lambda: models.torch_side("sgd", lr=0.1, momentum=0.9, weight_decay=0.01),
            optax.chain(optax.sgd(0.1, momentum=0.9), optax.add_decayed_weights(1e-3)),
            "weight decay: torch SGD(weight_decay=0.01) adds 0.01 * p to the gradient (L2: it goes through the moments); "
            "optax decays the weights directly",
        ),
        (
            lambda: models.torch_side("adamw"),
            optax.adamw(1e-2, weight_decay=1e-2, mask=lambda params: jax.tree.map(lambda p: p.ndim > 1, params)),
            "decoupled weight decay: torch 0.01, optax 0 (on ln.weight, ln.bias, fc1.bias, fc2.bias)",
        ),
        (
            lambda: models.torch_side("adam", amsgrad=True),
            optax.chain(optax.scale_by_amsgrad(bias_correction_mu=False, bias_correction_nu=False), optax.scale(-1e-2)),
            "bias correction: optax corrects neither moment (torch divides m by 1 - b1^t and v by 1 - b2^t)",
        ),
    ],
    ids=["nadam", "lr", "maximize", "amsgrad", "clip", "eps", "nesterov", "sgd-decay-after", "mask", "bias-correction"],
)
def test_each_classic_difference_is_named_once_in_the_users_terms(torch_side, tx, words):
    findings, _, _ = _lint(torch_side(), tx)
    assert len(findings) == 1 and line(findings[0]).startswith(words), findings  # the sentence each kind prints


@pytest.mark.parametrize(
    ("torch_side", "tx"),
    [
        (lambda: models.torch_side("adam", clip=1.0), optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))),
        (lambda: models.torch_side("adam", amsgrad=True), optax.amsgrad(1e-2)),
        (lambda: models.torch_side("adam", weight_decay=0.01), optax.chain(optax.add_decayed_weights(0.01), optax.adam(1e-2))),
        (lambda: models.torch_side("sgd", lr=0.1, momentum=0.9, nesterov=True), optax.sgd(0.1, momentum=0.9, nesterov=True)),
        (lambda: models.torch_side("sgd", lr=0.05), optax.sgd(0.05)),
        (
            lambda: models.torch_side("adam", scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda step: 0.5**step)),
            optax.adam(lambda count: 1e-2 * 0.5**count),
        ),
    ],
    ids=["clip", "amsgrad", "adam-l2", "nesterov", "plain-sgd", "schedule"],
)
def test_matched_settings_give_no_finding(torch_side, tx):
    findings, notes, settings = _lint(torch_side(), tx)
    assert findings == [] and notes == [], findings
    assert settings[0].kind == "torch" and any(setting.kind == "optax" for setting in settings)


def test_the_moments_are_found_by_type_inside_chains_wrappers_and_multi_transform():
    params = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    names = {("a",): ("a.weight", "linear"), ("b",): ("b", None)}
    nested = optax.chain(optax.clip_by_global_norm(1.0), optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2))
    split = optax.multi_transform({"adam": optax.adam(1e-2), "sgd": optax.sgd(0.1, momentum=0.9)}, {"a": "adam", "b": "sgd"})
    found = train_flax.moments(names, nested.init(params))
    assert sorted(found) == [("exp_avg", "a.weight"), ("exp_avg", "b"), ("exp_avg_sq", "a.weight"), ("exp_avg_sq", "b")]
    assert found[("exp_avg", "a.weight")].shape == (3, 2)  # in torch's (out, in) layout
    found = train_flax.moments(names, split.init(params))
    assert sorted(found) == [("exp_avg", "a.weight"), ("exp_avg_sq", "a.weight"), ("momentum_buffer", "b")]  # masked-out leaves left out
