"""The package layering of DESIGN.md's package table, read from the source with `ast`.

Every import statement counts: module level, inside functions (lazy imports) and under
`if TYPE_CHECKING:`, because each is a dependency a reader and a type checker must follow. And
they are read as mypy reads them: `from pkg import mod` depends on `pkg` (its `__init__`) as well
as on `pkg.mod`, so a package whose `__init__` imports a module that imports the package back is
a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ("broker", "workers", "ipc", "tracing")  # the broker's processes: import neither of the two below
OFF_RUNTIME = ("report", "perf")  # `shoal report` and the perf scripts read the runtime's output
SHOAL = ("broker", "workers", "ipc", "cli", "tracing", "report", "management", "links")  # no import cycle among these
# DESIGN's package table: which of Shoal's other packages each may import.
ALLOWED = {
    "broker": {"ipc", "tracing"},
    "workers": {"ipc", "tracing"},
    "ipc": set(),
    "tracing": set(),
    "report": {"tracing"},  # not perf: a cluster's executors import report and tracing only
    "cli": {"broker", "workers", "ipc", "tracing", "report"},
    "management": {"ipc"},  # and broker's public data modules (ALLOWED_MODULES)
    "links": {"ipc"},  # the links process (shovels): and broker's public data modules only
}
# Single modules a package may import from a package it may not: the workers raise the one
# error type, use the names both sides agree on and check passwords as the supervisor stores
# them (pure modules that import nothing of Shoal's).
ALLOWED_MODULES = {
    "workers": {"broker.errors", "broker.constants", "broker.passwords", "broker.permissions"},
    # The management process reads the supervisor over its control socket, not its objects:
    # of broker/ it takes the pure modules only (stored passwords, names, errors).
    "management": {"broker.errors", "broker.constants", "broker.passwords",
                   "broker.limits"},
    # The links process reads the supervisor's parameters as data (the shovel keys and URIs, the
    # federation upstreams and loop rules).
    "links": {"broker.errors", "broker.constants", "broker.parameters", "broker.federation"},
}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module, as precisely as the source tree names it
    where: str  # path:line of the import statement


def module_name(path: Path, root: Path = REPO_ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules(packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of `packages`: dotted name → file."""
    return {module_name(p): p for package in packages
            for p in sorted((REPO_ROOT / package).rglob("*.py"))}


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str, path: Path, known: set[str] | None = None,
               root: Path = REPO_ROOT, as_mypy: bool = False) -> Iterator[Import]:
    """The modules `module` imports. With `known`, `from pkg import name` names `pkg.name` when
    that is a module of the tree, else `pkg`; `as_mypy`, it names `pkg` as well (importing
    `pkg.name` runs `pkg/__init__` first, and mypy counts both)."""
    tree = ast.parse(path.read_text(), str(path))
    rel = path.relative_to(root)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, f"{rel}:{node.lineno}")
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, path.name == "__init__.py")
            where = f"{rel}:{node.lineno}"
            submodules = [f"{base}.{alias.name}" for alias in node.names
                          if known is not None and f"{base}.{alias.name}" in known]
            if as_mypy or len(submodules) < len(node.names):
                yield Import(module, base, where)
            for submodule in submodules:
                yield Import(module, submodule, where)


def _package(name: str) -> str:
    return name.split(".", 1)[0]


def _in_packages(name: str, packages: tuple[str, ...]) -> bool:
    return _package(name) in packages


def import_graph(packages: tuple[str, ...], root: Path = REPO_ROOT) -> dict[str, list[Import]]:
    """Module → its imports of other modules of `packages` (resolved to the nearest module
    the tree has: `import broker.queues.queue.x` names `broker.queues.queue` when there is no `.x`)."""
    modules = {module_name(p, root): p for package in packages
               for p in sorted((root / package).rglob("*.py"))}
    known = set(modules)
    graph: dict[str, list[Import]] = {m: [] for m in modules}
    for module, path in modules.items():
        for imp in imports_of(module, path, known, root, as_mypy=True):
            if not _in_packages(imp.target, packages):
                continue
            target = imp.target
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target in known and target != module:
                graph[module].append(Import(module, target, imp.where))
    return graph


def strongly_connected(graph: dict[str, list[Import]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted({i.target for i in graph[root]})))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted({i.target for i in graph[child]}))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def describe(component: list[str], graph: dict[str, list[Import]]) -> str:
    members = set(component)
    edges = [f"    {i.source} -> {i.target}  ({i.where})"
             for m in component for i in graph[m] if i.target in members]
    return f"  cycle of {len(component)} modules: {', '.join(component)}\n" + "\n".join(edges)


