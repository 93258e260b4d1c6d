"""Every backend with the "layers" capability (torch_impl, jax_impl) mirrors the first one
file for file (DESIGN.md, Mirroring): for every X.py in any of them, each has X.py, with the
same section comments, the same public classes, methods, functions and argument names, and
the same shape comments, in the same order. The packages come from the registry and the
files from disk at collection time, so a new file (or a deleted twin) is checked without
editing this test. Read with ast and tokenize only, so no framework is imported; the checker
is itself tested on a drifted pair."""

import ast
import difflib
import io
import re
import textwrap
import tokenize

import pytest

from mhsa import registry
from mhsa.diff.sections import SECTION_RE
from tests.paths import ROOT

MIRRORED = registry.names("layers")  # the first is the reference the others mirror
PACKAGES = [registry.get(name).package for name in MIRRORED]


def module_names(package: str) -> set[str]:
    """X for every X.py of a package on disk (its __init__.py aside)."""
    return {path.stem for path in (ROOT / package).glob("*.py") if path.name != "__init__.py"}


# every file any mirrored package has, against the reference: a file missing on one side
# is still collected (from the other side) and fails; no file is one framework's alone
PAIRS = [(PACKAGES[0], other, name) for other in PACKAGES[1:] for name in sorted(set().union(*(module_names(p) for p in (PACKAGES[0], other))))]
ASPECTS = ("sections", "signatures", "shapes")
# a trailing comment that states a shape: `# (B, H, T, d_head)`, `# 3 x (B, T, D)`
SHAPE_RE = re.compile(r"^#\s*(?:\d+\s*x\s*)?\(.*\)")
# the differences the frameworks themselves prescribe: Flax NNX layers take their random keys as
# `rngs`, and the mask is a non-Param variable (docs/DESIGN.md, "The block")
JAX_ONLY_KEYWORDS = {"rngs"}  # jax_impl constructors take `*, rngs`
JAX_ONLY_BASES = {"nnx.Variable"}  # the mask is "a non-Param nnx.Variable subclass in Flax"
# per file, what truly differs between an eager, stateful framework and a functional, compiled
# one. Signatures: name -> (torch arguments, jax arguments, why), exact, so any further drift
# still fails. One-sided functions: name -> (side, why), "left" = the reference package; their
# section and shape comments are theirs alone and are not compared.
FILE_SIGNATURES = {
    "model": {
        "grads_to_exchange": (("model",), ("grads",), "torch keeps gradients on the parameters; nnx.grad returns them as a State"),
    },
    "train": {
        "train_steps": (
            ("model", "optimizer", "batches", "step"),
            ("graphdef", "state", "batches"),
            "torch updates model and optimizer in place, one eager step at a time or its opt-in compiled step; JAX threads "
            "the split state through a compiled scan (splitting the objects again at every run of steps would cost time in every run)",
        ),
        "train": (
            ("model_config", "train_config", "init", "on_step", "resume", "on_epoch", "device", "compile"),
            ("model_config", "train_config", "init", "on_step", "resume", "on_epoch", "device"),
            "torch's compiler is opt-in (torch.compile); every JAX run is compiled (its scanned steps)",
        ),
    },
    "parallel": {
        "train_epoch": (
            ("model", "optimizer", "batches", "device"),
            ("graphdef", "state", "batches", "mesh", "shard"),
            "torch: in-place state, this rank's shard already chosen; JAX: split state, every shard placed on the mesh",
        ),
    },
}
ONE_SIDED = {
    "model": {
        "assign_exchange": (
            "right",
            "Flax kernels are transposed on the way in; torch's layout is the exchange layout "
            "(load_state_dict, and Adam's moments are used as they are)",
        ),
    },
    "compiled": {
        "compile_step": ("left", "torch.compile of the whole step, opt-in (train(compile=True)); JAX compiles every run"),
        "scan_steps": ("right", "the jax.lax.scan of train_step under jax.jit, on split state; torch's default steps run eagerly"),
        "run_steps": ("right", "a run of steps queued on XLA without waiting; eager torch computes as it goes"),
        "read_one_run_late": ("right", "the host reads a run's losses once XLA has the next run; eager torch has nothing queued"),
        "zeros_model": (
            "right",
            "Flax runs a model's random initializers eagerly, compiling a small program per parameter shape; torch compiles nothing",
        ),
        "zeros_optimizer": ("right", "optax's zeros_like per parameter shape compiles eagerly too; torch.optim.Adam builds its state lazily"),
    },
    "parallel": {
        "train_rank": ("left", "torch runs one process per rank: this is the body of each process"),
        "free_port": ("left", "the processes meet on a loopback port; a JAX mesh lives in one process"),
        "place": ("right", "JAX puts each shard on its device by hand (make_array_from_single_device_arrays)"),
    },
}


