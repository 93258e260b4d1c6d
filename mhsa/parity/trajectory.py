"""The "trajectories" section of `mhsa parity`: the loss at every step of every backend's real
trainer, from the same weights and batches; in float64 also the final weights."""

from __future__ import annotations

from collections.abc import Callable

from mhsa import registry
from mhsa.parity.lanes import Lanes
from mhsa.parity.rows import Row, pair_key, pairs
from mhsa.parity.runs import trained
from shared.config import TrainConfig
from shared.tolerances import max_abs_diff, tolerance


def trajectory_rows(config, dtype, seed, epochs, cache: dict | None = None) -> list[Row]:
    """The loss at every step of every backend's trainer, from the same init and batches; in
    float64 also the final weights."""
    return trajectory_section(config, dtype, seed, epochs, cache=cache)()


def trajectory_section(config, dtype, seed, epochs, cache: dict | None = None, lanes: Lanes | None = None) -> Callable[[], list[Row]]:
    """trajectory_rows in two steps: every trainer is submitted to `lanes` now; the returned
    function waits for the runs and builds the rows."""
    train_config = TrainConfig(epochs=epochs, seed=seed, dtype=dtype)
    futures = {name: trained(name, config, train_config, cache=cache, lanes=lanes) for name in registry.names("train")}

    def rows() -> list[Row]:
        runs = {name: future.result() for name, future in futures.items()}
        final = {name: registry.get(name).model.to_exchange(run.model) for name, run in runs.items()}
        steps = len(next(iter(runs.values())).losses)

        def compare(measure) -> dict[str, float | None]:
            return {pair_key(a, b): measure(a, b) if a in runs and b in runs else None for a, b in pairs()}

        found = [
            Row(
                "trajectory",
                f"loss at each of {steps} steps",
                compare(lambda a, b: max_abs_diff(runs[a].losses, runs[b].losses)),
                tolerance("trajectory", dtype),
            )
        ]
        if dtype == "float64":
            found.append(
                Row(
                    "trajectory",
                    f"weights after {steps} steps",
                    compare(lambda a, b: max(max_abs_diff(final[a][name], final[b][name]) for name in final[a])),
                    tolerance("stage", dtype),
                )
            )
        return found

    return rows
