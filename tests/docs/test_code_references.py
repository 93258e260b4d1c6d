"""The docs' references to code are true: every file path, `path:name` and dotted
`package.module.name` that README.md and docs/*.md cite in backticks exists in the checkout,
and the name is defined in that file (read with ast, nothing imported). A placeholder path
(`torch_impl/X.py`, `X_impl/train.py`) names no file and is skipped."""

import ast
import re
import subprocess

import pytest

from tests.paths import ROOT

DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
PACKAGES = ("shared", "torch_impl", "jax_impl", "numpy_ref", "mhsa", "benchmarks", "examples", "tests")
# `torch_impl/train.py`, `train.py`, `shared/checks.py:check_tokens`, `readers/torch/dataflow.py`
PATH_RE = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.(?:py|md|toml|txt|sh|json|png|html))(?::([A-Za-z_][\w.]*))?`")
# `shared.weights.init_weights`, `jax_impl.parallel.prepare(N)`
DOTTED_RE = re.compile(rf"`((?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+)(?:\([^`]*\))?`")
PLACEHOLDER_RE = re.compile(r"(^|/)(X|NAME|X_impl)(/|\.py$)")


def tracked() -> list[str]:
    return subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True).stdout.split()


def defined(source: str) -> set[str]:
    """Names a module defines at its top level, and Class.method for its classes' methods."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {f"{node.name}.{item.name}" for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {target.id for target in targets if isinstance(target, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def references() -> list[tuple[str, str, str | None]]:
    """(doc, path, name or None) for every code reference of every doc."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        found += [(doc.name, path, name or None) for path, name in PATH_RE.findall(text) if not PLACEHOLDER_RE.search(path)]
        for dotted in DOTTED_RE.findall(text):
            found.append((doc.name, *split_dotted(dotted)))
    return sorted(set(found), key=str)


def split_dotted(dotted: str) -> tuple[str, str | None]:
    """`a.b.c` as (the longest prefix that is a module or package, the rest or None)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = "/".join(parts[:cut])
        for path in (f"{base}.py", f"{base}/__init__.py"):
            if (ROOT / path).is_file():
                return path, ".".join(parts[cut:]) or None
    return dotted.replace(".", "/") + ".py", None


FILES = tracked()


def problem(doc: str, path: str, name: str | None) -> str | None:
    """What is false about one reference, or None. A bare file name (`train.py`) or a path inside
    a package (`readers/torch/dataflow.py`) is found where some tracked file ends with it."""
    matches = [file for file in FILES if file == path or file.endswith("/" + path)]
    if not matches:
        return f"{doc} cites `{path}`, which no file of the checkout is"
    if name is not None and not [file for file in matches if file.endswith(".py") and name in defined((ROOT / file).read_text(encoding="utf-8"))]:
        return f"{doc} cites `{path}` for {name!r}, which {', '.join(matches)} does not define"
    return None


@pytest.mark.parametrize("doc, path, name", references(), ids=lambda value: str(value))
def test_each_cited_path_and_name_exists(doc, path, name):
    assert problem(doc, path, name) is None, problem(doc, path, name)


def test_the_references_are_found_and_a_false_one_fails():
    cited = references()
    assert len(cited) > 50 and any(name for _, _, name in cited)  # the patterns find the docs' references
    assert split_dotted("shared.weights.init_weights") == ("shared/weights.py", "init_weights")
    assert problem("doc", "torch_impl/train.py", "train_step") is None
    wrong_name = "doc cites `torch_impl/train.py` for 'FusedAdam', which torch_impl/train.py does not define"
    assert problem("doc", "torch_impl/train.py", "FusedAdam") == wrong_name
    assert problem("doc", "torch_impl/startup.py", None) == "doc cites `torch_impl/startup.py`, which no file of the checkout is"
