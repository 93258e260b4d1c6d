"""The layers of docs/DESIGN.md, enforced on the source: the contract (shared/*.py) imports
no implementation and no tool; an implementation imports only the contract (and itself); a
tool reaches the implementations only through shared.tools.registry. Checked statically, on
every import statement and every importlib.import_module("...") literal.

The one allowed exception: the `if __name__ == "__main__":` launcher at the top of an
implementation's train.py, which hands the command line to shared.tools.train_cli before the
library part of the file is even executed.
"""

import ast
from pathlib import Path

import pytest

from shared.tools import registry

ROOT = Path(__file__).resolve().parent.parent
IMPLEMENTATIONS = sorted(backend.package for backend in registry.REGISTRY.values())


def layer_of(module: str) -> str | None:
    """'contract', 'tool', 'implementation' for this project's modules, None for the rest."""
    top = module.split(".")[0]
    if top in IMPLEMENTATIONS:
        return "implementation"
    if module == "shared.tools" or module.startswith("shared.tools."):
        return "tool"
    if top == "shared":
        return "contract"
    return None


def imports(source: str, skip_main_launcher: bool) -> list[list[str]]:
    """Per import statement, the modules it may import (absolute names; `from shared import
    weights` may be shared.weights), including string literals passed to importlib.import_module."""
    tree = ast.parse(source)
    skipped = set()
    if skip_main_launcher:
        for node in tree.body:
            if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
                skipped.update(id(child) for child in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [[alias.name] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append([node.module] + [f"{node.module}.{alias.name}" for alias in node.names])
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args and isinstance(node.args[0], ast.Constant):
            found.append([node.args[0].value])
    return found


def violations(path: Path, source: str) -> list[str]:
    """What the file at `path` (relative to the repository) imports against the layer rules."""
    module = ".".join(path.with_suffix("").parts)
    own = layer_of(module)
    own_package = module.split(".")[0]
    found = []
    for statement in imports(source, skip_main_launcher=own == "implementation" and path.name == "train.py"):
        for name in statement:  # one finding per statement
            target = layer_of(name)
            if own == "contract" and target in ("implementation", "tool"):
                found.append(f"{path}: the contract imports {target} {name}")
            elif own == "implementation" and target == "tool":
                found.append(f"{path}: an implementation imports the tool {name}")
            elif own == "implementation" and target == "implementation" and name.split(".")[0] != own_package:
                found.append(f"{path}: an implementation imports another implementation, {name}")
            elif own == "tool" and target == "implementation":
                found.append(f"{path}: a tool imports {name} directly instead of through shared.tools.registry")
            else:
                continue
            break
    return found


def project_files() -> list[Path]:
    folders = ["shared", *IMPLEMENTATIONS]
    files = [path.relative_to(ROOT) for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 20, files  # the walk found the project
    return files


def test_every_module_keeps_to_its_layer():
    found = [line for path in project_files() for line in violations(path, (ROOT / path).read_text())]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    "path, source, expected",
    [
        ("shared/weights.py", "import torch_impl.model\n", "the contract imports implementation torch_impl.model"),
        ("shared/config.py", "from shared.tools import registry\n", "the contract imports tool shared.tools"),
        ("torch_impl/model.py", "from shared.tools.heatmap import ascii_heatmap\n", "an implementation imports the tool"),
        ("jax_impl/train.py", "def f():\n    from shared.tools import cli\n", "an implementation imports the tool"),
        ("jax_impl/model.py", "import torch_impl.attention\n", "imports another implementation"),
        ("shared/tools/heads.py", "import importlib\nimportlib.import_module('jax_impl.model')\n", "instead of through shared.tools.registry"),
    ],
)
def test_a_planted_violation_is_found(path, source, expected):
    found = violations(Path(path), source)
    assert len(found) == 1 and expected in found[0], found


def test_the_main_launcher_of_a_trainer_is_the_one_exception():
    source = 'if __name__ == "__main__":\n    from shared.tools.train_cli import main\n'
    assert violations(Path("torch_impl/train.py"), source) == []
    assert violations(Path("torch_impl/model.py"), source) != []  # only in train.py
