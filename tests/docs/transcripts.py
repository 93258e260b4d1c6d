"""The transcripts of the README and docs/: read them from Markdown, run them, compare, re-take.

A transcript is a fenced block whose language is `console`: each line that starts with `$ ` is a
command, and the lines up to the next command are its output, stdout and stderr as a terminal
shows them. A command continues on the next line after a trailing backslash, and through the
body of a heredoc (`<<'EOF'` ... `EOF`). A command expected to fail says so at the end of its
first line: `# exits 1` (any other status fails the check).

Every other block in which a reader could find commands (bash, sh, shell, python) is shown and
never run, and must say why on the line before it: `<!-- not run: make test runs this suite -->`.
Every transcript is in the slow tier (`make test-slow`; `make docs` runs them alone). A document
whose commands take more than a few seconds in all says `<!-- transcripts: slow -->`: its
session starts it before the shorter tests (tests/machinery/scheduling.py).

A document's commands run in order, in one fresh folder (so a command can read only what an
earlier one wrote; what they write must lie in the document's own folder under runs/,
scratch()), through bash, with `.venv/bin/` meaning the running interpreter's folder, in
an environment of their own (run_environment). Their output is compared with the document's
line by line, trailing spaces and trailing blank lines aside, after MASKS have replaced what
differs from run to run in both. Nothing else is masked: a loss or a parity number that moves
is a failure.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.paths import ROOT

TRANSCRIPT = "console"
COMMAND_LANGUAGES = {"bash", "sh", "shell", "zsh", "python", "py", "pycon"}  # shown, never run: need a reason
NOT_RUN = re.compile(r"^<!-- not run: \S.* -->$")
SLOW = "<!-- transcripts: slow -->"
PROMPT = "$ "
EXITS = re.compile(r"\s#\s+exits (\d+)\b[^'\"]*$")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_]\w*)\1")
VENV_BIN = re.compile(r"(?<![\w./-])\.venv/bin/")
FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)")

# What changes from one run to the next, replaced in the document's output and in the run's before
# they are compared: (what it stands for, pattern, replacement).
MASKS = (
    ("seconds", re.compile(r"\b\d+(?:\.\d+)? s\b"), "<seconds> s"),
    ("steps per second", re.compile(r"\b\d[\d,]*(?:\.\d+)? steps/s\b"), "<rate> steps/s"),
    # a checkpoint's bytes differ from run to run: safetensors writes its metadata in any order
    ("a file's SHA-256, as messages abbreviate it", re.compile(r"\b[0-9a-f]{12}\.\.\."), "<sha256>..."),
)
SCRATCH = "runs"  # the one folder the documents' commands write into (.gitignore has it)
CACHE_SHOWN = "~/.cache"  # the session's fresh cache folder is shown as the default one
FOLDER_SHOWN = "."  # and its fresh working folder as the current one


@dataclass
class Command:
    line: int  # 1-based line of the `$ ` in the document
    text: str  # what follows the prompt, continuation and heredoc lines included
    output: list[str]  # the document's output lines
    output_start: int  # 0-based index of the first output line in the document
    exits: int = 0

    @property
    def shown(self) -> str:
        return self.text.splitlines()[0]


@dataclass
class Document:
    path: Path
    lines: list[str]
    commands: list[Command] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # blocks that are neither run nor marked
    slow: bool = False

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT)) if self.path.is_relative_to(ROOT) else self.path.name


def documents() -> list[Path]:
    """The README and every Markdown page of docs/, in reading order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def parse(path: Path) -> Document:
    lines = path.read_text(encoding="utf-8").splitlines()
    doc = Document(path, lines, slow=SLOW in lines)
    n = 0
    while n < len(lines):
        fence = FENCE.match(lines[n])
        if not fence:
            n += 1
            continue
        ticks, language = fence.group(1), fence.group(2).lower()
        end = next((m for m in range(n + 1, len(lines)) if lines[m].startswith(ticks) and not lines[m].strip("`")), len(lines))
        body = range(n + 1, end)
        before = next((lines[m].strip() for m in range(n - 1, -1, -1) if lines[m].strip()), "")
        where = f"{doc.name}:{n + 1}"
        if language == TRANSCRIPT:
            _read_transcript(doc, body)
        elif language in COMMAND_LANGUAGES and not NOT_RUN.match(before):
            doc.problems.append(f"{where}: a {language} block is neither a transcript (```console) nor marked <!-- not run: why -->")
        elif language not in COMMAND_LANGUAGES and any(lines[m].startswith(PROMPT) for m in body):
            doc.problems.append(f"{where}: a {language or 'plain'} block holds `$ ` commands: make it ```console so that they run")
        n = end + 1
    return doc


