"""What every benchmark shares: the machine header, interleaved timing, peak-memory probes
and markdown tables. Not a package: the scripts beside it import it by name."""

from __future__ import annotations

import contextlib
import datetime
import gc
import io
import os
import platform
import random
import re
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python benchmarks/x.py` from anywhere
    sys.path.insert(0, str(ROOT))

from shared import malloc  # noqa: E402  (after the repository is on sys.path)

PACKAGES = ("numpy", "torch", "jax", "jaxlib", "flax", "optax")
RESULTS = ROOT / "benchmarks" / "RESULTS.md"


@contextlib.contextmanager
def torch_threads(count: int | None):
    """torch.set_num_threads(count) inside the block, the previous count after (None: leave it).

    --quick uses one thread: on two busy cores torch's second thread waits whole scheduler
    ticks at every parallel region, so tiny ops take milliseconds instead of microseconds."""
    if count is None:
        yield
        return
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep every buffer it frees for reuse, for the rest of this process: no
    buffer is mmap-ed (M_MMAP_MAX 0), so none is unmapped when freed, and the heap's top is handed
    back to the kernel only beyond 2 GiB (M_TRIM_THRESHOLD). A fresh large tensor then reuses
    pages already mapped instead of page-faulting new ones in. The same as starting the process
    with GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647.
    Returns False where there is no glibc."""
    return malloc.use("never_unmapped")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def sgemm_gflops(n: int = 1024, repeats: int = 7) -> tuple[float, int]:
    """This machine's float32 matrix-multiply rate now, so that tables from machines of one kind
    that differ in speed can be compared: GFLOP/s of an (n, n) @ (n, n) NumPy matmul, the median
    of `repeats`, and the BLAS threads it used."""
    import numpy as np

    try:
        from threadpoolctl import threadpool_info

        threads = max((pool.get("num_threads", 1) for pool in threadpool_info() if pool.get("user_api") == "blas"), default=1)
    except ImportError:
        threads = 0
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # the first call pays for BLAS's start-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        seconds.append(time.perf_counter() - start)
    return 2 * n**3 / median(seconds) / 1e9, threads


def header(title: str, argv: list[str]) -> str:
    """A markdown header naming the machine, the libraries and the load it ran under."""
    versions = []
    for name in PACKAGES:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = " ".join(["python", *argv])
    threads = ""
    if "torch" in sys.modules:
        threads = f", torch threads: {sys.modules['torch'].get_num_threads()}"
    if os.environ.get("THP_MEM_ALLOC_ENABLE"):
        threads += ", THP_MEM_ALLOC_ENABLE=1 (torch's large buffers on transparent huge pages)"
    gflops, blas_threads = sgemm_gflops()
    return "\n".join(
        [
            f"## {title}",
            "",
            f"- `{command}`, {when}, load average at the start {load} (1, 5, 15 min)",
            f"- machine: {cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}{threads}; "
            f"sgemm {gflops:.0f} GFLOP/s (NumPy float32 1024 x 1024 matmul, median of 7, {blas_threads or 'unknown'} BLAS threads, "
            f"at the start); Python {platform.python_version()}, {', '.join(versions)}",
        ]
    )


def interleaved(candidates: dict, repeats: int, warmup: int = 2, min_time: float = 0.0, warmup_s: float = 0.2) -> dict[str, list[float]]:
    """Seconds per call of each candidate (a function of no arguments that blocks until its result
    is ready), measured round-robin, in a new order each round, so that a change of load hits
    every candidate alike.

    Each candidate first runs at least `warmup` times and `warmup_s` seconds (compilation,
    first allocations, waking threads); each measurement repeats the call until it has run
    min_time seconds and divides."""
    for index, (name, fn) in enumerate(candidates.items()):
        progress(f"warming up {index + 1}/{len(candidates)}: {name}")
        start = time.perf_counter()
        calls = 0
        while calls < warmup or time.perf_counter() - start < warmup_s:
            fn()
            calls += 1
    counts = {}
    for name, fn in candidates.items():
        start = time.perf_counter()
        fn()
        single = time.perf_counter() - start
        counts[name] = max(1, int(min_time / max(single, 1e-9)))
    times = {name: [] for name in candidates}
    order = list(candidates)
    shuffle = random.Random(0).shuffle
    collecting = gc.isenabled()
    gc.disable()  # no collection pause inside a measurement
    try:
        for round_ in range(repeats):
            progress(f"measuring round {round_ + 1}/{repeats} of {len(candidates)} candidates")
            shuffle(order)  # no candidate always runs just after the one that freed a gigabyte
            for name in order:
                fn = candidates[name]
                start = time.perf_counter()
                for _ in range(counts[name]):
                    fn()
                times[name].append((time.perf_counter() - start) / counts[name])
    finally:
        if collecting:
            gc.enable()
        progress(None)
    return times


def progress(text: str | None) -> None:
    """One line of progress on stderr, rewritten in place, only in a terminal (None clears it)."""
    if sys.stderr.isatty():
        print("\r\033[K" + (f"bench: {text}" if text else ""), end="", file=sys.stderr, flush=True)


def jax_module(make, seed: int = 0):
    """make() -> an nnx.Module, built without compiling and running its random initializers
    (a second or more of compilation per benchmark): the structure from nnx.eval_shape, the
    parameters drawn with NumPy (a benchmark needs their sizes, not Flax's init), and the state
    that is not a parameter (a causal mask) from make() compiled with the initializers cut away."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    graphdef, params, rest = nnx.split(nnx.eval_shape(make), nnx.Param, ...)
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda leaf: jnp.asarray(rng.uniform(-0.1, 0.1, leaf.shape).astype(leaf.dtype)), params)
    if jax.tree.leaves(rest):
        rest = jax.jit(lambda: nnx.state(make(), nnx.Not(nnx.Param)))()
    return nnx.merge(graphdef, params, rest)


def median(values) -> float:
    return statistics.median(values)


def middle_half(values) -> tuple[float, float]:
    """The first and third quartiles of the runs (the smallest and largest of fewer than 4)."""
    if len(values) < 4:
        return min(values), max(values)
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q1, q3


def spread(values) -> str:
    """The middle half of the runs in milliseconds, as 'low-high' (middle_half)."""
    low, high = middle_half(values)
    return f"{ms(low)}-{ms(high)}"


def table(columns: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}" if seconds >= 0.01 else f"{seconds * 1e3:.3f}"


def ratio(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x"


# --- peak memory -----------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    return int(match.group(1)) if match else -1


def can_measure_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_kib("VmHWM") > 0
    except OSError:
        return False


def peak_extra_bytes(fn) -> int:
    """How far resident memory rose above its level before fn() while fn ran (Linux: VmHWM
    after resetting it through /proc/self/clear_refs). Includes fn's result if it is kept."""
    gc.collect()
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    result = fn()
    peak = _status_kib("VmHWM")
    del result
    return max(0, peak - before) * 1024


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.0f}" if nbytes >= 2**20 else f"{nbytes / 2**20:.2f}"


# --- RESULTS.md ------------------------------------------------------------------------------
# Each script run with --write replaces its own section of RESULTS.md: the lines between
# `<!-- table: COMMAND -->` and the next `<!-- /table -->`, COMMAND being the command line that
# made them (without --write). A command without a section yet gets one at the end of the file.

SECTION_END = "<!-- /table -->"


def section_start(command: str) -> str:
    return f"<!-- table: {command} -->"


def replace_section(text: str, command: str, body: str) -> str:
    """`text` (a RESULTS.md) with the section of `command` holding `body`, every other line as
    it was; the section is appended at the end when `text` has none. A start marker without
    its end, or a command with two sections, is a ValueError: nothing is guessed."""
    start = section_start(command)
    lines = text.splitlines(keepends=True)
    starts = [n for n, line in enumerate(lines) if line.rstrip("\n") == start]
    if len(starts) > 1:
        raise ValueError(f"{command!r} has {len(starts)} sections in RESULTS.md; expected one")
    section = [start + "\n", body.rstrip("\n") + "\n", SECTION_END + "\n"]
    if not starts:
        gap = "" if not text else ("\n" if text.endswith("\n") else "\n\n")
        return text + gap + "".join(section)
    ends = [n for n in range(starts[0] + 1, len(lines)) if lines[n].rstrip("\n") == SECTION_END]
    nested = [n for n in range(starts[0] + 1, ends[0] if ends else len(lines)) if lines[n].startswith("<!-- table: ")]
    if not ends or nested:
        raise ValueError(f"the section of {command!r} in RESULTS.md has no {SECTION_END} before the next section or the end")
    return "".join(lines[: starts[0]] + section + lines[ends[0] + 1 :])


def write_section(path: Path, command: str, body: str) -> None:
    """Replace `command`'s section of the file at `path` (replace_section), through a temporary
    file renamed into place: an interrupted write leaves the old file whole."""
    text = path.read_text(encoding="utf-8")
    new = replace_section(text, command, body)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(new, encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


class _Tee(io.TextIOBase):
    """A text stream that writes to `stream` and keeps a copy."""

    def __init__(self, stream):
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def recorded(command: str | None, path: Path | None = None):
    """What the block prints goes to stdout as usual and, when `command` is given and the block
    ends without an exception, into `command`'s section of `path` (default RESULTS.md, through
    write_section): a run stopped halfway writes nothing."""
    if command is None:
        yield
        return
    path = path or RESULTS
    if not path.is_file():
        raise FileNotFoundError(f"--write: {path} does not exist; run the benchmarks from a checkout")
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield
        # the load of the whole run, not only at its start: other processes may have joined
        print(f"\n- load average at the end of this run: {', '.join(f'{value:.2f}' for value in os.getloadavg())} (1, 5, 15 min)")
    write_section(path, command, tee.copy.getvalue())
    print(f"\nwrote this table into {path.name}, section `{command}`", file=sys.stderr)


def add_write_flag(parser) -> None:
    parser.add_argument("--write", action="store_true", help="also write the tables into benchmarks/RESULTS.md, replacing this command's own section")


def shown_command(script: str, argv: list[str]) -> list[str]:
    """The command line a table names (what regenerates it): the script and its flags, without --write."""
    return [script] + [arg for arg in argv if arg != "--write"]
