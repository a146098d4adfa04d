"""Generic pytest set-up shared by every test package.

Package-specific fixtures live next to their tests (`tests/integration/conftest.py` starts real
broker processes with the helpers of `tests/integration/harness.py`); only what every package
may rely on belongs here: the report header, the `reaches_compiled` marker each test of a
module that runs compiled code gets (`tests/compiled_reach.py`; the pure-Python pass of
`make test` selects those), and the `xdist_group` of the tests that share a set-up (`make test`
runs the suite in parallel processes with pytest-xdist's `--dist loadgroup`).
"""

from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path

import pytest

try:  # pytest 9's node ids (see group_in_node_id); before 9, pytest-xdist's own rewrite works
    from _pytest.nodeid import NodeId
except ImportError:
    NodeId = None

from tests.compiled_reach import reaches_compiled

_REPORTED_DISTRIBUTIONS = ("trio", "pamqp", "msgspec", "posix-ipc", "pika", "aio-pika")


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def pytest_report_header() -> str:
    """Name the interpreter and the library versions a failure report depends on."""
    versions = ", ".join(f"{name} {_version(name)}" for name in _REPORTED_DISTRIBUTIONS)
    return f"shoal: {platform.python_implementation()} {platform.python_version()}; {versions}"


# Session fixtures each pytest-xdist worker sets up for itself: the integration tests' shared
# broker (any test on it may run on any worker).
PER_WORKER_SESSION_FIXTURES = frozenset({"_shared_brokers"})


def shared_setup(item: pytest.Item) -> str | None:
    """The xdist group of a test that shares a set-up with others (a module or session fixture of
    tests/, such as a module's broker or the report tests' SparkSession): those tests run on one
    worker, in order, and the set-up is made once (`--dist loadgroup`). None: any worker."""
    fixture_info = getattr(item, "_fixtureinfo", None)
    if fixture_info is None:
        return None
    module_group = None
    for name in item.fixturenames:
        for fixturedef in fixture_info.name2fixturedefs.get(name, ()):
            defined_in = getattr(fixturedef.func, "__module__", "")
            if not defined_in.startswith("tests."):
                continue  # pytest's own (tmp_path_factory) and plugins'
            if fixturedef.scope == "session" and name not in PER_WORKER_SESSION_FIXTURES:
                return f"session-{defined_in}"  # one group per conftest: its fixtures use each other
            if fixturedef.scope in ("module", "package"):
                module_group = item.nodeid.partition("::")[0]
    return module_group


def group_in_node_id(item: pytest.Item, group: str) -> None:
    """What `--dist loadgroup` does on an xdist worker: the group after an "@" at the end of the
    test's node id, by which the controller hands out the tests. pytest-xdist 3.8 writes it to
    `item._nodeid`, which pytest 9 no longer reads (its node id is `item._id`): without this,
    the groups are silently ignored."""
    if NodeId is None:
        return
    if "@" not in item.nodeid.rpartition("]")[2] and hasattr(item, "_id"):
        item._id = NodeId.parse(f"{item.nodeid}@{group}")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker, and before xdist reads xdist_group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `reaches_compiled` each test whose module runs a module of the Makefile's COMPILED list
    (or starts a broker, whose workers do); a file outside the tree counts as reaching. Put the
    tests sharing a module or session set-up in one `xdist_group`."""
    verdicts: dict[Path, bool] = {}
    for item in items:
        path = Path(item.path)
        if path not in verdicts:
            verdicts[path] = reaches_compiled(path)
        if verdicts[path]:
            item.add_marker("reaches_compiled")
        group = shared_setup(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            if getattr(config.option, "loadgroup", False):
                group_in_node_id(item, group)
