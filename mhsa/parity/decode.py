"""The "decode" section of `mhsa parity`: cached generation proven equal to full recomputation.

With the same weights and the same token sequence in every backend that supports "generate":
a prompt read in one call (chunked prefill), then one token per step to max_len. At every step
each backend's cached logits (the whole (B, t, V) tensor of the new positions) are compared with
a full forward over the whole prefix in the same backend; the cached logits and the cache
contents (K and V at every filled slot) across backends; the greedy ids generate() picks; and,
where a backend has a fused kernel, its decode step on the fused path (the offset mask passed
explicitly) against its own full forward. In float32 each step's tolerance is derived from the
reference's own error at that step (its decode_run again with the weights cast to float64);
float64 keeps docs/DESIGN.md's (shared.tolerances).

A row compares two backends per column (mhsa.parity.rows.pairs()); a row about one backend
alone (its cache against its own full forward) shows its value in the columns of that backend
and nothing in the other one, and its name says which backend it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from mhsa import registry
from mhsa.parity.lanes import Lanes
from mhsa.parity.rows import Row, pair_key, pairs, reference, stepwise_row
from mhsa.parity.runs import inputs, lane64
from shared.config import ModelConfig
from shared.tolerances import max_abs_diff, stepwise, tolerance
from shared.weights import init_weights

SECTION = "decode"


def decode_run(name: str, arrays: dict, config: ModelConfig, tokens: np.ndarray, prompt_len: int, full: bool = True) -> dict:
    """One backend decoding `tokens` (B, max_len): the prompt tokens[:, :prompt_len] in one
    call, then one given token per step. Per step: the cached logits of the new positions, the
    full forward's logits of the same positions (full=False leaves that list empty: a run
    compared with another run's full forward), and the filled cache (K, V)."""
    backend = registry.get(name)
    model_module, generate = backend.model, backend.module("generate")
    model = model_module.from_exchange(arrays, config)
    cache = generate.new_cache(model, tokens.shape[0])
    run: dict[str, list[np.ndarray]] = {"cached": [], "full": [], "k": [], "v": []}
    start = 0
    for end in [prompt_len, *range(prompt_len + 1, tokens.shape[1] + 1)]:
        run["cached"].append(generate.step(model, tokens[:, start:end], cache))  # (B, end - start, V)
        if full:
            run["full"].append(model_module.predict(model, tokens[:, :end])[:, start:end])  # (B, end - start, V)
        k, v = generate.cache_arrays(cache)  # (B, H, end, d_head)
        run["k"].append(k)
        run["v"].append(v)
        start = end
    return run


def _one_backend(name: str, value):
    # a value about one backend goes into the columns that name it
    return {pair_key(a, b): value if name in (a, b) else None for a, b in pairs()}


def _gaps(first: list[np.ndarray], second: list[np.ndarray]) -> np.ndarray:
    """(steps,): max |a - b| at each step."""
    return np.array([max_abs_diff(a, b) for a, b in zip(first, second)])


def decode_rows(
    config: ModelConfig, dtype: str = "float32", seed: int = 0, prompt_len: int | None = None, names: list[str] | None = None
) -> list[Row]:
    """The decode section: rows of mhsa.parity.rows.Row, section "decode".

    prompt_len defaults to half the context; the steps run until max_len positions are filled.
    names: the backends to run (default: every one with "generate").
    """
    return decode_section(config, dtype, seed, prompt_len, names)()


