"""Which test modules reach the compiled hot path: the pure-Python pass of `make test` runs those.

`make test` runs the suite with the modules of the Makefile's COMPILED list built by mypyc, then
again with SHOAL_PURE_PYTHON=1 (the same modules from their sources). The second pass tells
something new only for tests that run one of those modules; for the others both passes run the
same code. A test module *reaches compiled code* when

- it imports, transitively, a module of COMPILED (read from the Makefile, so the list is kept in
  one place), the conftest.py files above it included (their fixtures run with the test); or
- it starts a real broker: its imports reach a module that runs `shoal serve` in a child process
  (a module that imports subprocess and names the "serve" command), since the broker's workers run
  the compiled modules whatever the test itself imports.

Imports are read from the source with `ast`, every import statement counted (module level, inside
functions), except those under `if TYPE_CHECKING:`, which never run. `from pkg import name` counts
as importing `pkg.name` when that is a module of the tree; importing `a.b.c` runs `a` and `a.b`
too. tests/conftest.py marks each collected test of such a module `reaches_compiled`.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# Top-level packages whose imports are followed (anything else is a third-party or stdlib module).
PACKAGES = ("broker", "workers", "ipc", "cli", "tracing", "perf", "report", "tests")


def compiled_modules(makefile: Path = REPO_ROOT / "Makefile") -> frozenset[str]:
    """The dotted names of the Makefile's COMPILED list (`workers/codec.py` -> `workers.codec`)."""
    text = makefile.read_text().replace("\\\n", " ")
    match = re.search(r"^COMPILED\s*:?=\s*(.*)$", text, re.MULTILINE)
    if match is None:
        raise LookupError(f"no COMPILED list in {makefile}")
    paths = match.group(1).split()
    return frozenset(p.removesuffix(".py").replace("/", ".") for p in paths if p.endswith(".py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.cache
def source_modules() -> dict[str, Path]:
    """Every module of PACKAGES: dotted name -> file."""
    return {_module_name(p): p for package in PACKAGES
            for p in sorted((REPO_ROOT / package).rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` except what is under `if TYPE_CHECKING:` (its `else:` is kept)."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))
    return found


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


@functools.cache
def _scan(module: str) -> tuple[frozenset[str], bool]:
    """The modules of the tree that `module` imports, and whether it starts a broker itself."""
    path = source_modules()[module]
    known = source_modules()
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    targets: set[str] = set()
    names_serve = imports_subprocess = False
    for node in _statements(tree):
        found: list[str] = []
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found = [base]
            found += [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
        elif isinstance(node, ast.Constant) and node.value == "serve":
            names_serve = True
        if "subprocess" in found:
            imports_subprocess = True
        for name in found:
            targets.update(n for n in _with_parents(name) if n in known and n != module)
    return frozenset(targets), names_serve and imports_subprocess


def _conftests(path: Path) -> list[str]:
    """The conftest modules whose fixtures and hooks apply to the test file at `path`."""
    known = source_modules()
    names = []
    for directory in path.relative_to(REPO_ROOT).parents:
        name = ".".join([*directory.parts, "conftest"])
        if name in known:
            names.append(name)
    return names


def reached(path: Path) -> set[str]:
    """Every module of the tree a test file runs: its imports and its conftests', transitively."""
    module = _module_name(path)
    seen: set[str] = set()
    todo = [module, *_conftests(path)]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_scan(name)[0])
    return seen


def why_it_reaches_compiled(path: Path, compiled: frozenset[str] | None = None) -> str | None:
    """None when the test file at `path` runs no compiled module; else a compiled module it
    imports, or the module through which it starts a broker."""
    modules = reached(path)
    hit = sorted(modules & (compiled_modules() if compiled is None else compiled))
    if hit:
        return hit[0]
    starters = sorted(m for m in modules if _scan(m)[1])
    return f"a broker started by {starters[0]}" if starters else None


def reaches_compiled(path: Path) -> bool:
    """Whether the test file at `path` runs compiled code; a file this module cannot read (outside
    the tree's packages, not Python) counts as reaching, so the pure pass keeps it."""
    path = path.resolve()
    if path.suffix != ".py" or not path.is_relative_to(REPO_ROOT) or _module_name(path) not in source_modules():
        return True
    return why_it_reaches_compiled(path) is not None
