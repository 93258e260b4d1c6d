"""The transcript harness itself (tests/docs/transcripts.py), on small documents written here:
how it reads a document, what it masks and what it does not, that a hand-edited output fails,
and that re-taking writes the real output and nothing else."""

import sys

import pytest

from tests.docs import transcripts

DOC = """# A guide

Some prose, with `$ not a command` inline.

```console
$ echo made > made.txt
$ cat made.txt
made
$ printf 'a\\nb  \\n\\n'
a
b
$ echo two \\
    words
two words
```

More prose.

<!-- not run: it would install things -->
```bash
make demo
```

```console
$ .venv/bin/python - <<'END'
import sys
print(sys.prefix != sys.base_prefix, 6 * 7)
END
{venv} 42
$ ls missing.txt 2>&1 | head -1; exit 2  # exits 2: nothing made it
ls: cannot access 'missing.txt': No such file or directory
```
"""


def write(tmp_path, text, name="guide.md"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def guide(tmp_path):
    return write(tmp_path, DOC.replace("{venv}", str(sys.prefix != sys.base_prefix)))


def test_a_document_is_read_command_by_command(guide):
    doc = transcripts.parse(guide)
    assert not doc.problems and not doc.slow
    assert [c.shown for c in doc.commands] == [
        "echo made > made.txt",
        "cat made.txt",
        "printf 'a\\nb  \\n\\n'",
        "echo two \\",
        ".venv/bin/python - <<'END'",
        "ls missing.txt 2>&1 | head -1; exit 2  # exits 2: nothing made it",
    ]
    assert [c.line for c in doc.commands] == [6, 7, 9, 12, 25, 30]
    assert doc.commands[3].text == "echo two \\\n    words" and doc.commands[3].output == ["two words"]
    assert doc.commands[4].text.splitlines()[-1] == "END" and len(doc.commands[4].text.splitlines()) == 4
    assert [c.exits for c in doc.commands] == [0, 0, 0, 0, 0, 2]


def test_the_commands_run_in_order_in_one_fresh_folder_and_match(guide):
    doc = transcripts.parse(guide)
    outcomes = transcripts.run(doc)
    assert [o.ok for o in outcomes] == [True] * 6, [o.report(doc) for o in outcomes if not o.ok]


def test_a_hand_edited_output_fails_and_the_report_shows_where_and_what(guide):
    guide.write_text(guide.read_text().replace("made\n$ printf", "mad\n$ printf"))
    doc = transcripts.parse(guide)
    wrong = [o for o in transcripts.run(doc) if not o.ok]
    assert [o.command.shown for o in wrong] == ["cat made.txt"]
    report = wrong[0].report(doc)
    assert report.startswith("guide.md:7: $ cat made.txt") and report.splitlines()[-2:] == ["-mad", "+made"], report


def test_an_exit_status_other_than_the_documented_one_fails(guide):
    guide.write_text(guide.read_text().replace("; exit 2  # exits 2", "; exit 3  # exits 2"))
    doc = transcripts.parse(guide)
    wrong = [o for o in transcripts.run(doc) if not o.ok]
    assert len(wrong) == 1 and wrong[0].matches and "exited 3, expected 2" in wrong[0].report(doc)


def test_a_failing_command_fails_unless_the_document_says_it_exits_so(tmp_path):
    doc = transcripts.parse(write(tmp_path, "```console\n$ echo out; exit 1\nout\n```\n"))
    outcome = transcripts.run(doc)[0]
    assert outcome.matches and not outcome.ok and "exited 1, expected 0" in outcome.report(doc)


def test_a_command_reads_only_what_an_earlier_one_wrote(tmp_path):
    path = write(tmp_path, "```console\n$ cat later.txt  # exits 1\n$ echo x > later.txt\n```\n")
    (tmp_path / "later.txt").write_text("beside the document, not in the run's folder")
    outcome = transcripts.run(transcripts.parse(path))[0]
    assert outcome.status == 1 and "No such file" in outcome.output


@pytest.mark.parametrize(
    "shown, printed",
    [
        ("192 steps in 0.35 s, start-up included", "192 steps in 1.02 s, start-up included"),
        ("compiled in 12 s", "compiled in 3.5 s"),
        ("1,616 steps/s", "702.5 steps/s"),
        ("(its weights_sha256 fea4806ad7b4..., the weights' 7e148f691cb0...)", "(its weights_sha256 d84e45b9fb83..., the weights' fdfa24d023e5...)"),
    ],
)
def test_seconds_rates_and_checkpoint_digests_are_masked(shown, printed):
    assert transcripts.masked(shown) == transcripts.masked(printed)


@pytest.mark.parametrize(
    "shown, printed",
    [
        ("final loss 0.000215309 (step 191)", "final loss 0.000215310 (step 191)"),
        ("| loss | 4.77e-07 | 1e-05 | PASS |", "| loss | 4.78e-07 | 1e-05 | PASS |"),
        ("192 steps in 0.35 s", "191 steps in 0.35 s"),
        ("max |A - B|  1.919e-05 at step 17", "max |A - B|  1.919e-05 at step 18"),
        ("generated: 7 7 7", "generated: 7 7 1"),
        ("PASS: all 31 comparisons", "PASS: all 30 comparisons"),
        ("at most 256 MiB", "at most 255 MiB"),
        (
            "sha256 fdfa24d023e5498bd435a9f412702cc93decc43f04193ddd5ba27827186e203c",
            "sha256 fdfa24d023e5498bd435a9f412702cc93decc43f04193ddd5ba27827186e203d",
        ),
    ],
)
def test_losses_parity_numbers_and_counts_are_not_masked(shown, printed):
    assert transcripts.masked(shown) != transcripts.masked(printed)


def test_trailing_spaces_and_blank_lines_do_not_count_but_inner_blank_lines_do():
    assert transcripts.masked("a  \nb\n\n\n") == transcripts.masked("a\nb")
    assert transcripts.masked("a\n\nb") != transcripts.masked("a\nb")


def test_retaking_writes_the_real_output_and_changes_nothing_else(guide):
    original = guide.read_text()
    guide.write_text(original.replace("two words\n", "two old words\nand a line that went\n").replace("\nmade\n", "\n"))
    doc = transcripts.parse(guide)
    assert transcripts.rewritten(doc, transcripts.run(doc)) == original


def test_the_fresh_folders_are_shown_as_the_default_ones(tmp_path):
    path = write(tmp_path, "```console\n$ echo $XDG_CACHE_HOME/mhsa/jax; pwd\n~/.cache/mhsa/jax\n.\n```\n")
    outcome = transcripts.run(transcripts.parse(path))[0]
    assert outcome.ok, outcome.output


def test_a_cache_folder_the_caller_names_is_made_with_its_parents_and_used(tmp_path, monkeypatch):
    named = tmp_path / "not" / "yet" / "cache"
    monkeypatch.setenv(transcripts.SHARED_CACHE, str(named))
    path = write(tmp_path, "```console\n$ echo $XDG_CACHE_HOME/mhsa/jax; touch $XDG_CACHE_HOME/seen\n~/.cache/mhsa/jax\n```\n")
    outcome = transcripts.run(transcripts.parse(path))[0]
    assert outcome.ok, outcome.output
    assert (named / "seen").is_file()


def test_the_sessions_environment_does_not_reach_the_commands_the_callers_thread_settings_do(tmp_path, monkeypatch):
    from tests.machinery import caller

    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # as conftest sets it in a worker: not the caller's
    monkeypatch.setattr(caller, "ENVIRONMENT", {"OMP_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "5", "JAX_PLATFORMS": "cpu"})
    echo = "echo ${JAX_COMPILATION_CACHE_DIR-unset} ${JAX_PLATFORMS-unset} $OMP_NUM_THREADS $OPENBLAS_NUM_THREADS"
    path = write(tmp_path, f"```console\n$ {echo}\nunset unset 3 5\n```\n")
    outcome = transcripts.run(transcripts.parse(path))[0]
    assert outcome.ok, outcome.output


def test_the_commands_run_the_avx2_kernels_whatever_the_callers_shell_chose(tmp_path, monkeypatch):
    from tests.machinery import caller

    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    shell = {"OPENBLAS_CORETYPE": "SkylakeX", "ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    monkeypatch.setattr(caller, "ENVIRONMENT", shell)
    echo = "echo $XLA_FLAGS $OPENBLAS_CORETYPE $ATEN_CPU_CAPABILITY $MKL_CBWR $ONEDNN_MAX_CPU_ISA"
    shown = "--xla_cpu_enable_platform_dependent_math=false --xla_cpu_max_isa=AVX2 Haswell avx2 AVX2 AVX2"
    path = write(tmp_path, f"```console\n$ {echo}\n{shown}\n```\n")
    outcome = transcripts.run(transcripts.parse(path))[0]
    assert outcome.ok, outcome.output


def test_venv_bin_is_the_running_interpreters_folder(tmp_path):
    path = write(tmp_path, "```console\n$ .venv/bin/python -c 'import sys; print(sys.prefix)'\n" + sys.prefix + "\n```\n")
    outcome = transcripts.run(transcripts.parse(path))[0]
    assert outcome.ok, outcome.output


@pytest.mark.parametrize(
    "text, problem",
    [
        ("```bash\nmake demo\n```\n", "a bash block is neither a transcript"),
        ("<!-- not run -->\n```python\nprint(1)\n```\n", "a python block is neither a transcript"),
        ("```text\n$ mhsa parity\nPASS\n```\n", "a text block holds `$ ` commands"),
        ("```\n$ mhsa parity\n```\n", "a plain block holds `$ ` commands"),
        ("```console\nPASS\n$ mhsa parity\n```\n", "a transcript starts with output"),
    ],
)
def test_a_block_that_is_neither_run_nor_marked_is_a_problem(tmp_path, text, problem):
    doc = transcripts.parse(write(tmp_path, text))
    assert len(doc.problems) == 1 and problem in doc.problems[0] and doc.problems[0].startswith("guide.md:"), doc.problems


def test_a_marked_block_and_a_slow_document_are_read_as_such(tmp_path):
    doc = transcripts.parse(write(tmp_path, "<!-- transcripts: slow -->\n\n<!-- not run: needs a GPU -->\n\n```bash\nx --device cuda\n```\n"))
    assert doc.slow and not doc.problems and not doc.commands