def test_the_runtime_imports_neither_report_nor_perf() -> None:
    """DESIGN: nothing in broker/, workers/, ipc/ or tracing/ imports report/ or perf/ (they read
    the runtime's output and public interfaces, never the other way round)."""
    offenders = [f"{imp.where}: {imp.source} imports {imp.target}"
                 for module, path in source_modules(RUNTIME).items()
                 for imp in imports_of(module, path)
                 if _in_packages(imp.target, OFF_RUNTIME)]
    assert not offenders, "the runtime imports report/ or perf/:\n" + "\n".join(offenders)


def test_the_runtime_does_not_import_management() -> None:
    """DESIGN: the HTTP API is never on the message path: nothing in broker/, workers/, ipc/ or
    tracing/ imports management/ (the supervisor starts it by module name, as a process)."""
    offenders = [f"{imp.where}: {imp.source} imports {imp.target}"
                 for module, path in source_modules(RUNTIME).items()
                 for imp in imports_of(module, path)
                 if _in_packages(imp.target, ("management",))]
    assert not offenders, "the runtime imports management/:\n" + "\n".join(offenders)


def test_the_runtime_does_not_import_links() -> None:
    """Issue 39: shovels never run on the supervisor's loop or in a worker: nothing in broker/,
    workers/, ipc/ or tracing/ imports links/ (the supervisor starts it by module name)."""
    offenders = [f"{imp.where}: {imp.source} imports {imp.target}"
                 for module, path in source_modules(RUNTIME).items()
                 for imp in imports_of(module, path)
                 if _in_packages(imp.target, ("links",))]
    assert not offenders, "the runtime imports links/:\n" + "\n".join(offenders)


def _allowed(source: str, target: str) -> bool:
    package = _package(source)
    if _package(target) in {package, *ALLOWED[package]}:
        return True
    return any(target == m or target.startswith(m + ".") for m in ALLOWED_MODULES.get(package, ()))


def test_each_package_imports_only_what_the_package_table_allows() -> None:
    """DESIGN: broker/ and workers/ may import ipc/ and tracing/, workers/ also broker.errors and
    broker.constants; ipc/ and tracing/ import none of Shoal's packages; report/ imports tracing/
    only (not perf/); cli/ imports any of them but perf/; none of them imports cli/."""
    known = set(source_modules((*SHOAL, "perf")))
    offenders = [f"{imp.where}: {imp.source} imports {imp.target}"
                 for module, path in source_modules(tuple(ALLOWED)).items()
                 for imp in imports_of(module, path, known)
                 if _in_packages(imp.target, (*SHOAL, "perf")) and not _allowed(module, imp.target)]
    assert not offenders, "imports the package table does not allow:\n" + "\n".join(offenders)


def test_no_import_cycle_among_shoals_modules() -> None:
    """Issue 10: no import cycle among Shoal's modules, TYPE_CHECKING and lazy imports included,
    nor one through a package's `__init__` (`from pkg import mod` depends on `pkg` too)."""
    graph = import_graph(SHOAL)
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n".join(describe(c, graph) for c in cycles)


def test_the_cycle_finder_finds_cycles() -> None:
    """The checks above can fail: a two-module cycle and a three-module cycle are both found,
    and a module importing itself or a chain without a back edge is not a cycle."""
    def edges(*pairs: tuple[str, str]) -> dict[str, list[Import]]:
        graph: dict[str, list[Import]] = {m: [] for pair in pairs for m in pair}
        for a, b in pairs:
            graph[a].append(Import(a, b, "x.py:1"))
        return graph

    graph = edges(("a", "b"), ("b", "a"), ("c", "d"), ("d", "e"), ("e", "c"), ("e", "f"), ("f", "g"))
    assert strongly_connected(graph) == [["a", "b"], ["c", "d", "e"]]
    assert "a -> b  (x.py:1)" in describe(["a", "b"], graph)


