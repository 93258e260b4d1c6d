"""The benchmarks keep working: `mhsa bench --quick` runs both scripts in seconds and prints
every table. No timing is asserted: these sizes are too small to mean anything."""

import importlib.util
import re
import subprocess
import sys

import pytest

from mhsa import bench
from mhsa.cli import main
from tests.paths import ROOT


def test_quick_benchmarks_print_every_table(capsys):
    import torch

    threads = torch.get_num_threads()
    assert main(["bench", "--quick"]) == 0
    out = capsys.readouterr().out
    assert torch.get_num_threads() == threads  # --quick's single thread does not leak out
    for heading in (
        "## Attention block",
        "### torch: forward of the block",
        "### jax: forward of the block",
        "### Peak memory",
        "### One Linear(D, 3D) against three Linear(D, D)",
        "## Training",
        "### torch: steady-state training steps",
        "### jax: steady-state training steps",
        "### Loss trajectories",
    ):
        assert heading in out, heading
    assert "- machine: " in out and "torch 2." in out and "jax 0." in out  # the header names the machine
    assert re.search(r"^- sgemm: \d+ GFLOP/s \(NumPy float32 1024 x 1024 matmul", out, re.M)  # and its speed now
    for row in (
        "fused (attn_impl='fused')",
        "F.scaled_dot_product_attention, direct",
        "nn.MultiheadAttention",
        "jax.nn.dot_product_attention, direct",
        "nnx.MultiHeadAttention",
        "the project's trainer",
    ):
        assert any(line.startswith("| ") and row in line for line in out.splitlines()), f"no table row for {row}"
    # every table row is complete: no empty cells
    for line in out.splitlines():
        if line.startswith("| "):
            assert all(cell.strip() for cell in line.strip("|").split("|")), line
    # the quick trajectories still agree (not a timing: a correctness check the table reports)
    gaps = re.findall(r"\| (float32|float64) \| \d+ \| ([0-9.e+-]+) \|", out)
    assert [dtype for dtype, _ in gaps] == ["float32"]
    assert float(gaps[0][1]) <= 1e-4


def test_a_missing_benchmarks_folder_is_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench, "benchmarks_folder", lambda: tmp_path / "benchmarks")
    assert main(["bench", "attention"]) == 1
    err = capsys.readouterr().err
    assert "attention.py not found" in err and "not installed with the package" in err


@pytest.mark.parametrize(
    "script, argv, message",
    [
        ("train.py", "--demo-runs 0", "--demo-runs: expected an integer in [1, 100], got 0"),
        ("train.py", "--repeats -1", "--repeats: expected an integer in [1, 1000], got -1"),
        ("attention.py", "--repeats 0", "--repeats: expected an integer in [1, 1000], got 0"),
        ("generate.py", "--torch-threads 0", "--torch-threads: expected an integer in [1, 1024], got 0"),
    ],
)
def test_the_scripts_refuse_a_count_outside_its_range_before_any_work(script, argv, message):
    folder = ROOT / "benchmarks"
    result = subprocess.run([sys.executable, str(folder / script), *argv.split()], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "" and message in result.stderr, result.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc/self/status")
def test_keep_freed_memory_keeps_a_freed_large_buffer_resident_for_reuse():
    """attention.py --keep-freed-memory: after bench_common.keep_freed_memory(), a freed 256 MiB
    buffer stays mapped (resident memory does not fall), so the next one reuses its pages;
    without it glibc unmaps the buffer when it is freed."""
    folder = ROOT / "benchmarks"
    probe = (
        "import sys, numpy as np, bench_common\n"
        "kept = bench_common.keep_freed_memory() if sys.argv[1] == 'keep' else None\n"
        "buffer = np.ones(64 << 20, dtype=np.float32)\n"
        "during = bench_common._status_kib('VmRSS')\n"
        "del buffer\n"
        "print(kept, during, bench_common._status_kib('VmRSS'))\n"
    )
    found = {}
    for mode in ("keep", "default"):
        result = subprocess.run([sys.executable, "-c", probe, mode], cwd=folder, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        kept, during, after = result.stdout.split()
        found[mode] = (kept, (int(during) - int(after)) >> 10)  # MiB handed back when the buffer was freed
    assert found["keep"][0] == "True" and found["keep"][1] < 16, found  # (mallopt succeeded, MiB handed back)
    assert found["default"][1] > 200, found


def test_keep_freed_memory_is_refused_in_one_line_before_any_work_where_malloc_has_no_mallopt(monkeypatch, capsys):
    folder = ROOT / "benchmarks"
    monkeypatch.syspath_prepend(str(folder))
    import bench_common

    monkeypatch.setattr(bench_common, "keep_freed_memory", lambda: False)  # what it returns without glibc
    spec = importlib.util.spec_from_file_location("attention_under_test", folder / "attention.py")
    attention = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(attention)
    with pytest.raises(SystemExit) as exit_:
        attention.main(["--keep-freed-memory", "--only", "qkv"])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and captured.out == "", captured.out  # no header, no table: nothing measured
    assert (
        captured.err.strip().splitlines()[-1].endswith("error: --keep-freed-memory needs glibc's malloc (mallopt), which this system does not have")
    )
