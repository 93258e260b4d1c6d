"""The "data-parallel" section of `mhsa parity`: per backend with the "dp" capability, the
trajectory of a dp=N run against the dp=1 run at every step and the final weights, and the
dp=N runs of every two backends against each other. Each backend's dp=N run is its
framework's own engine (torch DDP over N processes, a JAX mesh over N devices).

    python -m mhsa.parity.data_parallel --dp 2 --dtype float64      # the section on its own

JAX fixes its CPU device count when it starts: call prepare(dp) before anything touches JAX.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import numpy as np

from mhsa import registry
from mhsa.parity.lanes import Lanes
from mhsa.parity.rows import Row, stepwise_row
from mhsa.parity.runs import trained
from mhsa.parity.table import table, verdict
from mhsa.parity.trajectory import step_tolerances
from shared.config import DTYPES, ModelConfig, TrainConfig
from shared.tolerances import max_abs_diff, tolerance

SECTION = "data-parallel"
# final weights, float64: the target. Adam divides by sqrt(v), so a gradient that
# differs in its last bits moves a weight whose v is tiny by more than the loss moves
# (measured: 1e-11 to 2.4e-11 after the default 192 steps, dp=2 and dp=4, both backends).
WEIGHTS_TOL = {"float64": 1e-9}


def prepare(dp: int) -> None:
    """What every dp backend needs before its framework starts (JAX: dp simulated CPU devices)."""
    for name in registry.names("dp"):
        registry.get(name).module("parallel").prepare(dp)


def runs(model_config: ModelConfig, train_config: TrainConfig, dp: int, cache: dict | None = None) -> dict[str, dict[int, tuple]]:
    """name -> {1: (losses, weights), dp: (losses, weights)} for every backend with "dp":
    per-step losses (steps,) and the final exchange dict, from each backend's real trainer
    (runs already in `cache`, mhsa.parity.runs.trained's, are not trained again)."""
    return start_runs(model_config, train_config, dp, cache)()


def start_runs(model_config: ModelConfig, train_config: TrainConfig, dp: int, cache: dict | None = None, lanes: Lanes | None = None):
    """runs() in two steps: the runs not in `cache` are submitted to `lanes` now (a backend's
    dp=N runs in a lane of their own, beside its single-device work); the returned function
    waits for them and gives runs()'s dict."""
    futures = {name: {n: trained(name, model_config, train_config, dp=n, cache=cache, lanes=lanes) for n in (dp, 1)} for name in registry.names("dp")}

    def found() -> dict[str, dict[int, tuple]]:
        result: dict[str, dict] = {}
        for name, by_dp in futures.items():
            result[name] = {}
            for n in (1, dp):
                history = by_dp[n].result()
                result[name][n] = (np.asarray(history.losses), registry.get(name).model.to_exchange(history.model))
        return result

    return found


def columns(names: list[str], dp: int) -> dict[str, str]:
    """Row.diffs key -> column header: each backend's dp=N against its dp=1, then every pair at dp=N."""
    # keys of their own ("dp ..."): the report's pair columns keep theirs
    headers = {f"dp {name}": f"{name} dp={dp} vs 1" for name in names}
    headers.update({f"dp {a}-{b}": f"{a} vs {b} dp={dp}" for a, b in itertools.combinations(names, 2)})
    return headers


def rows(found: dict[str, dict[int, tuple]], dtype: str, dp: int, tolerances: tuple | None = None) -> list[Row]:
    """The section's rows from runs(): the loss at every step (a failing row names the first
    step beyond tolerance) and, in float64, the final weights. tolerances: the trajectory's
    per-step (tolerances, reference errors, note) (mhsa.parity.trajectory.step_tolerances);
    None: the fixed trajectory tolerance."""
    names = list(found)
    compared = {f"dp {name}": (found[name][dp], found[name][1]) for name in names}
    compared.update({f"dp {a}-{b}": (found[a][dp], found[b][dp]) for a, b in itertools.combinations(names, 2)})
    steps = len(found[names[0]][1][0])
    tols, errors, _ = tolerances or (tolerance("trajectory", dtype), None, "")
    gaps = {key: np.abs(np.asarray(a[0], np.float64) - np.asarray(b[0], np.float64)) for key, (a, b) in compared.items()}
    # the tolerances are the single-device trajectory's: its section's note says how they are derived
    row = stepwise_row(
        SECTION,
        f"loss at each of {steps} steps",
        gaps,
        tols,
        errors,
        note=f"{SECTION}: dp={dp} splits every global batch into {dp} shards; dp=1 is the single-device trainer",
    )
    if not row.passed:
        row.name += f", first beyond tolerance at step {row.step}"
    result = [row]
    if dtype in WEIGHTS_TOL:
        worst = {key: max(max_abs_diff(a[1][array], b[1][array]) for array in a[1]) for key, (a, b) in compared.items()}
        result.append(Row(SECTION, f"weights after {steps} steps", worst, tol=WEIGHTS_TOL[dtype]))
    return result


def section(model_config: ModelConfig, dtype="float32", seed=0, epochs=3, dp=2, cache: dict | None = None, **train) -> list[Row]:
    """Train every dp backend at dp=1 and dp=N (TrainConfig defaults unless `train` overrides)
    and compare: what `mhsa parity` shows under "data-parallel"."""
    return start(model_config, dtype, seed, epochs, dp, cache, **train)()


def start(model_config: ModelConfig, dtype="float32", seed=0, epochs=3, dp=2, cache: dict | None = None, lanes: Lanes | None = None, **train):
    """section() in two steps: the runs (and in float32 the reference's float64 twins of the
    dp=1 run, which the trajectory section shares) are submitted to `lanes` now; the returned
    function waits for them and builds the rows."""
    train_config = TrainConfig(epochs=epochs, seed=seed, dtype=dtype, **train)
    found = start_runs(model_config, train_config, dp, cache, lanes)
    tolerances = step_tolerances(model_config, train_config, cache=cache, lanes=lanes)
    return lambda: rows(found(), dtype, dp, tolerances())


def format_rows(found_rows: list[Row], headers: dict[str, str]) -> str:
    """The section as a markdown table, with the verdict line naming the first failing row."""
    failed = next((row for row in found_rows if not row.passed), None)
    lines = table(list(headers), found_rows, headers.__getitem__)
    if failed is None:
        lines.append(f"PASS: all {len(found_rows)} data-parallel comparisons within tolerance")
    else:
        lines.append(f"FAIL: {SECTION} '{failed.name}': {verdict(failed, headers.__getitem__)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    from mhsa.flags import int_flag

    parser = argparse.ArgumentParser(prog="python -m mhsa.parity.data_parallel", description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int_flag("--dp"), default=2, help="ranks or devices, in [1, 64] (default 2)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--epochs", type=int_flag("--epochs"), default=3, help="epochs of each run (default 3)")
    parser.add_argument("--seed", type=int_flag("--seed"), default=0, help="the runs' seed, in [0, 2**32 - 1] (default 0)")
    args = parser.parse_args(argv)
    prepare(args.dp)
    found = section(ModelConfig(), args.dtype, args.seed, args.epochs, args.dp)
    print(f"{SECTION} · {args.dtype} · dp={args.dp} · {args.epochs} epochs of the default run")
    print(format_rows(found, columns(registry.names("dp"), args.dp)))
    return 0 if all(row.passed for row in found) else 1


if __name__ == "__main__":
    sys.exit(main())