def test_a_cycle_through_a_packages_init_is_a_cycle(tmp_path: Path) -> None:
    """As mypy reads it: `pkg/__init__` importing `pkg.writer` (even lazily, in a function) while
    `pkg.writer` does `from pkg import schema` is a cycle of pkg and pkg.writer; `from pkg.schema
    import X` and an `__init__` that imports nothing back are not."""
    def tree(init: str, writer: str) -> list[list[str]]:
        pkg = tmp_path / f"case{len(list(tmp_path.iterdir()))}" / "pkg"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(init)
        (pkg / "writer.py").write_text(writer)
        (pkg / "schema.py").write_text("X = 1\n")
        return strongly_connected(import_graph(("pkg",), pkg.parent))

    lazy = "def open_writer():\n    from pkg.writer import W\n"
    assert tree(lazy, "from pkg import schema\nW = 1\n") == [["pkg", "pkg.writer"]]
    assert tree(lazy, "from pkg.schema import X\nW = 1\n") == []
    assert tree("", "from pkg import schema\nW = 1\n") == []


def test_a_channel_reaches_neither_its_connection_handler_nor_its_worker() -> None:
    """Issue 10 (h2's H2Stream): ``workers.channel`` and everything it imports, transitively,
    stay clear of the connection handler, the worker and the server: a channel returns what it
    produces (``ChannelOutput``) instead of calling its owners."""
    graph = import_graph(SHOAL)
    reached: set[str] = set()
    todo = ["workers.channel"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(imp.target for imp in graph[module])
    owners = {"workers.connection_handler", "workers.worker", "workers.server"}
    assert "workers.channel_consumers" in reached and "workers.consumer_target" in reached
    assert not reached & owners, sorted(reached & owners)


# broker/'s groups, each importing only the groups before it (as Broker-J's server/queue,
# exchange, virtualhost and store stack up): broker/ itself keeps what workers/ may import.
BROKER_GROUPS = ("broker", "broker.messages", "broker.queues", "broker.queues.featured",
                 "broker.topology", "broker.storage", "broker.runtime")


def _group(module: str) -> str:
    return max((g for g in BROKER_GROUPS if module == g or module.startswith(g + ".")), key=len)


def group_order_offenders(graph: dict[str, list[Import]]) -> list[str]:
    """Each import within broker/ that runs from a group to a later one."""
    rank = {g: i for i, g in enumerate(BROKER_GROUPS)}
    return [f"{imp.where}: {imp.source} ({_group(imp.source)}) imports {imp.target} "
            f"({_group(imp.target)})"
            for edges in graph.values() for imp in edges
            if rank[_group(imp.target)] > rank[_group(imp.source)]]


def test_broker_groups_import_only_the_groups_before_them() -> None:
    """broker/: messages, then queues, featured queues, topology, storage, runtime; a module
    imports its own group and the ones before it, never one after (read as mypy reads it)."""
    graph = import_graph(("broker",))
    ungrouped = [m for m in graph if _group(m) == "broker" and m not in (
        "broker", "broker.errors", "broker.constants", "broker.passwords", "broker.permissions",
        "broker.parameters", "broker.federation", "broker.limits")]  # pure modules other packages
    # import (links/: the shovel keys, the federation upstreams and loop rules; management/: the
    # limits' export shape)
    assert not ungrouped, f"modules of broker/ outside its groups: {ungrouped}"
    offenders = group_order_offenders(graph)
    assert not offenders, "imports that run back up broker/'s groups:\n" + "\n".join(offenders)


def test_the_group_order_check_finds_an_edge_that_runs_back() -> None:
    """The check above can fail: a queue importing the runtime is reported, the runtime
    importing a queue is not."""
    back = Import("broker.queues.queue", "broker.runtime.dispatch", "broker/queues/queue.py:1")
    down = Import("broker.runtime.dispatch", "broker.queues.queue", "broker/runtime/dispatch.py:1")
    offenders = group_order_offenders({"broker.queues.queue": [back], "broker.runtime.dispatch": [down]})
    assert offenders == ["broker/queues/queue.py:1: broker.queues.queue (broker.queues) imports "
                         "broker.runtime.dispatch (broker.runtime)"]


# STYLE.md: a module owns one thing, and is split by noun well before this (the aim is ~600).
MODULE_LINES_MAX = 700


def test_no_module_of_shoal_grows_past_the_split_point() -> None:
    """STYLE.md: modules stay under ~500-700 lines; one that grows past MODULE_LINES_MAX is
    split by noun (a helper per concept) instead of growing on."""
    long = [f"{path.relative_to(REPO_ROOT)}: {n} lines"
            for path in source_modules((*SHOAL, "perf")).values()
            if (n := len(path.read_text().splitlines())) > MODULE_LINES_MAX]
    assert not long, "modules past the split point:\n" + "\n".join(long)
