"""Lanes for `mhsa parity`: every section submits its work at the start, one job per backend,
and the jobs of different lanes run side by side while the report is put together in order.

A lane is one worker thread that runs its jobs in submission order. `mhsa parity` gives each
backend its own lane, and each backend's data-parallel runs another, so what one framework
spends outside the interpreter lock (JAX's XLA compilation and execution, the torch ranks'
processes, NumPy's and torch's kernels) overlaps with the Python work of the others. Every job
computes exactly what it computed when the sections ran one after another: the results do not
depend on the order, only the wall time does.

Lanes(inline=True) runs each job at once in the caller's thread: the functions that build one
section on its own (stage_and_gradient_rows, decode_rows, ...) use it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")


class Lanes:
    """Named lanes of jobs; submit() returns a Future for the job's result (or its exception)."""

    def __init__(self, inline: bool = False) -> None:
        self.inline = inline
        self._pools: dict[str, ThreadPoolExecutor] = {}

    def submit(self, lane: str, job: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Queue job(*args, **kwargs) on `lane` (started on first use); inline: run it now."""
        if not self.inline:
            if lane not in self._pools:
                self._pools[lane] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"parity {lane}")
            return self._pools[lane].submit(job, *args, **kwargs)
        future: Future[T] = Future()
        try:
            future.set_result(job(*args, **kwargs))
        except Exception as error:  # noqa: BLE001 - raised again by future.result(), as from a lane
            future.set_exception(error)
        return future

    def close(self, cancel: bool = False, wait: bool = True) -> None:
        """Wait for every lane's running job; cancel=True drops the jobs not yet started (a
        section failed and the report stops), otherwise they run first. wait=False: return at
        once, the running jobs left to finish or to be dropped with the process (Ctrl-C)."""
        for pool in self._pools.values():
            pool.shutdown(wait=wait, cancel_futures=cancel)
        self._pools.clear()

    def __enter__(self) -> Lanes:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None) -> None:
        # a Ctrl-C or SIGTERM (KeyboardInterrupt) waits for nothing: the command ends now (mhsa.cli.leave_busy_threads)
        self.close(cancel=kind is not None, wait=kind is None or not issubclass(kind, KeyboardInterrupt))
