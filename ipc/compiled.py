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
than its extension (an edit since the last ``make``): a stale extension would run code that is
no longer there. It is all or nothing, because compiled modules call each other directly, past
the import system. A source whose file is newer but whose content is what the extensions were
built from (a ``git checkout`` or ``git stash`` rewrites files it puts back as they were) is not
an edit: the build records each source's SHA-256 beside the extensions (RECORD, ``sha256sum``'s
format), and a newer source whose digest is the recorded one keeps its extension.
:func:`describe` says which way a checkout runs (``python -m perf`` prints it with its figures).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES, SOURCE_SUFFIXES, FileFinder, SourceFileLoader
from pathlib import Path

ENV = "SHOAL_PURE_PYTHON"
_PACKAGES = ("broker", "ipc", "workers")
# What the extensions were built from: `sha256sum` of each compiled source, written by the
# Makefile's build after the extensions (relative to the checkout's root).
RECORD = "build/compiled-sources.sha256"
ROOT = Path(__file__).resolve().parent.parent


def _recorded(root: Path) -> tuple[dict[str, str], float]:
    """The build's record: each source's digest by its path from ``root``, and the record's
    mtime (({}, 0.0) without one)."""
    path = root / RECORD
    try:
        text = path.read_text()
        written = path.stat().st_mtime
    except OSError:
        return {}, 0.0
    digests = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        if name:
            digests[name.strip()] = digest.strip()
    return digests, written


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _extensions(root: Path) -> dict[Path, Path]:
    """The compiled modules under ``root``'s packages (subpackages too): each extension and
    the source beside it."""
    found = {}
    for package in _PACKAGES:
        for suffix in EXTENSION_SUFFIXES:
            for extension in (root / package).rglob(f"*{suffix}"):
                source = extension.with_name(extension.name[: -len(suffix)] + ".py")
                if source.exists():
                    found[extension] = source
    return found


def stale_sources(root: Path = ROOT) -> list[str]:
    """The sources under ``root``'s packages newer than their extensions, less those whose
    content the build recorded (RECORD) for an extension no newer than the record: those were
    rewritten as they were, not edited."""
    digests, recorded_at = _recorded(root)
    stale = []
    for extension, source in _extensions(root).items():
        built_at = extension.stat().st_mtime
        if source.stat().st_mtime <= built_at:
            continue
        name = source.relative_to(root).as_posix()
        if not (built_at <= recorded_at and digests.get(name) == _digest(source)):
            stale.append(name)
    return sorted(stale)


@functools.cache
def _stale() -> list[str]:
    """This checkout's stale sources (:func:`stale_sources`), said once in the log."""
    stale = stale_sources()
    if stale:
        logging.getLogger("shoal").warning(
            "compiled modules are older than their sources (%s): running pure Python; "
            "`make compiled` builds them again", ", ".join(stale))
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


def describe(root: Path = ROOT) -> str:
    """How a broker started from the checkout at ``root`` runs its hot path, in a few words:
    compiled, or pure Python and why."""
    if os.environ.get(ENV):
        return f"pure Python (${ENV})"
    built = _extensions(root)
    if not built:
        return "pure Python (not compiled: make compiled)"
    stale = stale_sources(root)
    if stale:
        edited = f"{len(stale)} source{'s' if len(stale) > 1 else ''}"
        return f"pure Python ({edited} edited since the build: make compiled)"
    return f"compiled ({len(built)} module{'s' if len(built) > 1 else ''})"


def describe_checkout(root: Path) -> str:
    """:func:`describe` of another checkout, asked of that checkout's own code (its rules may
    differ from ours); "unknown" if it cannot say."""
    try:
        out = subprocess.run([sys.executable, "-c", "from ipc.compiled import describe; print(describe())"],
                             cwd=root, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"
