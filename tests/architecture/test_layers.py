"""The layers of docs/DESIGN.md, enforced on the source, statically (ast: no module is imported):

- the contract (shared/) imports no implementation, no tool, no command-line or presentation
  library;
- an implementation (numpy_ref/, torch_impl/, jax_impl/) imports only the contract and itself;
- a tool (mhsa/) reaches the implementations only through mhsa.registry, and imports a framework
  only where FRAMEWORK_USERS says why;
- no import cycle between files: every import counts, also inside a function; only imports under
  `if TYPE_CHECKING:` are exempt (they never run);
- no function is over 100 lines.

Every import statement counts, and every importlib.import_module("...") literal. The one
exception to the layers: the `if __name__ == "__main__":` launcher at the top of an
implementation's train.py, which hands the command line to mhsa.launch before the library
part of the file is even executed.
"""

import ast
import functools
from pathlib import Path

import pytest

from mhsa import registry
from tests.paths import ROOT

IMPLEMENTATIONS = sorted(backend.package for backend in registry.REGISTRY.values())
PACKAGES = ["shared", *IMPLEMENTATIONS, "mhsa"]
FRAMEWORKS = ("torch", "jax", "jaxlib", "flax", "optax", "equinox")
# what the contract may not import: it is formats and checks, not commands or pictures
PRESENTATION = ("argparse", "matplotlib", "rich", "tqdm", "pygments")
# the tools that import a framework themselves, and why; every other tool reaches one through a backend.
# A folder ending in "/" holds one reader of the port check: every file in it may import its own
# frameworks, and only those.
FRAMEWORK_USERS = {
    "mhsa/port_check/readers/torch/": (("torch",), "reads and trains any user's torch.nn.Module, which is no backend of the registry"),
    "mhsa/port_check/readers/flax/": (
        ("jax", "jaxlib", "flax", "optax"),
        "reads and trains any user's Flax NNX module or Linen pair, which is no backend of the registry",
    ),
    "mhsa/port_check/readers/equinox/": (
        ("jax", "jaxlib", "equinox", "optax"),
        "reads and trains any user's eqx.Module (Equinox, an optional extra), which is no backend of the registry",
    ),
    "mhsa/port_check/readers/jaxpr.py": (("jax",), "reads a traced JAX program, for every reader of a JAX library"),
    "mhsa/port_check/readers/optax_steps.py": (("jax", "optax"), "runs optax the same way for every JAX library's trainer of --train"),
    "mhsa/port_check/readers/jax_program.py": (("jax",), "runs a JAX model as one program of its arrays, for every reader of a JAX library"),
    "mhsa/port_check/readers/marks.py": (("jax",), "records a JAX model's calls inside its own transformations, for every reader of a JAX library"),
    "mhsa/port_check/readers/jax_widened.py": (
        ("jax",),
        "widens a traced JAX program's float32 to float64 for the float64 twin, for every reader of a JAX library",
    ),
    "mhsa/compile_cache.py": (("jax",), "turns on JAX's own persistent compilation cache for the commands that run JAX"),
}


def may_import_framework(path: Path, top: str) -> bool:
    """Whether the tool at `path` may import the framework package `top` itself."""
    posix = path.as_posix()
    return any(
        (posix == user or (user.endswith("/") and posix.startswith(user))) and top in allowed for user, (allowed, _) in FRAMEWORK_USERS.items()
    )


LONGEST_FUNCTION = 100  # lines, decorators and docstring included


# the port check's own layers, lowest first: a file imports only its own layer and those below it,
# and a reader (a folder: readers/torch/, readers/flax/) no other reader, though a JAX library's
# reader may use the files beside the folders (readers/jaxpr.py, jax_program.py, marks.py,
# jax_widened.py, optax_steps.py); command.py, factories.py and files.py sit at the top, above the report
PORT_CHECK = "mhsa.port_check"
PORT_CHECK_LAYERS = ("core", "readers", "forward", "training", "report")


def port_check_rank(module: str) -> int | None:
    """The port check layer's rank of `module` (the package itself counts as the top), None
    outside the port check."""
    if module != PORT_CHECK and not module.startswith(PORT_CHECK + "."):
        return None
    part = module.split(".")[2] if module.count(".") >= 2 else ""
    return PORT_CHECK_LAYERS.index(part) if part in PORT_CHECK_LAYERS else len(PORT_CHECK_LAYERS)


