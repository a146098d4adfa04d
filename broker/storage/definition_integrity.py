"""Whether ``definitions.db`` can be trusted: a read-only look at it (:func:`inspect`: its
pages, its digests, which Shoal wrote it), the damage a WAL can hide (:func:`wal_damage`), and
the generation file that notices a database come back behind (:class:`GenerationFile`).

SQLite ignores the WAL's frames from the first one whose checksum fails, and has no checksum
of its own on the main file's pages: so a start checks ``PRAGMA integrity_check`` and the
digests (:mod:`broker.storage.definition_tables`), and looks at the WAL's checksums itself.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from broker.storage.definition_tables import DIGEST, SCHEMA_VERSION, SIDE_TABLES, core_digest

log = logging.getLogger("shoal.definitions")


class DefinitionStoreError(Exception):
    """The database cannot be read as Shoal's definitions (damaged, or from a newer Shoal)."""


class NewerDefinitions(DefinitionStoreError):
    """Written by a newer Shoal: nothing is wrong with it, this Shoal cannot read it."""


@dataclass(frozen=True)
class Inspection:
    """What a read-only look at ``definitions.db`` found (:func:`inspect`)."""

    exists: bool  # the file is there and not empty
    tables: bool  # Shoal's tables are there
    node: str | None  # the node id in meta (None: no meta, a Shoal that wrote none, or lost)
    generation: int
    users: int
    problem: str | None  # damage found: the database must not be used


def inspect(path: Path) -> Inspection:
    """Read ``path`` without changing it (nor its WAL): which Shoal wrote it, whose it is, and
    whether its pages and rows are intact. Raises DefinitionStoreError when it cannot be read."""
    if not path.exists() or path.stat().st_size == 0:
        return Inspection(False, False, None, 0, 0, None)
    # Read-only: a read-only connection never checkpoints nor deletes the WAL. With no WAL
    # there is nothing but the main file to read, and immutable creates no -wal or -shm.
    wal = path.with_name(f"{path.name}-wal")
    mode = "mode=ro" if wal.exists() else "immutable=1"
    try:
        db = sqlite3.connect(f"file:{path}?{mode}", uri=True)
    except sqlite3.DatabaseError as exc:
        raise DefinitionStoreError(f"{path}: {exc}") from exc
    try:
        check_version(db, path)
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "users" not in tables:
            return Inspection(True, False, None, 0, 0, None)
        problem = None
        checked = [line for (line,) in db.execute("PRAGMA integrity_check")]
        if checked != ["ok"]:
            problem = f"damaged ({checked[0]})"
        users = db.execute("SELECT count(*) FROM users").fetchone()[0]
        if "meta" not in tables:
            return Inspection(True, True, None, 0, users, problem)
        meta = dict(db.execute("SELECT key, value FROM meta"))
        node, generation = meta.get("node"), meta.get("generation", 0)
        if problem is None and node is not None and core_digest(db) != meta.get(DIGEST):
            problem = "damaged (its rows do not match their digest)"
        for table in SIDE_TABLES:
            if (problem is None and table.name in tables
                    and table.digest(db) != meta.get(table.digest_key)):
                problem = f"damaged (its {table.name} do not match their digest)"
        return Inspection(True, True, node if isinstance(node, str) else None,
                          generation if isinstance(generation, int) else 0, users, problem)
    except sqlite3.DatabaseError as exc:
        raise DefinitionStoreError(f"{path}: {exc}") from exc
    except UnicodeDecodeError:  # a damaged page can hold text that is not UTF-8
        raise DefinitionStoreError(f"{path}: damaged (text that is not UTF-8)") from None
    finally:
        db.close()


def check_version(db: sqlite3.Connection, path: Path) -> int:
    version: int = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise NewerDefinitions(
            f"{path}: written by a newer Shoal (schema {version}, this one reads {SCHEMA_VERSION})")
    return version


_WAL_MAGIC = (0x377F0682, 0x377F0683)  # the low bit: checksums of big-endian words


def _wal_checksum(data: bytes, seed: tuple[int, int], big_endian: bool) -> tuple[int, int]:
    """SQLite's WAL checksum (wal.c, walChecksumBytes) of ``data``, from ``seed``."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    s1, s2 = seed
    for i in range(0, len(words), 2):
        s1 = (s1 + words[i] + s2) & 0xFFFFFFFF
        s2 = (s2 + words[i + 1] + s1) & 0xFFFFFFFF
    return s1, s2


def wal_damage(wal: Path) -> str | None:
    """What is wrong with ``wal``, when SQLite would drop frames of it that are not a torn
    tail: its header fails its checksum, or a frame fails while a later one of the same WAL
    (its salts) is sound. A crash mid-append leaves only a bad tail, which is not damage; a bad
    last frame cannot be told from one (``definitions.gen`` tells)."""
    try:
        raw = wal.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) < 32:
        return None
    magic, _, page, _, salt1, salt2, c1, c2 = struct.unpack(">8I", raw[:32])
    size = 24 + page
    frames = (len(raw) - 32) // size if page else 0
    if magic not in _WAL_MAGIC or page < 512 or page & (page - 1):
        return "damaged (its header is not a WAL header)" if len(raw) > 32 else None
    big = bool(magic & 1)
    if _wal_checksum(raw[:24], (0, 0), big) != (c1, c2):
        return "damaged (its header fails its checksum)" if frames else None
    seed, first_bad = (c1, c2), 0
    for k in range(frames):
        frame = raw[32 + k * size:32 + (k + 1) * size]
        f_salt1, f_salt2, f1, f2 = struct.unpack(">4I", frame[8:24])
        ours = (f_salt1, f_salt2) == (salt1, salt2)
        sound = ours and _wal_checksum(frame[:8] + frame[24:], seed, big) == (f1, f2)
        if sound and first_bad:
            return (f"damaged (frame {first_bad} of {frames} fails its checksum, frame {k + 1} "
                    "does not: SQLite would drop the changes from there on)")
        if not sound and not first_bad:
            first_bad = k + 1
        seed = (f1, f2)  # the next frame's checksum continues from this one's, as written
    return None


class GenerationFile:
    """``DIR/definitions.gen``: the generation of the latest committed batch, 16 bytes
    (magic, generation, CRC-32), rewritten in place after each commit without an fsync: a
    crash of the process keeps it (the page cache outlives it), a power cut may leave it
    behind the database, which is never taken for a loss."""

    _FORMAT = struct.Struct("<4sQI")
    _MAGIC = b"SGEN"

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> int | None:
        """The generation written last; None when there is none or it is damaged (a warning)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) == self._FORMAT.size:
            magic, generation, crc = self._FORMAT.unpack(raw)
            if magic == self._MAGIC and crc == zlib.crc32(raw[:12]):
                return int(generation)
        log.warning("%s: damaged, ignored (it only serves to notice lost definition changes)",
                    self.path)
        return None

    def write(self, generation: int) -> None:
        head = struct.pack("<4sQ", self._MAGIC, generation)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.pwrite(fd, head + struct.pack("<I", zlib.crc32(head)), 0)
        finally:
            os.close(fd)