def decode_section(
    config: ModelConfig,
    dtype: str = "float32",
    seed: int = 0,
    prompt_len: int | None = None,
    names: list[str] | None = None,
    lanes: Lanes | None = None,
) -> Callable[[], list[Row]]:
    """decode_rows in two steps: each backend's runs are submitted to `lanes` (one lane per
    backend) now; the returned function waits for them and builds the rows."""
    names = names or registry.names("generate")
    prompt_len = prompt_len or max(1, config.max_len // 2)
    arrays = init_weights(config, seed, dtype)
    tokens, _ = inputs(config, seed)  # (B, max_len): the same sequence for every backend
    fused = registry.names("fused")
    lanes = lanes or Lanes(inline=True)
    futures = {name: lanes.submit(name, _backend_runs, name, arrays, config, tokens, prompt_len, name in fused) for name in names}
    ref, twin = reference(), None
    if dtype == "float32" and ref in registry.names("generate"):  # the reference's own error: its runs again in float64
        twin = lanes.submit(lane64(ref), _reference_runs, arrays, config, tokens, prompt_len, ref not in names)

    def rows() -> list[Row]:
        found = {name: future.result() for name, future in futures.items()}
        if twin is None:
            return _rows(found, config, dtype, prompt_len, None)
        own, float64 = twin.result()
        return _rows(found, config, dtype, prompt_len, (own or found[ref]["explicit"], float64))

    return rows


def _reference_runs(arrays: dict, config: ModelConfig, tokens: np.ndarray, prompt_len: int, also_float32: bool) -> tuple[dict | None, dict]:
    """The reference's decode_run with the weights cast to float64 and, where the section does
    not run it anyway, with the float32 weights."""
    float64 = decode_run(reference(), {name: value.astype(np.float64) for name, value in arrays.items()}, config, tokens, prompt_len)
    return (decode_run(reference(), arrays, config, tokens, prompt_len) if also_float32 else None), float64


def _step_tolerances(twins: tuple[dict, dict] | None, dtype: str, *keys: str) -> tuple[np.ndarray | float, np.ndarray | None]:
    """(tolerances (steps,), reference errors (steps,)) of a comparison of the runs' `keys`:
    derived from the reference's own error at each step in the largest of them; (fixed, None)
    without the float64 twin (float64)."""
    if twins is None:
        return tolerance("stage", dtype), None
    derived = [stepwise(twins[0][key], twins[1][key]) for key in keys]
    return np.max([tols for _, tols in derived], axis=0), np.max([errors for errors, _ in derived], axis=0)


def _backend_runs(name: str, arrays: dict, config: ModelConfig, tokens: np.ndarray, prompt_len: int, fused: bool) -> dict:
    """Everything the section needs of one backend: its decode_run ("explicit"), the ids its
    generate() picks greedily from the prompt alone ("generated") and, with a fused kernel, its
    decode_run on the fused path ("fused", compared with the explicit full forward, so it runs none)."""
    backend = registry.get(name)
    found = {"explicit": decode_run(name, arrays, config, tokens, prompt_len)}
    model = backend.model.from_exchange(arrays, config)
    found["generated"] = backend.module("generate").generate(model, tokens[:, :prompt_len], config.max_len - prompt_len)
    if fused:
        found["fused"] = decode_run(name, arrays, dataclasses.replace(config, attn_impl="fused"), tokens, prompt_len, full=False)
    return found


def _rows(found: dict[str, dict], config: ModelConfig, dtype: str, prompt_len: int, twins: tuple[dict, dict] | None) -> list[Row]:
    """The section's rows from every backend's _backend_runs; twins: the reference's
    decode_run in float32 and float64, which the tolerances at each step are derived from."""
    names = list(found)
    runs = {name: found[name]["explicit"] for name in names}
    steps = config.max_len - prompt_len + 1  # the prefill and one call per further token
    step_note = f"decode: prompt of {prompt_len} in one call, then {steps - 1} single tokens"
    logits_tols, logits_errors = _step_tolerances(twins, dtype, "cached", "full")

    rows = []
    # each backend against itself: the cache must not change the logits
    for name in names:
        row = stepwise_row(
            SECTION,
            f"{name}: cached logits vs its full forward, {steps} steps",
            _one_backend(name, _gaps(runs[name]["cached"], runs[name]["full"])),
            logits_tols,
            logits_errors,
            note=step_note,
        )
        if not row.passed:
            row.note = f"decode: {name} parts from its full forward at step {row.step} (0 = the prefill)"
        rows.append(row)

    # across backends: the cached logits and the cache contents, step by step
    def across(key):
        return {pair_key(a, b): _gaps(runs[a][key], runs[b][key]) if a in runs and b in runs else None for a, b in pairs()}

    rows.append(stepwise_row(SECTION, f"cached logits, {steps} steps", across("cached"), *_step_tolerances(twins, dtype, "cached"), note=step_note))
    cache_note = "decode: cache K and V compared at every filled slot after every step"
    for key in ("k", "v"):
        name = f"cache {key.upper()}, {config.max_len} filled slots at the end"
        rows.append(stepwise_row(SECTION, name, across(key), *_step_tolerances(twins, dtype, key), note=cache_note))

    # the ids generate() picks greedily from the prompt alone: identical, not close
    generated = {name: found[name]["generated"] for name in names}
    ids = {}
    for first, second in pairs():
        ids[pair_key(first, second)] = float((generated[first] != generated[second]).sum()) if first in generated and second in generated else None
    shape = generated[names[0]][:, prompt_len:].shape
    rows.append(
        Row(
            SECTION,
            f"greedy ids, {shape[0]} x {shape[1]} generated",
            ids,
            tol=0.0,
            note="decode: greedy ids show the count of differing ids (tolerance 0)",
        )
    )

    # the fused kernel on the decode step: the offset mask goes in explicitly
    for name in [name for name in names if "fused" in found[name]]:
        note = "decode: fused rows compare the fused cached step with the explicit full forward"
        if dtype == "float64":
            note += " (a kernel whose softmax is float32, JAX's, is not used in float64: that row is explicit)"
        gaps = _one_backend(name, _gaps(found[name]["fused"]["cached"], runs[name]["full"]))
        row = stepwise_row(
            SECTION, f"{name} fused: cached logits vs explicit full forward, {steps} steps", gaps, logits_tols, logits_errors, note=note
        )
        if not row.passed:
            row.note = f"decode: {name} fused parts from its full forward at step {row.step} (0 = the prefill)"
        rows.append(row)
    return rows
