"""When a compiled module is stale (ipc/compiled.py): a source edited since the build is; one
rewritten as it was (a checkout, a stash) is not, when the build recorded its content."""

from __future__ import annotations

import hashlib
import os
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from ipc.compiled import RECORD, describe, stale_sources

SUFFIX = EXTENSION_SUFFIXES[0]
SOURCE = "workers/codec.py"


def _tree(root: Path, source: str = "x = 1\n") -> Path:
    """A checkout with one source, its extension built at t=1000, its record written after."""
    (root / "workers").mkdir(parents=True)
    path = root / SOURCE
    path.write_text(source)
    extension = root / "workers" / f"codec{SUFFIX}"
    extension.write_bytes(b"")
    os.utime(path, (900, 900))
    os.utime(extension, (1000, 1000))
    return path


def _record(root: Path, text: str, at: float = 1001) -> None:
    record = root / RECORD
    record.parent.mkdir(exist_ok=True)
    record.write_text(f"{hashlib.sha256(text.encode()).hexdigest()}  {SOURCE}\n")
    os.utime(record, (at, at))


def test_a_source_older_than_its_extension_is_fresh(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert stale_sources(tmp_path) == []


def test_a_source_newer_than_its_extension_without_a_record_is_stale(tmp_path: Path) -> None:
    path = _tree(tmp_path)
    os.utime(path, (2000, 2000))
    assert stale_sources(tmp_path) == [SOURCE]


def test_a_source_rewritten_as_it_was_built_is_fresh(tmp_path: Path) -> None:
    path = _tree(tmp_path)
    _record(tmp_path, "x = 1\n")
    os.utime(path, (2000, 2000))  # git checkout wrote it again, same content
    assert stale_sources(tmp_path) == []


def test_a_source_edited_since_the_build_is_stale_whatever_the_record(tmp_path: Path) -> None:
    path = _tree(tmp_path)
    _record(tmp_path, "x = 1\n")
    path.write_text("x = 2\n")
    os.utime(path, (2000, 2000))
    assert stale_sources(tmp_path) == [SOURCE]


def test_a_record_older_than_the_extension_is_not_trusted(tmp_path: Path) -> None:
    """An extension built again by hand, after the record, may come from other content."""
    path = _tree(tmp_path)
    _record(tmp_path, "x = 1\n", at=950)
    os.utime(path, (2000, 2000))
    assert stale_sources(tmp_path) == [SOURCE]


def test_describe_says_which_way_a_checkout_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHOAL_PURE_PYTHON", raising=False)
    (tmp_path / "workers").mkdir()
    assert describe(tmp_path).startswith("pure Python (not compiled")
    path = _tree(tmp_path / "built")
    assert describe(tmp_path / "built") == "compiled (1 module)"
    os.utime(path, (2000, 2000))
    assert describe(tmp_path / "built") == "pure Python (1 source edited since the build: make compiled)"
    monkeypatch.setenv("SHOAL_PURE_PYTHON", "1")
    assert describe(tmp_path / "built") == "pure Python ($SHOAL_PURE_PYTHON)"
