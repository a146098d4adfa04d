"""The hot path compiled with mypyc, and the switch back to pure Python.

``make`` (``make run``, ``make test``, ``make compiled``) compiles the modules the Makefile's
``COMPILED`` list names with mypyc, mypy's compiler, into C extensions beside their sources;
Python imports an extension in place of the ``.py`` of the same name. Where the build fails (no C
compiler, say) nothing is compiled and everything runs as Python: the sources are the program,
the extensions only a faster way to run some of it.

``SHOAL_PURE_PYTHON=1`` (in the environment of the broker or of the tests) makes every package
that holds a compiled module (``ipc``, ``workers``, ``broker.runtime``, ``broker.queues``,
``broker.topology``) import its sources all the same: each such package's
``__init__`` calls :func:`sources_only` on itself, which leaves its directory to a finder that
knows sources only (a finder is per directory: a subpackage calls it for itself).
``make test`` runs the suite both ways. The same happens, with a warning, when a source is newer
than its extension (an edit, a checkout since the last ``make``): a stale extension would run
code that is no longer there. It is all or nothing, because compiled modules call each other
directly, past the import system.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, SOURCE_SUFFIXES, FileFinder, SourceFileLoader
from pathlib import Path

ENV = "SHOAL_PURE_PYTHON"
_PACKAGES = ("broker", "ipc", "workers")


@functools.cache
def _stale() -> list[str]:
    """Extensions older than their sources, in any of shoal's packages and their subpackages."""
    root = Path(__file__).resolve().parent.parent
    stale = []
    for package in _PACKAGES:
        for suffix in EXTENSION_SUFFIXES:
            for extension in (root / package).rglob(f"*{suffix}"):
                source = extension.with_name(extension.name[: -len(suffix)] + ".py")
                if source.exists() and source.stat().st_mtime > extension.stat().st_mtime:
                    stale.append(source.relative_to(root).as_posix())
    if stale:
        logging.getLogger("shoal").warning(
            "compiled modules are older than their sources (%s): running pure Python; "
            "`make compiled` builds them again", ", ".join(sorted(stale)))
    return stale


def sources_only(package_path: list[str]) -> None:
    """The package's modules are imported from their sources when ``$SHOAL_PURE_PYTHON`` is set
    or a compiled module is stale."""
    if not os.environ.get(ENV) and not _stale():
        return
    for directory in package_path:
        sys.path_importer_cache[directory] = FileFinder(directory, (SourceFileLoader, SOURCE_SUFFIXES))


def compiled_modules() -> list[str]:
    """Shoal's modules imported so far that run compiled (for the start-up log and the tests)."""
    return sorted(
        name for name, module in list(sys.modules.items())
        if name.partition(".")[0] in _PACKAGES
        and not (getattr(module, "__file__", None) or ".py").endswith(".py")
    )