def method_name(name: str) -> str:
    return "__call__" if name == "forward" else name


def is_public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def signature(node, drop=()) -> tuple[str, ...]:
    """Argument names in order, with '/', '*' and '**' where Python puts them."""
    args = node.args
    names = [a.arg for a in args.posonlyargs] + (["/"] if args.posonlyargs else [])
    names += [a.arg for a in args.args]
    keywords = [a.arg for a in args.kwonlyargs if a.arg not in drop]
    if args.vararg:
        names.append(f"*{args.vararg.arg}")
    elif keywords:
        names.append("*")
    names += keywords
    if args.kwarg:
        names.append(f"**{args.kwarg.arg}")
    return tuple(names)


def outline(source: str, jax: bool = False) -> list[tuple[str, tuple[str, ...]]]:
    """Public top-level functions and classes, and the public (or dunder) methods of each
    class, as ('name' or 'Class.method', argument names) in file order."""
    drop = JAX_ONLY_KEYWORDS if jax else ()
    items = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_public(node.name):
            items.append((node.name, signature(node, drop)))
        elif isinstance(node, ast.ClassDef) and is_public(node.name):
            if jax and {ast.unparse(base) for base in node.bases} & JAX_ONLY_BASES:
                continue
            items.append((f"class {node.name}", ()))
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_public(item.name):
                    items.append((f"{node.name}.{method_name(item.name)}", signature(item, drop)))
    return items


