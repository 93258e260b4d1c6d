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


@pytest.mark.slow
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
    assert re.search(r"^- machine: .*; sgemm \d+ GFLOP/s \(NumPy float32 1024 x 1024 matmul", out, re.M)  # and its speed now
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
    assert main(["bench", "attention"]) == 2
    err = capsys.readouterr().err
    assert "attention.py not found" in err and "not installed with the package" in err


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, argv, message",
    [
        ("train.py", "--demo-runs 0", "--demo-runs: expected an integer in [1, 100], got 0"),
        ("train.py", "--repeats -1", "--repeats: expected an integer in [1, 1000], got -1"),
        ("attention.py", "--repeats 0", "--repeats: expected an integer in [1, 1000], got 0"),
        ("generate.py", "--torch-threads 0", "--torch-threads: expected an integer in [1, 1024], got 0"),
        ("port_check_train.py", "--steps 0", "--steps: expected an integer in [1, 100000], got 0"),
        ("port_check_train.py", "--repeats 0", "--repeats: expected an integer in [1, 1000], got 0"),
        ("vs_checkout.py", ". --rounds 0", "--rounds: expected an integer in [1, 1000], got 0"),
        ("vs_checkout.py", "/nonexistent/checkout", "/nonexistent/checkout has no .venv/bin/python: run `make install` there first"),
    ],
)
def test_the_scripts_refuse_a_count_outside_its_range_before_any_work(script, argv, message):
    folder = ROOT / "benchmarks"
    result = subprocess.run([sys.executable, str(folder / script), *argv.split()], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "" and message in result.stderr, result.stderr


@pytest.mark.slow
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


# --- RESULTS.md: each script with --write replaces its own section ------------------------------


@pytest.fixture
def bench_common(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_common

    return bench_common


RESULTS_TEXT = """# Benchmark results

Intro, kept as it is.

<!-- table: python benchmarks/a.py -->
## A, old
| a | 1 |
<!-- /table -->

Between the sections, kept.

<!-- table: python benchmarks/b.py --only speed -->
## B, old
<!-- /table -->
"""


def test_a_section_is_replaced_and_every_other_line_kept(bench_common):
    new = bench_common.replace_section(RESULTS_TEXT, "python benchmarks/a.py", "## A, new\n| a | 2 |\n")
    assert new == RESULTS_TEXT.replace("## A, old\n| a | 1 |\n", "## A, new\n| a | 2 |\n")
    # the same command again: the same file (nothing appended, nothing doubled)
    assert bench_common.replace_section(new, "python benchmarks/a.py", "## A, new\n| a | 2 |\n") == new
    # the section of another command with the same script is its own
    other = bench_common.replace_section(RESULTS_TEXT, "python benchmarks/b.py --only speed", "## B, new")
    assert other == RESULTS_TEXT.replace("## B, old\n", "## B, new\n")


def test_a_command_without_a_section_gets_one_at_the_end(bench_common):
    new = bench_common.replace_section(RESULTS_TEXT, "python benchmarks/b.py", "## B, all")
    assert new == RESULTS_TEXT + "\n<!-- table: python benchmarks/b.py -->\n## B, all\n<!-- /table -->\n"
    assert bench_common.replace_section("", "python benchmarks/c.py", "x") == "<!-- table: python benchmarks/c.py -->\nx\n<!-- /table -->\n"


@pytest.mark.parametrize(
    "broken, message",
    [
        (RESULTS_TEXT.replace("| a | 1 |\n<!-- /table -->\n", "| a | 1 |\n"), "has no <!-- /table -->"),  # its end runs into the next section
        (RESULTS_TEXT.replace("## B, old\n<!-- /table -->\n", "## B, old\n").replace("b.py --only speed", "a.py"), "2 sections"),
        (RESULTS_TEXT + "<!-- table: python benchmarks/a.py -->\n", "2 sections"),
    ],
)
def test_a_broken_pair_of_markers_is_refused_not_guessed(bench_common, broken, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        bench_common.replace_section(broken, "python benchmarks/a.py", "## A, new")


def test_recorded_prints_the_tables_and_writes_them_only_when_the_run_ends(bench_common, tmp_path, capsys):
    results = tmp_path / "RESULTS.md"
    results.write_text(RESULTS_TEXT)
    with bench_common.recorded("python benchmarks/a.py", results):
        print("## A, measured")
        print("| a | 3 |")
    out = capsys.readouterr().out
    assert out.startswith("## A, measured\n| a | 3 |\n\n- load average at the end of this run: ")  # still printed
    written = RESULTS_TEXT.replace("## A, old\n| a | 1 |\n", out)
    assert results.read_text() == written and re.search(r"end of this run: [\d.]+, [\d.]+, [\d.]+ \(1, 5, 15 min\)\n<!-- /table -->", written)
    before = results.read_text()
    with pytest.raises(KeyboardInterrupt), bench_common.recorded("python benchmarks/a.py", results):
        print("## A, half")
        raise KeyboardInterrupt
    assert results.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["RESULTS.md"]  # no temporary left


@pytest.mark.parametrize("script", ["attention", "train", "generate"])
def test_each_script_with_write_replaces_its_own_section_named_by_its_command(bench_common, monkeypatch, tmp_path, capsys, script):
    results = tmp_path / "RESULTS.md"
    results.write_text(RESULTS_TEXT)
    monkeypatch.setattr(bench_common, "RESULTS", results)
    spec = importlib.util.spec_from_file_location(f"{script}_under_test", ROOT / "benchmarks" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    measured = f"## {script}, measured (no timing: the measurement is stubbed)"
    if script == "generate":  # one function measures and prints: stub what it times
        monkeypatch.setattr(module, "candidates", lambda name, T, sizes: {})
        monkeypatch.setattr(module, "interleaved", lambda functions, repeats, min_time: {})
        monkeypatch.setattr(module, "speed_table", lambda *args: measured)
        monkeypatch.setattr(bench_common, "header", lambda title, shown: f"header of {' '.join(shown)}")
    else:
        monkeypatch.setattr(module, "run", lambda args, repeats, shown: print(measured))
    assert module.main(["--repeats", "2", "--write"]) == 0
    command = f"python benchmarks/{script}.py --repeats 2"
    text = results.read_text()
    assert text.startswith(RESULTS_TEXT)  # the other sections untouched
    section = text[len(RESULTS_TEXT) :]
    assert section.startswith(f"\n<!-- table: {command} -->\n") and f"{measured}\n\n- load average at the end of this run: " in section, section
    assert measured in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("script", ["attention.py", "train.py", "generate.py"])
def test_write_refuses_quick_tables(script):
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--write"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert "--write records the full tables; --quick's are too small to mean anything" in result.stderr


def test_mhsa_bench_write_refuses_quick_tables_before_running_any(capsys):
    assert main(["bench", "--quick", "--write"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "mhsa bench: --write records the full tables; --quick's are too small to mean anything\n"


def test_parity_timing_writes_its_ratios_against_the_import_floor(bench_common, monkeypatch, tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text(RESULTS_TEXT)
    monkeypatch.setattr(bench_common, "RESULTS", results)
    monkeypatch.setattr(bench_common, "header", lambda title, shown: f"## {title}")
    spec = importlib.util.spec_from_file_location("parity_timing_under_test", ROOT / "benchmarks" / "parity_timing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "measure", lambda rounds: {"floor": [1.0, 1.2, 1.1], "mhsa parity": [3.0, 3.6, 3.3]})
    assert module.main(["--rounds", "3", "--write"]) == 0
    section = results.read_text()[len(RESULTS_TEXT) :]
    assert section.startswith("\n<!-- table: python benchmarks/parity_timing.py --rounds 3 -->\n## mhsa parity, whole process\n")
    assert "| floor | 1.10 | 1.00-1.20 | 1.00x |\n| mhsa parity | 3.30 | 3.00-3.60 | 3.00x |\n" in section


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_data_parallel_rows_run_the_data_parallel_trainer(bench_common):
    """train.py --only dp (left out of --quick's tables): dp=2 goes through the backend's
    parallel.train, dp=1 through its single-device trainer; each gives seconds per epoch."""
    spec = importlib.util.spec_from_file_location("train_under_test", ROOT / "benchmarks" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for dp in (1, 2):
        seconds, steps = module.dp_epochs("torch", dp, 8, 1, quick=True)
        assert steps == 8 and len(seconds) == 1 and seconds[0] > 0, (dp, seconds)


def test_results_md_holds_current_tables_only_each_headed_by_its_command_and_machine():
    """benchmarks/RESULTS.md: at most 280 lines (a table or two per command); a short preamble, then only sections
    that a script wrote, each headed by the command that regenerates it, the machine line it
    printed (CPU, sgemm, versions) and closed by the load at its end."""
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 280, f"RESULTS.md has {len(lines)} lines; at most 280"
    sections = re.findall(r"^<!-- table: (python benchmarks/\S+\.py[^\n]*?) -->\n(.*?)\n<!-- /table -->$", text, re.M | re.S)
    assert sections and text.count("<!-- table: ") == len(sections) == text.count("<!-- /table -->")
    for command, body in sections:
        script = ROOT / command.split()[1]
        assert script.is_file(), f"{command}: no such script"
        head = body.splitlines()
        assert head[0].startswith("## ") and head[2].startswith(f"- `{command}`, "), (command, head[:3])
        assert re.match(r"- machine: .+; sgemm \d+ GFLOP/s .+; Python 3\.\d+\.\d+, numpy ", head[3]), (command, head[3])
        assert head[-1].startswith("- load average at the end of this run: "), (command, head[-1])
    outside = re.sub(r"^<!-- table: .*?<!-- /table -->$", "", text, flags=re.M | re.S)
    assert len(outside.strip().splitlines()) <= 8, outside  # the preamble, no notes between the tables