def _read_transcript(doc: Document, body: range) -> None:
    lines = doc.lines
    n = body.start
    if n < body.stop and not lines[n].startswith(PROMPT):
        doc.problems.append(f"{doc.name}:{n + 1}: a transcript starts with output, not with a `$ ` command")
    while n < body.stop:
        if not lines[n].startswith(PROMPT):
            n += 1
            continue
        first, text = n, [lines[n][len(PROMPT) :]]
        heredoc = HEREDOC.search(text[0])
        while text[-1].endswith("\\") and n + 1 < body.stop:  # a continued line
            n += 1
            text.append(lines[n])
        if heredoc:  # its body, up to and with the line that ends it
            while n + 1 < body.stop:
                n += 1
                text.append(lines[n])
                if lines[n].strip() == heredoc.group(2):
                    break
        n += 1
        start = n
        while n < body.stop and not lines[n].startswith(PROMPT):
            n += 1
        exits = EXITS.search(text[0])
        doc.commands.append(Command(first + 1, "\n".join(text), lines[start:n], start, int(exits.group(1)) if exits else 0))


def masked(text: str) -> list[str]:
    for _, pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


# the caller's variables that choose threads and BLAS kernels: passed on as they are, so that a
# document holds in the shell `make docs` runs in (OMP_NUM_THREADS=1 or unset): the commands
# themselves fix their thread counts
THREAD_VARIABLES = ("OMP_", "OPENBLAS_", "GOTO_", "MKL_", "KMP_", "BLIS_", "NVPL_")

# the kernels every command runs with, whatever the CPU and the caller's shell: each library picks
# its kernels by the CPU (AVX-512 ones sum in another order than AVX2 ones), and that moves a
# float32 loss's last digit and a parity table's error column by a rounding. Pinned to AVX2's, on
# every x86 CPU that has it: ATen's vectorized ops, OpenBLAS (NumPy), MKL's matrix kernels (torch's
# matmuls; MKL's conditional numerical reproducibility, whose AVX2 branch gives the same results on
# every CPU that runs it), oneDNN's, and XLA's code generation and its platform-dependent math
KERNELS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "OPENBLAS_CORETYPE": "Haswell",
    "MKL_CBWR": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "XLA_FLAGS": "--xla_cpu_enable_platform_dependent_math=false --xla_cpu_max_isa=AVX2",
}


def run_environment(cache: Path) -> dict[str, str]:
    """What the commands see: the caller's PATH, home, locale and thread and BLAS settings
    (THREAD_VARIABLES, as the session was started: not the one thread tests/conftest.py gives
    each xdist worker), the AVX2 kernels (KERNELS, in place of the caller's), and nothing else
    of the caller's environment (no XLA_FLAGS of a test session); the cache folder (JAX's
    compiled programs: fresh when the session starts, SHARED_CACHE); matplotlib's own folder (its font cache built once, in this process, not in a
    command's output); and the repository on PYTHONPATH, as when the commands run from its root
    (the port check's `examples.` factories)."""
    import matplotlib

    from tests.machinery.caller import ENVIRONMENT

    kept = {key: value for key, value in os.environ.items() if key in ("PATH", "HOME", "USER", "LOGNAME", "TMPDIR") or key.startswith("LC_")}
    kept.update({key: value for key, value in ENVIRONMENT.items() if key.startswith(THREAD_VARIABLES)})
    kept.update(KERNELS)
    kept["LANG"] = os.environ.get("LANG", "C.UTF-8")
    matplotlib_folder = matplotlib.get_cachedir()
    import matplotlib.font_manager  # noqa: F401  (builds the font cache now, if there is none)

    return {**kept, "XDG_CACHE_HOME": str(cache), "MPLCONFIGDIR": matplotlib_folder, "PYTHONPATH": str(ROOT)}


