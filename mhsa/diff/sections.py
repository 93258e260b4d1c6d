"""Split one Python file's lines into sections: the unit `mhsa diff` pairs across files.

A section is a preamble, one top-level class or function (and one per method inside a
class), one numbered step comment (`# 5. mask: ...`) up to the next boundary, or module-level
code after a definition. Pure: lines in, Sections out; nothing is imported or executed.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field

# a section comment: the stripped line is `# <N>. <words>`
SECTION_RE = re.compile(r"^#\s+(\d+)\.\s+(.+)$")
HEADER_RE = re.compile(r"^(?:async\s+def|def|class)\s+([A-Za-z_]\w*)")


@dataclass
class Section:
    """A run of consecutive lines: kind 'preamble', 'def' (class/function/method header
    and body up to its first section comment), 'step' (from a section comment) or 'code'
    (module-level statements after a definition)."""

    kind: str
    title: str  # what the header row shows
    scope: str  # enclosing 'Class.method' or 'function' as written, '' at module level
    start: int  # 1-based line number of lines[0]
    lines: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple:
        """What pairs a section with its mirror: same kind, same scope, same title."""
        scope = normal_scope(self.scope)
        if self.kind == "def":
            return ("def", self.title.split(" ", 1)[0], scope)
        if self.kind == "preamble":
            return ("preamble",)
        return (self.kind, scope, self.title)


def normal_scope(scope: str) -> str:
    """'Block.forward' (torch) and 'Block.__call__' (flax) are the same method."""
    head, dot, last = scope.rpartition(".")
    return f"{head}.__call__" if dot and last == "forward" else scope


def _scan(lines: list[str]) -> tuple[set[int], set[int]]:
    """(lines where a statement starts, lines that hold only a comment), 1-based.

    tokenize keeps text inside strings and continuation lines (a closing `):` at column 0)
    from looking like code or comments; if the file does not tokenize, every line counts.
    """
    starts: set[int] = set()
    comments: set[int] = set()
    at_start = True
    try:
        for tok in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline):
            if tok.type == tokenize.NEWLINE:
                at_start = True
            elif tok.type == tokenize.COMMENT:
                if not tok.line[: tok.start[1]].strip():
                    comments.add(tok.start[0])
            elif tok.type not in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
                if at_start:
                    starts.add(tok.start[0])
                at_start = False
    except (tokenize.TokenError, SyntaxError):
        everything = set(range(1, len(lines) + 1))
        return everything, {n for n in everything if lines[n - 1].lstrip().startswith("#")}
    return starts, comments


def split_sections(lines: list[str]) -> list[Section]:
    """Split one file's lines into sections, in order; every line lands in exactly one."""
    starts, comments = _scan(lines)
    sections = [Section("preamble", "preamble", "", 1)]
    top = ""  # current top-level class or function, '' at module level
    in_class = False
    body_indent: int | None = None  # indent of the current class body
    method = ""  # current method (or nested class) of that class
    pending = False  # the last section holds only decorators so far

    def start(kind: str, title: str, scope: str, n: int, attach: bool = False) -> None:
        # comment lines right above a definition (no blank between) belong to it
        previous = sections[-1]
        moved: list[str] = []
        if attach:
            indent = _indent(lines[n - 1])
            while previous.lines:
                m = previous.start + len(previous.lines) - 1
                text = previous.lines[-1]
                if m in comments and _indent(text) == indent and not SECTION_RE.match(text.strip()):
                    moved.insert(0, previous.lines.pop())
                else:
                    break
        sections.append(Section(kind, title, scope, n - len(moved), moved))

    for n, line in enumerate(lines, 1):
        stripped = line.strip()
        indent = _indent(line)
        section = SECTION_RE.match(stripped) if n in comments else None
        if section:
            pending = False
            start("step", stripped[1:].strip(), f"{top}.{method}" if method else top, n)
        elif n in starts:
            header = HEADER_RE.match(stripped)
            decorator = stripped.startswith("@")
            if indent == 0:
                if header or decorator:
                    name = header.group(1) if header else ""
                    if header and pending:
                        sections[-1].title, sections[-1].scope = _def_title(stripped, name), name
                    elif header or not pending:
                        start("def", _def_title(stripped, name) if header else "", name, n, attach=True)
                    pending = decorator
                    top, method, in_class, body_indent = name, "", stripped.startswith("class"), None
                elif top:
                    # module-level code after a definition: its own section
                    start("code", stripped, "", n, attach=True)
                    top, method, in_class, body_indent = "", "", False, None
                    pending = False
            elif in_class:
                if body_indent is None:
                    body_indent = indent
                if indent == body_indent and (header or decorator):
                    name = header.group(1) if header else ""
                    title = _def_title(stripped, f"{top}.{name}")
                    if header and pending:
                        sections[-1].title, sections[-1].scope = title, f"{top}.{name}"
                    elif header or not pending:
                        start("def", title if header else "", f"{top}.{name}", n, attach=True)
                    pending = decorator
                    method = name
                elif indent == body_indent and method:
                    # a class-level statement after a method
                    start("code", stripped, top, n)
                    method, pending = "", False
        sections[-1].lines.append(line)
    return [s for s in sections if s.lines]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _def_title(stripped: str, qualified: str) -> str:
    return f"{'class' if stripped.startswith('class') else 'def'} {qualified}"
