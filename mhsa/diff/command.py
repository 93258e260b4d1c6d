"""`mhsa diff NAME [--left BACKEND] [--right BACKEND]`: `<package>/NAME.py` of two registered
backends side by side (default: the first two with the "layers" capability, torch_impl and
jax_impl), as plain text into a pipe, in colour on a terminal, or as one HTML page (--html).

NAME is any file that two or more backends' packages have, read from the folders on disk
(shared_files), so a file added to the packages is covered without a change here.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import shared
from mhsa import registry
from mhsa.diff.align import align_files, summary
from mhsa.diff.render_html import render_html
from mhsa.diff.render_text import render_plain
from mhsa.exit_status import TROUBLE
from mhsa.flags import int_at_least
from shared import checks
from shared.files import write_atomically

MIN_WIDTH = 40
DEFAULT_NAME = "attention"


def default_sides() -> tuple[str, str]:
    """The backends shown by default: the first two that mirror each other ("layers")."""
    mirrored = registry.names("layers")
    return mirrored[0], mirrored[1]


def repo_root() -> Path:
    return Path(shared.__file__).resolve().parent.parent


def shared_files() -> dict[str, list[str]]:
    """NAME -> the registered backends whose package holds NAME.py, for every NAME that two or
    more of them hold (`__init__` aside), sorted by name: what `mhsa diff` can show."""
    root = repo_root()
    found: dict[str, list[str]] = {}
    for backend in registry.names():
        folder = root / registry.get(backend).package
        for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
            if path.stem != "__init__":
                found.setdefault(path.stem, []).append(backend)
    return {name: sides for name, sides in sorted(found.items()) if len(sides) >= 2}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    left, right = default_sides()
    files = shared_files()
    parser.add_argument(
        "name",
        nargs="?",
        default=DEFAULT_NAME,
        choices=list(files),
        help=f"which file: PACKAGE/NAME.py of each backend (default: {DEFAULT_NAME}); the backends that have each: "
        + "; ".join(f"{name}: {', '.join(sides)}" for name, sides in files.items()),
    )
    parser.add_argument("--left", choices=registry.names(), default=left, help=f"the backend in the left column (default: {left})")
    parser.add_argument("--right", choices=registry.names(), default=right, help=f"the backend in the right column (default: {right})")
    parser.add_argument("--html", metavar="FILE", type=Path, help="write one self-contained HTML page to FILE instead of printing")
    parser.add_argument(
        "--width",
        metavar="N",
        type=int_at_least(MIN_WIDTH, f"a width of at least {MIN_WIDTH}"),
        help="total width in characters (default: the terminal's, or 160 when there is none)",
    )
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the terminal output: auto (when stdout is a terminal), always, never",
    )


def terminal_width(default: int = 160) -> int:
    """COLUMNS, else the width of whichever of stdout/stderr is a terminal, else `default`."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) >= MIN_WIDTH:
        return int(columns)
    for stream in (sys.stdout, sys.stderr):
        try:
            return max(MIN_WIDTH, os.get_terminal_size(stream.fileno()).columns)
        except (AttributeError, OSError, ValueError):
            continue
    return default


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").expandtabs(4).splitlines()


def run(args) -> int:
    if args.left == args.right:
        print(f"mhsa diff: --left and --right are both {args.left}; expected two different backends", file=sys.stderr)
        return TROUBLE
    root = repo_root()
    labels = (args.left, args.right)
    left_name, right_name = (f"{registry.get(label).package}/{args.name}.py" for label in labels)
    names = (left_name, right_name)
    paths = [root / name for name in names]
    missing = [name for name, path in zip(names, paths) if not path.is_file()]
    if missing:
        holders = shared_files().get(args.name, [])
        hint = f" ({args.name}.py is in {', '.join(holders)}: choose two with --left and --right)" if len(holders) >= 2 else ""
        print(f"mhsa diff: {' and '.join(missing)} not found under {root}; nothing to compare{hint}", file=sys.stderr)
        return TROUBLE
    if args.html is not None:
        try:  # never write the page over one of the files it shows
            checks.check_outputs(dict(zip(names, paths)), {"--html": Path(args.html)})
        except ValueError as error:
            print(f"mhsa diff: {error}", file=sys.stderr)
            return TROUBLE
    try:
        left_lines, right_lines = (read_lines(path) for path in paths)
    except (OSError, UnicodeDecodeError) as error:
        print(f"mhsa diff: cannot read {error}", file=sys.stderr)
        return TROUBLE

    if args.html is not None:
        return write_page(Path(args.html), left_lines, right_lines, names, labels, title=_title(args))

    rows = align_files(left_lines, right_lines)
    width = args.width or terminal_width()
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    try:
        if colour:
            from rich.console import Console

            from mhsa.diff.render_rich import render_rich

            console = Console(force_terminal=True, width=width, highlight=False, soft_wrap=True, markup=False, emoji=False)
            render_rich(rows, console, width, *names, left_lines, right_lines, labels=labels)
        else:
            sys.stdout.write(render_plain(rows, width, *names, labels=labels))
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader stopped early (`| head`): not an error; keep Python quiet at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def write_page(target: Path, left_lines: list[str], right_lines: list[str], names: tuple[str, str], labels: tuple[str, str], title: str) -> int:
    if not target.parent.is_dir():
        print(f"mhsa diff: cannot write {target}: folder {target.parent} does not exist", file=sys.stderr)
        return TROUBLE
    page = render_html(left_lines, right_lines, *names, title=title, labels=labels)
    try:
        write_atomically(target, page.encode("utf-8"))
    except OSError as error:
        print(f"mhsa diff: cannot write {target}: {error.strerror or error}", file=sys.stderr)
        return TROUBLE
    print(f"wrote {target}: {summary(align_files(left_lines, right_lines), labels)}")
    return 0


def _title(args) -> str:
    """'mhsa diff attention', with the sides spelled out when they are not the default."""
    sides = "" if (args.left, args.right) == default_sides() else f" --left {args.left} --right {args.right}"
    return f"mhsa diff {args.name}{sides}"