def port_check_violation(module: str, name: str) -> str | None:
    """Why `module` may not import `name` within the port check, or None."""
    own, target = port_check_rank(module), port_check_rank(name)
    if own is None or target is None:
        return None
    if target > own:
        return f"{module} imports {name}, a layer above its own"
    reader, other = _reader_folder(module), _reader_folder(name)
    if own == target == PORT_CHECK_LAYERS.index("readers") and reader and other and reader != other:
        return f"the {reader} reader imports another reader, {name}"
    return None


def _reader_folder(module: str) -> str | None:
    """The reader folder (readers/torch/, ...) `module` is in, by its name; None for the files
    beside the folders (readers/protocol.py, readers/jaxpr.py) and outside the readers."""
    parts = module.split(".")
    inside = len(parts) > 4 and parts[:3] == [*PORT_CHECK.split("."), "readers"]
    return parts[3] if inside and (ROOT / "mhsa" / "port_check" / "readers" / parts[3]).is_dir() else None


def layer_of(module: str) -> str | None:
    """'contract', 'tool', 'implementation' for this project's modules, None for the rest."""
    top = module.split(".")[0]
    if top in IMPLEMENTATIONS:
        return "implementation"
    if top == "mhsa":
        return "tool"
    if top == "shared":
        return "contract"
    return None


def _skipped(tree: ast.Module, skip_main_launcher: bool) -> set[int]:
    """The nodes whose imports never run (under `if TYPE_CHECKING:`) or that the layers exempt
    (a trainer's `__main__` launcher)."""
    skipped = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = ast.unparse(node.test)
        if test in ("TYPE_CHECKING", "typing.TYPE_CHECKING") or (skip_main_launcher and test == "__name__ == '__main__'" and node in tree.body):
            skipped.update(id(child) for child in ast.walk(node))
    return skipped


def _called(function: ast.expr) -> str:
    """The name a call calls by: `import_module` of importlib.import_module(...), '' for a call of
    an expression (ast.unparse would say the same, at many times the cost over every call of the project)."""
    return function.attr if isinstance(function, ast.Attribute) else function.id if isinstance(function, ast.Name) else ""


@functools.cache  # every file is read by several tests (layers, cycles, planted cycles)
def parsed(source: str) -> ast.Module:
    return ast.parse(source)


@functools.cache
def imports(source: str, skip_main_launcher: bool = False) -> tuple[tuple[str, ...], ...]:
    """Per import statement, the modules it may import (absolute names; `from shared import
    weights` may be shared.weights), including string literals passed to importlib.import_module.
    Imports under `if TYPE_CHECKING:` never run and are left out."""
    tree = parsed(source)
    skipped = _skipped(tree, skip_main_launcher)
    found: list[tuple[str, ...]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name,) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, *(f"{node.module}.{alias.name}" for alias in node.names)))
        elif isinstance(node, ast.Call) and _called(node.func).endswith("import_module") and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.args[0].value,))
    return tuple(found)


def violations(path: Path, source: str) -> list[str]:
    """What the file at `path` (relative to the repository) imports against the layer rules."""
    module = ".".join(path.with_suffix("").parts)
    own = layer_of(module)
    own_package = module.split(".")[0]
    found = []
    for statement in imports(source, skip_main_launcher=own == "implementation" and path.name == "train.py"):
        for name in statement:  # one finding per statement
            target, top = layer_of(name), name.split(".")[0]
            if own == "contract" and target in ("implementation", "tool"):
                found.append(f"{path}: the contract imports {target} {name}")
            elif own == "contract" and top in PRESENTATION:
                found.append(f"{path}: the contract imports {name}, a command-line or presentation library (the tools' business)")
            elif own == "implementation" and target == "tool":
                found.append(f"{path}: an implementation imports the tool {name}")
            elif own == "implementation" and target == "implementation" and top != own_package:
                found.append(f"{path}: an implementation imports another implementation, {name}")
            elif own == "tool" and target == "implementation":
                found.append(f"{path}: a tool imports {name} directly instead of through mhsa.registry")
            elif own == "tool" and top in FRAMEWORKS and not may_import_framework(path, top):
                found.append(f"{path}: a tool imports the framework {name} instead of reaching it through a backend of mhsa.registry")
            elif own == "tool" and (why := port_check_violation(module, name)):
                found.append(f"{path}: in the port check, {why}")
            else:
                continue
            break
    return found