def comments(source: str) -> list[tuple[int, str, bool]]:
    """(line, text, trailing) for every comment; trailing = code before it on its line."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found.append((tok.start[0], tok.string.strip(), bool(tok.line[: tok.start[1]].strip())))
    return found


def scopes(source: str) -> list[tuple[int, int, str]]:
    """(first line, last line, 'Class.method') of every class and function, outer first."""
    spans = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{method_name(child.name) if prefix else child.name}"
                spans.append((child.lineno, child.end_lineno, name))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return spans


def section_comments(source: str, skip=()) -> list[str]:
    """'scope: N. words' for every section comment, in order (numbering restarts per function),
    except inside the top-level functions named in `skip`."""
    spans = scopes(source)
    out = []
    for line, text, trailing in comments(source):
        if not trailing and SECTION_RE.match(text):
            inside = [name for first, last, name in spans if first <= line <= last]
            if inside and inside[0] in skip:
                continue
            out.append(f"{inside[-1] if inside else '<module>'}: {text[1:].strip()}")
    return out


def shape_comments(source: str, skip=()) -> list[str]:
    spans = [(first, last) for first, last, name in scopes(source) if name in skip]
    return [
        text
        for line, text, trailing in comments(source)
        if trailing and SHAPE_RE.match(text) and not any(first <= line <= last for first, last in spans)
    ]


def _difference(what: str, torch_items: list, jax_items: list, names: tuple[str, str]) -> list[str]:
    if torch_items == jax_items:
        return []
    lines = difflib.unified_diff([str(i) for i in torch_items], [str(i) for i in jax_items], *names, lineterm="", n=1)
    return [f"{what} differ:"] + [f"    {line}" for line in lines]


def mirror_problems(
    torch_source: str, jax_source: str, aspects=ASPECTS, names: tuple[str, str] = tuple(PACKAGES[:2]), file: str | None = None
) -> list[str]:
    """Every way the jax file drifts from the torch file; empty when they mirror. `names`
    (the two packages) name the sides in the messages; `file` (e.g. "parallel") picks the
    known one-sided functions and signatures of that file."""
    left, right = names
    one_sided = ONE_SIDED.get(file, {})
    left_only = {name for name, (side, _) in one_sided.items() if side == "left"}
    right_only = {name for name, (side, _) in one_sided.items() if side == "right"}
    known = FILE_SIGNATURES.get(file, {})
    problems = []
    if "sections" in aspects:
        problems += _difference("section comments", section_comments(torch_source, left_only), section_comments(jax_source, right_only), names)
    if "signatures" in aspects:
        torch_outline, jax_outline = outline(torch_source), outline(jax_source, jax=True)
        torch_outline = [(name, args) for name, args in torch_outline if _owner(name) not in left_only]
        jax_outline = [(name, args) for name, args in jax_outline if _owner(name) not in right_only]
        torch_names, jax_names = dict(torch_outline), dict(jax_outline)
        for name, args in torch_outline:
            if name not in jax_names:
                problems.append(f"{name} is in {left} only")
            elif known.get(name, (None, None))[:2] == (args, jax_names[name]):
                continue
            elif jax_names[name] != args:
                problems.append(f"{name} takes ({', '.join(args)}) in {left} but ({', '.join(jax_names[name])}) in {right}")
        problems += [f"{name} is in {right} only" for name, _ in jax_outline if name not in torch_names]
        common = [name for name, _ in torch_outline if name in jax_names]
        problems += _difference("the order of classes and functions", common, [name for name, _ in jax_outline if name in torch_names], names)
    if "shapes" in aspects:
        problems += _difference("shape comments", shape_comments(torch_source, left_only), shape_comments(jax_source, right_only), names)
    return problems


def _owner(name: str) -> str:
    # 'class Adam', 'Adam.step' and 'Adam' all belong to the top-level name Adam
    return name.removeprefix("class ").split(".")[0]


def test_there_is_something_to_mirror():
    # the parametrizations below come from the registry and the disk: neither may be empty
    assert len(MIRRORED) >= 2, f"registry.names('layers') = {MIRRORED}: nothing mirrors anything"
    for package in PACKAGES:
        assert {"attention", "model"} <= module_names(package), f"{package} lacks attention.py or model.py"
    assert {name for _, _, name in PAIRS} >= {"attention", "model"}


@pytest.mark.parametrize("aspect", ASPECTS)
@pytest.mark.parametrize("reference, other, name", PAIRS, ids=[f"{o}-{n}" for _, o, n in PAIRS])
def test_each_backend_mirrors_the_reference(reference, other, name, aspect):
    paths = [ROOT / package / f"{name}.py" for package in (reference, other)]
    missing = [str(path.relative_to(ROOT)) for path in paths if not path.exists()]
    assert not missing, (
        f"{' and '.join(missing)} missing: {reference}/{name}.py and {other}/{name}.py "
        "mirror each other file for file (write the twin, or remove both)"
    )
    sources = [path.read_text(encoding="utf-8") for path in paths]
    assert outline(sources[0]), f"{reference}/{name}.py has no public class or function to mirror"
    problems = mirror_problems(*sources, aspects=(aspect,), names=(reference, other), file=name)
    assert not problems, f"{reference}/{name}.py and {other}/{name}.py have drifted apart (see `mhsa diff {name}`):\n" + "\n".join(problems)


# --- the checker itself ----------------------------------------------------------------------

TORCH = textwrap.dedent("""\
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self, d_model, n_heads, max_len, bias=True, *, dtype=torch.float32):
            super().__init__()
            self.proj = nn.Linear(d_model, 3 * d_model, bias=bias, dtype=dtype)

        def forward(self, x, mask=None, return_weights=False):
            # 1. project
            qkv = self.proj(x)  # (B, T, 3D)

            # 2. split
            q, k, v = qkv.split(x.shape[-1], dim=-1)  # 3 x (B, T, D)
            return q + k + v  # (B, T, D)

        def _helper(self):
            return 0


    def from_exchange(arrays, config):
        # 1. build
        return Block(**config)
    """)

JAX = textwrap.dedent('''\
    import jax.numpy as jnp
    from flax import nnx


    class CausalMask(nnx.Variable):
        """The jax side of register_buffer: allowed by DESIGN.md."""


    class Block(nnx.Module):
        def __init__(self, d_model, n_heads, max_len, bias=True, *, dtype=jnp.float32, rngs: nnx.Rngs):
            self.proj = nnx.Linear(d_model, 3 * d_model, use_bias=bias, dtype=dtype, rngs=rngs)

        def __call__(self, x, mask=None, return_weights=False):
            # 1. project
            qkv = self.proj(x)  # (B, T, 3D)

            # 2. split
            q, k, v = jnp.split(qkv, 3, axis=-1)  # 3 x (B, T, D)
            return q + k + v  # (B, T, D)


    def _flax_only_helper():
        return 1


    def from_exchange(arrays, config):
        # 1. build
        return Block(**config, rngs=nnx.Rngs(0))
    ''')


def test_a_faithful_mirror_passes():
    # forward vs __call__, the extra `rngs`, a CausalMask variable and private helpers are fine
    assert mirror_problems(TORCH, JAX) == []


def test_the_checker_catches_every_kind_of_drift():
    drifted = (
        JAX.replace("# 2. split", "# 2. split into Q, K, V")  # reworded section comment
        .replace("# 3 x (B, T, D)", "# (B, T, D) x 3")  # reworded shape comment
        .replace("mask=None, return_weights=False)", "mask=None)")  # lost an argument
        .replace("def from_exchange", "def load_exchange")
    )  # renamed public function
    problems = "\n".join(mirror_problems(TORCH, drifted))
    assert "section comments differ" in problems
    assert "-Block.__call__: 2. split\n" in problems and "+Block.__call__: 2. split into Q, K, V" in problems
    assert "shape comments differ" in problems and "(B, T, D) x 3" in problems
    assert "Block.__call__ takes (self, x, mask, return_weights) in torch_impl but (self, x, mask) in jax_impl" in problems
    assert "from_exchange is in torch_impl only" in problems
    assert "load_exchange is in jax_impl only" in problems


def test_the_checker_catches_order_and_missing_steps():
    swapped = JAX.replace("# 1. project", "#@").replace("# 2. split", "# 1. project").replace("#@", "# 2. split")
    assert swapped.index("# 1. project") > swapped.index("# 2. split")
    assert "section comments differ" in "\n".join(mirror_problems(TORCH, swapped))
    extra = JAX.replace("        return q + k + v", "        v = v * 1  # (B, T, D)\n        return q + k + v")
    assert extra != JAX
    assert mirror_problems(TORCH, extra, aspects=("shapes",))
    reordered = JAX.replace("class Block(nnx.Module):", "class Other(nnx.Module):\n    pass\n\n\nclass Block(nnx.Module):")
    assert "class Other is in jax_impl only" in mirror_problems(TORCH, reordered)


def test_a_section_moved_to_another_function_is_drift():
    moved = JAX.replace("        # 1. project\n", "").replace("    # 1. build\n", "    # 1. project\n    # 1. build\n")
    assert moved.count("# 1. project") == 1
    assert mirror_problems(TORCH, moved, aspects=("sections",))


def test_a_known_one_sided_function_is_allowed_only_in_its_file(monkeypatch):
    extra = TORCH + "\n\ndef spawn_ranks(n):\n    # 1. start\n    return n  # (B, T)\n"
    monkeypatch.setitem(ONE_SIDED, "demo", {"spawn_ranks": ("left", "processes in torch only")})
    assert mirror_problems(extra, JAX, file="demo") == []
    problems = "\n".join(mirror_problems(extra, JAX, file="other"))
    assert "spawn_ranks is in torch_impl only" in problems and "section comments differ" in problems
