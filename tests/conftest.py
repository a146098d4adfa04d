"""Generic pytest set-up shared by every test package.

Package-specific fixtures live next to their tests (`tests/integration/conftest.py` starts real
broker processes with the helpers of `tests/integration/harness.py`); only what every package
may rely on belongs here.
"""

from __future__ import annotations

import platform
from importlib import metadata

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