def project_files() -> list[Path]:
    files = [path.relative_to(ROOT) for folder in PACKAGES for path in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 40, files  # the walk found the project
    return files


def module_name(path: Path) -> str:
    parts = path.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the project modules it imports (every import that can run, in a function too).
    `from a import b` is an edge to a.b where a.b is a module of the project, else to a."""
    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        edges = set()
        for statement in imports(source):
            target = next((name for name in reversed(statement) if name in sources), None)
            if target is None and statement[0] in sources:
                target = statement[0]
            if target is not None and target != module:
                edges.add(target)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan), each as a sorted list:
    a group is a cycle of imports, whatever its length."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for neighbour in sorted(graph.get(node, ())):
            if neighbour not in index:
                visit(neighbour)
                low[node] = min(low[node], low[neighbour])
            elif neighbour in on_stack:
                low[node] = min(low[node], index[neighbour])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def project_sources() -> dict[str, str]:
    return {module_name(path): (ROOT / path).read_text() for path in project_files()}


def long_functions(path: Path, source: str, limit: int = LONGEST_FUNCTION) -> list[str]:
    found = []
    for node in ast.walk(parsed(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
            length = node.end_lineno - start + 1
            if length > limit:
                found.append(f"{path}:{start} {node.name} is {length} lines (at most {limit})")
    return found


def test_every_module_keeps_to_its_layer():
    found = [line for path in project_files() for line in violations(path, (ROOT / path).read_text())]
    assert found == [], "\n".join(found)


def test_no_two_files_import_each_other_even_inside_a_function():
    found = cycles(import_graph(project_sources()))
    assert found == [], "import cycles:\n" + "\n".join(" <-> ".join(group) for group in found)


def test_no_function_is_over_100_lines():
    found = [line for path in project_files() for line in long_functions(path, (ROOT / path).read_text())]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    "path, source, expected",
    [
        ("shared/weights.py", "import torch_impl.model\n", "the contract imports implementation torch_impl.model"),
        ("shared/config.py", "from mhsa import registry\n", "the contract imports tool mhsa"),
        ("shared/checkpoint.py", "import argparse\n", "the contract imports argparse, a command-line or presentation library"),
        ("shared/history.py", "def plot():\n    import matplotlib.pyplot as plt\n", "the contract imports matplotlib.pyplot"),
        ("torch_impl/model.py", "from mhsa.heatmap import ascii_heatmap\n", "an implementation imports the tool"),
        ("jax_impl/train.py", "def f():\n    from mhsa import cli\n", "an implementation imports the tool"),
        ("jax_impl/model.py", "import torch_impl.attention\n", "imports another implementation"),
        ("mhsa/heads.py", "import importlib\nimportlib.import_module('jax_impl.model')\n", "instead of through mhsa.registry"),
        ("mhsa/parity/command.py", "def configure():\n    import torch\n", "a tool imports the framework torch"),
        ("mhsa/port_check/core/records.py", "from mhsa.port_check.readers import reader_of\n", "a layer above its own"),
        ("mhsa/port_check/readers/torch/reader.py", "from mhsa.port_check.forward import rows\n", "a layer above its own"),
        ("mhsa/port_check/readers/torch/reader.py", "from mhsa.port_check.readers.flax import reader\n", "another reader"),
        ("mhsa/port_check/readers/flax/reader.py", "import torch\n", "imports the framework torch"),
    ],
)
def test_a_planted_violation_is_found(path, source, expected):
    found = violations(Path(path), source)
    assert len(found) == 1 and expected in found[0], found


def test_the_main_launcher_of_a_trainer_is_the_one_exception():
    source = 'if __name__ == "__main__":\n    from mhsa.launch import main\n'
    assert violations(Path("torch_impl/train.py"), source) == []
    assert violations(Path("torch_impl/model.py"), source) != []  # only in train.py


def test_a_planted_cycle_is_found_inside_a_function_and_type_checking_imports_are_not():
    sources = project_sources()
    # torch_impl.train already imports torch_impl.model; a function of model.py importing train back closes a cycle
    planted = dict(sources, **{"torch_impl.model": sources["torch_impl.model"] + "\n\ndef planted():\n    from torch_impl import train\n"})
    assert ["torch_impl.model", "torch_impl.train"] in cycles(import_graph(planted))
    # a three-file cycle is one group
    three = {"a": "import b\n", "b": "from c import x\n", "c": "def f():\n    import a\n", "d": "import a\n"}
    assert cycles(import_graph(three)) == [["a", "b", "c"]]
    exempt = dict(sources, **{"torch_impl.model": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from torch_impl import train\n"})
    assert cycles(import_graph(exempt)) == []


def test_a_planted_long_function_is_found():
    body = "".join(f"    x{i} = {i}\n" for i in range(100))
    assert long_functions(Path("mhsa/planted.py"), f"def planted():\n{body}") == ["mhsa/planted.py:1 planted is 101 lines (at most 100)"]
    assert long_functions(Path("mhsa/planted.py"), f"def planted():\n{body[: -len('    x99 = 99') - 1]}") == []
