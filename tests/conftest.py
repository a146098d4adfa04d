"""Generic pytest set-up shared by every test package.

Package-specific fixtures live next to their tests (`tests/integration/conftest.py` starts real
broker processes with the helpers of `tests/integration/harness.py`); only what every package
may rely on belongs here: the report header, and the `reaches_compiled` marker each test of a
module that runs compiled code gets (`tests/compiled_reach.py`; the pure-Python pass of
`make test` selects those).
"""

from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path

import pytest

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


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `reaches_compiled` each test whose module runs a module of the Makefile's COMPILED list
    (or starts a broker, whose workers do); a file outside the tree counts as reaching."""
    verdicts: dict[Path, bool] = {}
    for item in items:
        path = Path(item.path)
        if path not in verdicts:
            verdicts[path] = reaches_compiled(path)
        if verdicts[path]:
            item.add_marker("reaches_compiled")
