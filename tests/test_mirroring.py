"""torch_impl/X.py and jax_impl/X.py are written to be read side by side (DESIGN.md,
Mirroring): the same section comments, the same public classes, methods, functions and
argument names, and the same shape comments, in the same order. Read with ast and
tokenize only, so no framework is imported; the checker is itself tested on a drifted pair."""

import ast
import difflib
import io
import re
import textwrap
import tokenize
from pathlib import Path

import pytest

from shared.tools.side_by_side import SECTION_RE

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("attention", "model", "train", "generate")
ASPECTS = ("sections", "signatures", "shapes")
# a trailing comment that states a shape: `# (B, H, T, d_head)`, `# 3 x (B, T, D)`
SHAPE_RE = re.compile(r"^#\s*(?:\d+\s*x\s*)?\(.*\)")
# the differences DESIGN.md itself prescribes (Public names; The block)
JAX_ONLY_KEYWORDS = {"rngs"}  # jax_impl constructors take `*, rngs`
JAX_ONLY_BASES = {"nnx.Variable"}  # the mask is "a non-Param nnx.Variable subclass in Flax"
# what truly differs between an eager, stateful framework and a functional, compiled one:
# name -> (torch arguments, jax arguments, why). Exact, so any further drift still fails.
KNOWN_SIGNATURES = {
    "grads_to_exchange": (("model",), ("grads",),
                          "torch keeps gradients on the parameters; nnx.grad returns them as a State"),
    "train_step": (("model", "optimizer", "x", "y"), ("graphdef", "state", "x", "y"),
                   "torch updates model and optimizer in place; JAX threads split state through a pure function"),
    "train_epoch": (("model", "optimizer", "batches"), ("graphdef", "state", "batches"),
                    "as train_step"),
}
JAX_ONLY_FUNCTIONS = {
    "scan_steps": "the compiled jax.lax.scan over an epoch; torch loops eagerly",
    "assign_exchange": "Flax kernels are transposed on the way in; torch's layout is the exchange layout "
                       "(load_state_dict, and Adam's moments are used as they are)",
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


def section_comments(source: str) -> list[str]:
    """'scope: N. words' for every section comment, in order (numbering restarts per function)."""
    spans = scopes(source)
    out = []
    for line, text, trailing in comments(source):
        if not trailing and SECTION_RE.match(text):
            inside = [name for first, last, name in spans if first <= line <= last]
            out.append(f"{inside[-1] if inside else '<module>'}: {text[1:].strip()}")
    return out


def shape_comments(source: str) -> list[str]:
    return [text for _, text, trailing in comments(source) if trailing and SHAPE_RE.match(text)]


def _difference(what: str, torch_items: list, jax_items: list) -> list[str]:
    if torch_items == jax_items:
        return []
    lines = difflib.unified_diff([str(i) for i in torch_items], [str(i) for i in jax_items],
                                 "torch_impl", "jax_impl", lineterm="", n=1)
    return [f"{what} differ:"] + [f"    {line}" for line in lines]


def mirror_problems(torch_source: str, jax_source: str, aspects=ASPECTS) -> list[str]:
    """Every way the jax file drifts from the torch file; empty when they mirror."""
    problems = []
    if "sections" in aspects:
        problems += _difference("section comments", section_comments(torch_source), section_comments(jax_source))
    if "signatures" in aspects:
        torch_outline, jax_outline = outline(torch_source), outline(jax_source, jax=True)
        torch_names, jax_names = dict(torch_outline), dict(jax_outline)
        for name, args in torch_outline:
            if name not in jax_names:
                problems.append(f"{name} is in torch_impl only")
            elif KNOWN_SIGNATURES.get(name, (None, None))[:2] == (args, jax_names[name]):
                continue
            elif jax_names[name] != args:
                problems.append(f"{name} takes ({', '.join(args)}) in torch_impl "
                                f"but ({', '.join(jax_names[name])}) in jax_impl")
        problems += [f"{name} is in jax_impl only" for name, _ in jax_outline
                     if name not in torch_names and name not in JAX_ONLY_FUNCTIONS]
        common = [name for name, _ in torch_outline if name in jax_names]
        problems += _difference("the order of classes and functions", common,
                                [name for name, _ in jax_outline if name in torch_names])
    if "shapes" in aspects:
        problems += _difference("shape comments", shape_comments(torch_source), shape_comments(jax_source))
    return problems


@pytest.mark.parametrize("aspect", ASPECTS)
@pytest.mark.parametrize("name", NAMES)
def test_jax_mirrors_torch(name, aspect):
    paths = [ROOT / folder / f"{name}.py" for folder in ("torch_impl", "jax_impl")]
    missing = [str(path.relative_to(ROOT)) for path in paths if not path.exists()]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not written yet")
    problems = mirror_problems(*(path.read_text(encoding="utf-8") for path in paths), aspects=(aspect,))
    assert not problems, (f"torch_impl/{name}.py and jax_impl/{name}.py have drifted apart "
                          f"(see `mhsa diff {name}`):\n" + "\n".join(problems))


# --- the checker itself ----------------------------------------------------------------------

TORCH = textwrap.dedent('''\
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
    ''')

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
    drifted = (JAX
               .replace("# 2. split", "# 2. split into Q, K, V")  # reworded section comment
               .replace("# 3 x (B, T, D)", "# (B, T, D) x 3")  # reworded shape comment
               .replace("mask=None, return_weights=False)", "mask=None)")  # lost an argument
               .replace("def from_exchange", "def load_exchange"))  # renamed public function
    problems = "\n".join(mirror_problems(TORCH, drifted))
    assert "section comments differ" in problems
    assert "-Block.__call__: 2. split\n" in problems and "+Block.__call__: 2. split into Q, K, V" in problems
    assert "shape comments differ" in problems and "(B, T, D) x 3" in problems
    assert ("Block.__call__ takes (self, x, mask, return_weights) in torch_impl but (self, x, mask) in jax_impl"
            in problems)
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
