"""The "decode" section of `mhsa parity`: cached generation proven equal to full recomputation.

With the same weights and the same token sequence in every backend that supports "generate":
a prompt read in one call (chunked prefill), then one token per step to max_len. At every step
each backend's cached logits (the whole (B, t, V) tensor of the new positions) are compared with
a full forward over the whole prefix in the same backend; the cached logits and the cache
contents (K and V at every filled slot) across backends; the greedy ids generate() picks; and,
where a backend has a fused kernel, its decode step on the fused path (the offset mask passed
explicitly) against its own full forward. Tolerances are docs/DESIGN.md's (shared.tolerances).

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
from mhsa.parity.rows import Row, pair_key, pairs
from mhsa.parity.runs import inputs
from shared.config import ModelConfig
from shared.tolerances import max_abs_diff, tolerance
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


def _worst(pairs_of_arrays, tol: float = float("inf")) -> tuple[float, int | None]:
    """The largest max |a - b| over the steps, and the first step beyond `tol` (None if none)."""
    diffs = [max_abs_diff(a, b) for a, b in pairs_of_arrays]
    return max(diffs), next((step for step, diff in enumerate(diffs) if not diff <= tol), None)


def _one_backend(name: str, value: float) -> dict:
    # a value about one backend goes into the columns that name it
    return {pair_key(a, b): value if name in (a, b) else None for a, b in pairs()}


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
    return lambda: _rows({name: future.result() for name, future in futures.items()}, config, dtype, prompt_len)


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


def _rows(found: dict[str, dict], config: ModelConfig, dtype: str, prompt_len: int) -> list[Row]:
    """The section's rows from every backend's _backend_runs."""
    names = list(found)
    runs = {name: found[name]["explicit"] for name in names}
    steps = config.max_len - prompt_len + 1  # the prefill and one call per further token
    stage, step_note = tolerance("stage", dtype), f"decode: prompt of {prompt_len} in one call, then {steps - 1} single tokens"

    rows = []
    # each backend against itself: the cache must not change the logits
    for name in names:
        worst, at = _worst(zip(runs[name]["cached"], runs[name]["full"]), stage)
        rows.append(
            Row(
                SECTION,
                f"{name}: cached logits vs its full forward, {steps} steps",
                _one_backend(name, worst),
                stage,
                note=step_note if at is None else f"decode: {name} parts from its full forward at step {at} (0 = the prefill)",
            )
        )

    # across backends: the cached logits and the cache contents, step by step
    def across(key):
        diffs = {}
        for first, second in pairs():
            diffs[pair_key(first, second)] = _worst(zip(runs[first][key], runs[second][key]))[0] if first in runs and second in runs else None
        return diffs

    filled = config.max_len
    rows.append(Row(SECTION, f"cached logits, {steps} steps", across("cached"), stage, note=step_note))
    rows.append(
        Row(
            SECTION,
            f"cache K, {filled} filled slots at the end",
            across("k"),
            stage,
            note="decode: cache K and V compared at every filled slot after every step",
        )
    )
    rows.append(
        Row(
            SECTION,
            f"cache V, {filled} filled slots at the end",
            across("v"),
            stage,
            note="decode: cache K and V compared at every filled slot after every step",
        )
    )

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
            0.0,
            note="decode: greedy ids show the count of differing ids (tolerance 0)",
        )
    )

    # the fused kernel on the decode step: the offset mask goes in explicitly
    for name in [name for name in names if "fused" in found[name]]:
        run = found[name]["fused"]
        explicit = runs[name]["full"]
        worst, at = _worst(zip(run["cached"], explicit), stage)
        note = "decode: fused rows compare the fused cached step with the explicit full forward"
        if dtype == "float64":
            note += " (a kernel whose softmax is float32, JAX's, is not used in float64: that row is explicit)"
        rows.append(
            Row(
                SECTION,
                f"{name} fused: cached logits vs explicit full forward, {steps} steps",
                _one_backend(name, worst),
                stage,
                note=note if at is None else f"decode: {name} fused parts from its full forward at step {at} (0 = the prefill)",
            )
        )
    return rows