@dataclass
class Outcome:
    command: Command
    output: str  # as the document would show it (the fresh folders written as CACHE_SHOWN and FOLDER_SHOWN)
    status: int

    @property
    def matches(self) -> bool:
        """The output is the document's, masks aside (the exit status is checked apart)."""
        return masked("\n".join(self.command.output)) == masked(self.output)

    @property
    def ok(self) -> bool:
        return self.matches and self.status == self.command.exits

    def report(self, doc: Document) -> str:
        head = f"{doc.name}:{self.command.line}: $ {self.command.shown}"
        if self.status != self.command.exits:
            return f"{head}\n  exited {self.status}, expected {self.command.exits}; its output:\n{self.output}"
        diff = difflib.unified_diff(masked("\n".join(self.command.output)), masked(self.output), "the document", "the run", lineterm="", n=2)
        return head + "\n" + "\n".join(diff)


def scratch(doc: Document) -> str:
    """The folder a document's commands write into: its own under runs/ (ignored by git), so that
    following the guides leaves the checkout clean and no document's file replaces another's."""
    return f"{SCRATCH}/{doc.path.stem.lower()}"


# the cache folder a test session's documents share (shared_cache(), fresh when the session
# starts): a program two documents compile alike is compiled once, as for a user who follows the
# guides one after another; a hit is the program a compilation gives, so no number moves; a run
# outside a session gets a fresh folder of its own
SHARED_CACHE = "MHSA_DOCS_CACHE"


@contextlib.contextmanager
def shared_cache():
    """For the process that runs a test session (its xdist workers inherit it): a fresh cache folder
    for the session's documents, removed when it ends; a folder the caller set is used as it is."""
    if SHARED_CACHE in os.environ:
        yield
        return
    os.environ[SHARED_CACHE] = tempfile.mkdtemp(prefix="mhsa-docs-cache-")
    try:
        yield
    finally:
        shutil.rmtree(os.environ.pop(SHARED_CACHE), ignore_errors=True)


def run(doc: Document, timeout: float = 600, written: list[str] | None = None) -> list[Outcome]:
    """Run the document's commands in order in one fresh folder; each one's output and status.
    `written`, if given, receives the path of every file the commands left, relative to the folder."""
    bin_folder = Path(sys.executable).parent
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="mhsa-docs-") as scratch:
        folder = Path(scratch) / "work"
        folder.mkdir()
        cache = Path(os.environ.get(SHARED_CACHE) or Path(scratch) / "cache")
        cache.mkdir(parents=True, exist_ok=True)  # a folder the caller named may not exist yet
        env = run_environment(cache)
        for command in doc.commands:
            text = VENV_BIN.sub(f"{bin_folder}/", command.text)
            try:
                result = subprocess.run(
                    ["bash", "-c", text],
                    cwd=folder,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                )
                output, status = result.stdout.decode("utf-8", errors="replace"), result.returncode
            except subprocess.TimeoutExpired as expired:
                output, status = (expired.stdout or b"").decode("utf-8", errors="replace") + f"\n[timed out after {timeout:.0f} s]", -1
            for real, shown in ((str(cache), CACHE_SHOWN), (str(folder), FOLDER_SHOWN), (f"{bin_folder}/", ".venv/bin/")):
                output = output.replace(real, shown)
            outcomes.append(Outcome(command, output, status))
        if written is not None:
            written.extend(sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if not path.is_dir()))
    return outcomes


def rewritten(doc: Document, outcomes: list[Outcome]) -> str:
    """The document with each command's output replaced by what the run printed."""
    lines = list(doc.lines)
    for outcome in sorted(outcomes, key=lambda o: o.command.output_start, reverse=True):
        command = outcome.command
        new = [line.rstrip() for line in outcome.output.splitlines()]
        while new and not new[-1]:
            new.pop()
        lines[command.output_start : command.output_start + len(command.output)] = new
    return "\n".join(lines) + "\n"
