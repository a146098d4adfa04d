"""Durable topology and users on disk: ``DIR/definitions.db``, an SQLite database the supervisor owns.

Definitions change rarely and in small numbers, so SQLite (stdlib, crash-safe, one file) is
worth more here than a log of our own. Every batch of changes (:mod:`broker.topology.definitions`) is
one transaction, committed with ``synchronous=FULL`` in WAL mode: the commit is on disk
(fsync) before it returns, and a crash mid-commit leaves the previous state. Arguments are
stored as msgpack with sorted keys -- the encoding the rings use, so what comes back is
exactly what the supervisor had, and two spellings of one table are one row.

Damage. SQLite ignores the WAL's frames from the first one whose checksum fails, and has no
checksum of its own on the main file's pages. So:

* each commit is checkpointed into the main file at once (``wal_checkpoint(TRUNCATE)``): a
  damaged WAL can cost at most the batch a crash caught between its commit and checkpoint;
* the ``meta`` table holds the node id (the data directory's marker holds it too,
  ``broker.storage.data_dir``), the generation (one more per committed batch; ``DIR/definitions.gen``
  gets it after each commit, so a database that comes back behind is seen) and a digest: the
  XOR of a hash of every row, kept by triggers in the transaction that changes the row. A start
  checks the digest and ``PRAGMA integrity_check``: a damaged page is refused, never half-read;
* :func:`inspect` reads through a read-only connection, which never checkpoints or deletes
  the WAL: a refused start leaves every file as it found it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import struct
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from broker.errors import AMQPError
from broker.storage.data_dir import DataDir, new_node_id
from broker.storage.vhost_rows import VhostRows
from broker.topology.definitions import (
    BindingDef,
    Change,
    Definitions,
    ExchangeDef,
    QueueDef,
    Removed,
    Unbound,
)
from broker.topology.vhost import VirtualHost

log = logging.getLogger("shoal.definitions")

# 2: meta (node id, generation, digest); 1 is adopted (meta added). 3: user_tags; a 2 is
# upgraded in place (the table added, empty: a user without a row has broker.passwords'
# DEFAULT_TAGS).
SCHEMA_VERSION = 3

_TABLES = """
CREATE TABLE IF NOT EXISTS exchanges (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    vhost TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL,
    auto_delete INTEGER NOT NULL, internal INTEGER NOT NULL, arguments BLOB NOT NULL,
    UNIQUE (vhost, name)
);
CREATE TABLE IF NOT EXISTS queues (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    vhost TEXT NOT NULL, name TEXT NOT NULL,
    auto_delete INTEGER NOT NULL, arguments BLOB NOT NULL,
    UNIQUE (vhost, name)
);
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY, password_hash TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS bindings (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    vhost TEXT NOT NULL, source TEXT NOT NULL, destination TEXT NOT NULL,
    to_exchange INTEGER NOT NULL, routing_key TEXT NOT NULL, arguments BLOB NOT NULL,
    UNIQUE (vhost, source, destination, to_exchange, routing_key, arguments)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value NOT NULL);
CREATE TABLE IF NOT EXISTS user_tags (name TEXT PRIMARY KEY, tags TEXT NOT NULL);
"""

# The columns each row's hash covers (seq is left out: it orders, and is not a definition).
_HASHED = {
    "exchanges": ("vhost", "name", "type", "auto_delete", "internal", "arguments"),
    "queues": ("vhost", "name", "auto_delete", "arguments"),
    "bindings": ("vhost", "source", "destination", "to_exchange", "routing_key", "arguments"),
    "users": ("name", "password_hash"),
    "user_tags": ("name", "tags"),
    "meta": ("key", "value"),
}
_DIGEST = "digest"  # the meta row holding the digest, the one row it does not cover
# Permissions (issue 37), added without a new schema: each table's rows have their own digest in
# a meta row (``digest.TABLE``), which the main digest covers as it covers any meta row -- so a
# Shoal of schema 3 that knows nothing of these tables still finds its digest right. A directory
# opened without them gets them, and every user it has gets full permissions on "/"
# (RabbitMQ's default user has them; an upgrade keeps everyone working).
_PERMISSION_TABLES = """
CREATE TABLE IF NOT EXISTS permissions (
    user TEXT NOT NULL, vhost TEXT NOT NULL,
    configure TEXT NOT NULL, write TEXT NOT NULL, read TEXT NOT NULL,
    PRIMARY KEY (user, vhost)
);
CREATE TABLE IF NOT EXISTS topic_permissions (
    user TEXT NOT NULL, vhost TEXT NOT NULL, exchange TEXT NOT NULL,
    write TEXT NOT NULL, read TEXT NOT NULL,
    PRIMARY KEY (user, vhost, exchange)
);
"""
_SUB_HASHED = {
    "permissions": ("user", "vhost", "configure", "write", "read"),
    "topic_permissions": ("user", "vhost", "exchange", "write", "read"),
}
_MIX = "shoal_mix"


def _mix(acc: int, *row: Any) -> int:
    """``acc`` XOR a 64-bit hash of ``row``: its own inverse, so an insert and the delete of
    the same row cancel out, and the digest does not depend on the order of changes."""
    h = hashlib.blake2b(repr(row).encode(), digest_size=8).digest()
    return acc ^ int.from_bytes(h, "little", signed=True)


def _sub_triggers() -> Iterator[str]:
    """The triggers that keep each ``_SUB_HASHED`` table's digest in its meta row."""
    for table, columns in _SUB_HASHED.items():
        for event, rows in (("INSERT", ("NEW",)), ("DELETE", ("OLD",)), ("UPDATE", ("OLD", "NEW"))):
            value = "value"
            for row in rows:
                value = f"{_MIX}({value}, '{table}', " + ", ".join(f"{row}.{c}" for c in columns) + ")"
            yield (f"CREATE TRIGGER IF NOT EXISTS {table}_{event.lower()} AFTER {event} ON {table}"
                   f" BEGIN UPDATE meta SET value = {value} WHERE key = 'digest.{table}'; END")


def _sub_digest(db: sqlite3.Connection, table: str) -> int:
    acc = 0
    for row in db.execute(f"SELECT {', '.join(_SUB_HASHED[table])} FROM {table}"):
        acc = _mix(acc, table, *row)
    return acc


# Policies (issue 36 §4), added without a new schema: the rows' digest is the meta row
# 'digest.policies', kept by triggers and covered by the main digest as any meta row is -- so a
# Shoal of schema 3 that knows nothing of the table still finds its digest right. A directory
# opened without the table gets it (empty).
_POLICIES_TABLE = """CREATE TABLE IF NOT EXISTS policies (
    vhost TEXT NOT NULL, name TEXT NOT NULL, operator INTEGER NOT NULL, pattern TEXT NOT NULL,
    apply_to TEXT NOT NULL, definition TEXT NOT NULL, priority INTEGER NOT NULL,
    PRIMARY KEY (vhost, name, operator)
)"""
_POLICY_COLUMNS = ("vhost", "name", "operator", "pattern", "apply_to", "definition", "priority")
_POLICY_DIGEST = "digest.policies"


def _policy_triggers() -> Iterator[str]:
    for event, rows in (("INSERT", ("NEW",)), ("DELETE", ("OLD",)), ("UPDATE", ("OLD", "NEW"))):
        value = "value"
        for row in rows:
            value = f"{_MIX}({value}, 'policies', " + ", ".join(f"{row}.{c}" for c in _POLICY_COLUMNS) + ")"
        yield (f"CREATE TRIGGER IF NOT EXISTS policies_{event.lower()} AFTER {event} ON policies"
               f" BEGIN UPDATE meta SET value = {value} WHERE key = '{_POLICY_DIGEST}'; END")


def _policy_digest(db: sqlite3.Connection) -> int:
    acc = 0
    for row in db.execute(f"SELECT {', '.join(_POLICY_COLUMNS)} FROM policies"):
        acc = _mix(acc, "policies", *row)
    return acc


# Runtime parameters (issue 39: dynamic shovels), added without a new schema as the policies
# were: the rows' digest is the meta row 'digest.parameters', kept by triggers and covered by the
# main digest as any meta row is. A directory opened without the table gets it (empty). The value
# is RabbitMQ's JSON, kept as text (its URIs hold passwords, as RabbitMQ's own store does).
_PARAMETERS_TABLE = """CREATE TABLE IF NOT EXISTS parameters (
    vhost TEXT NOT NULL, component TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (vhost, component, name)
)"""
_PARAMETER_COLUMNS = ("vhost", "component", "name", "value")
_PARAMETER_DIGEST = "digest.parameters"


def _parameter_triggers() -> Iterator[str]:
    for event, rows in (("INSERT", ("NEW",)), ("DELETE", ("OLD",)), ("UPDATE", ("OLD", "NEW"))):
        value = "value"
        for row in rows:
            value = (f"{_MIX}({value}, 'parameters', "
                     + ", ".join(f"{row}.{c}" for c in _PARAMETER_COLUMNS) + ")")
        yield (f"CREATE TRIGGER IF NOT EXISTS parameters_{event.lower()} AFTER {event} ON "
               f"parameters BEGIN UPDATE meta SET value = {value} WHERE key = "
               f"'{_PARAMETER_DIGEST}'; END")


def _parameter_digest(db: sqlite3.Connection) -> int:
    acc = 0
    for row in db.execute(f"SELECT {', '.join(_PARAMETER_COLUMNS)} FROM parameters"):
        acc = _mix(acc, "parameters", *row)
    return acc


def _triggers() -> Iterator[str]:
    for table, columns in _HASHED.items():
        skip = f" WHEN {{0}}.key != '{_DIGEST}'" if table == "meta" else ""
        for event, rows in (("INSERT", ("NEW",)), ("DELETE", ("OLD",)), ("UPDATE", ("OLD", "NEW"))):
            when = skip.format(rows[-1]) if skip else ""
            value = "value"
            for row in rows:
                value = f"{_MIX}({value}, '{table}', " + ", ".join(f"{row}.{c}" for c in columns) + ")"
            yield (f"CREATE TRIGGER IF NOT EXISTS {table}_{event.lower()} AFTER {event} ON {table}"
                   f"{when} BEGIN UPDATE meta SET value = {value} WHERE key = '{_DIGEST}'; END")


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
        _check_version(db, path)
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
        if problem is None and node is not None and _digest(db) != meta.get(_DIGEST):
            problem = "damaged (its rows do not match their digest)"
        for table in _SUB_HASHED:
            if (problem is None and table in tables
                    and _sub_digest(db, table) != meta.get(f"digest.{table}")):
                problem = f"damaged (its {table} do not match their digest)"
        if (problem is None and "policies" in tables
                and _policy_digest(db) != meta.get(_POLICY_DIGEST)):
            problem = "damaged (its policies do not match their digest)"
        if (problem is None and "parameters" in tables
                and _parameter_digest(db) != meta.get(_PARAMETER_DIGEST)):
            problem = "damaged (its parameters do not match their digest)"
        return Inspection(True, True, node if isinstance(node, str) else None,
                          generation if isinstance(generation, int) else 0, users, problem)
    except sqlite3.DatabaseError as exc:
        raise DefinitionStoreError(f"{path}: {exc}") from exc
    except UnicodeDecodeError:  # a damaged page can hold text that is not UTF-8
        raise DefinitionStoreError(f"{path}: damaged (text that is not UTF-8)") from None
    finally:
        db.close()


def _check_version(db: sqlite3.Connection, path: Path) -> int:
    version: int = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise NewerDefinitions(
            f"{path}: written by a newer Shoal (schema {version}, this one reads {SCHEMA_VERSION})")
    return version


def _digest(db: sqlite3.Connection) -> int:
    acc = 0
    present = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for table, columns in _HASHED.items():
        if table not in present:  # an older schema's (user_tags before 3): no rows
            continue
        where = f" WHERE key != '{_DIGEST}'" if table == "meta" else ""
        for row in db.execute(f"SELECT {', '.join(columns)} FROM {table}{where}"):
            acc = _mix(acc, table, *row)
    return acc


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


class DefinitionStore(VhostRows):
    """The durable exchanges, queues and bindings of one broker, each in its vhost (their
    rows: :class:`broker.storage.vhost_rows.VhostRows`).

    Opening one creates Shoal's tables in a new database, with ``node`` (a new id unless
    given) in meta, or adds meta to one from a Shoal that wrote none; :func:`open_definitions`
    decides beforehand whether the data directory may be opened at all."""

    def __init__(self, path: str | Path, vhost: str = "/", node: str | None = None,
                 generation_file: Path | None = None) -> None:
        self.path = Path(path)
        self.vhost = vhost
        self._encode = msgspec.msgpack.Encoder(order="sorted").encode
        self._decode = msgspec.msgpack.Decoder(dict[str, Any]).decode
        self._generation_file = GenerationFile(generation_file) if generation_file else None
        self.checkpoints = True  # each commit goes into the main file at once
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.DatabaseError as exc:
            raise DefinitionStoreError(f"{self.path}: {exc}") from exc
        try:
            self._db.create_function(_MIX, -1, _mix, deterministic=True)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            # INSERT OR REPLACE deletes the row it replaces: its DELETE trigger must run too.
            self._db.execute("PRAGMA recursive_triggers=ON")
            if _check_version(self._db, self.path) < SCHEMA_VERSION or not self._has_meta():
                with self._transaction(count=False):
                    self._install(node or new_node_id())
            if not self._has_table("permissions"):
                with self._transaction(count=False):
                    self._install_permissions()
            if self._db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND "
                                "name='policies'").fetchone() is None:
                with self._transaction(count=False):
                    self._db.execute(_POLICIES_TABLE)
                    self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, 0)",
                                     (_POLICY_DIGEST,))
                    for trigger in _policy_triggers():
                        self._db.execute(trigger)
            if not self._has_table("vhosts"):
                with self._transaction(count=False):
                    self._install_vhosts()
            if not self._has_table("parameters"):
                with self._transaction(count=False):
                    self._db.execute(_PARAMETERS_TABLE)
                    self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, 0)",
                                     (_PARAMETER_DIGEST,))
                    for trigger in _parameter_triggers():
                        self._db.execute(trigger)
            self.node: str = self._meta("node")
            self.generation: int = self._meta("generation")
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            self._db.close()
            raise DefinitionStoreError(f"{self.path}: {exc}") from exc
        except BaseException:
            self._db.close()
            raise

    def _has_meta(self) -> bool:
        return self._has_table("meta")

    def _has_table(self, name: str) -> bool:
        return self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone() is not None

    def _install_permissions(self) -> None:
        """The permission tables, their digests and triggers; every user already here gets
        full permissions on the vhost (module text); inside the caller's transaction."""
        for statement in _PERMISSION_TABLES.split(";"):
            if statement.strip():
                self._db.execute(statement)
        for table in _SUB_HASHED:
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, 0)",
                             (f"digest.{table}",))
        for trigger in _sub_triggers():
            self._db.execute(trigger)
        self._db.executemany(
            "INSERT OR IGNORE INTO permissions (user, vhost, configure, write, read) "
            "VALUES (?, ?, '.*', '.*', '.*')",
            [(name, self.vhost) for (name,) in self._db.execute("SELECT name FROM users")])

    def _meta(self, key: str) -> Any:
        return self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()[0]

    def _install(self, node: str) -> None:
        """Shoal's tables (those already there are kept), meta, the digest of every row, and
        the triggers that keep it; inside the caller's transaction."""
        for statement in _TABLES.split(";"):
            if statement.strip():
                self._db.execute(statement)
        self._db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('node', ?)", (node,))
        self._db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('generation', 0)")
        self._db.execute("DELETE FROM meta WHERE key=?", (_DIGEST,))
        self._db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (_DIGEST, _digest(self._db)))
        for trigger in _triggers():
            self._db.execute(trigger)
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def load(self, vhost: str | None = None) -> Definitions:
        """Everything stored in ``vhost`` (None: the store's), each kind in creation order."""
        v = self.vhost if vhost is None else vhost
        q = self._db.execute
        try:
            exchanges = [
                ExchangeDef(name, type_, bool(ad), bool(internal), self._decode(args))
                for name, type_, ad, internal, args in q(
                    "SELECT name, type, auto_delete, internal, arguments FROM exchanges "
                    "WHERE vhost=? ORDER BY seq", (v,))
            ]
            queues = [
                QueueDef(name, bool(ad), self._decode(args))
                for name, ad, args in q(
                    "SELECT name, auto_delete, arguments FROM queues WHERE vhost=? ORDER BY seq", (v,))
            ]
            bindings = [
                BindingDef(src, dst, bool(to_x), key, self._decode(args))
                for src, dst, to_x, key, args in q(
                    "SELECT source, destination, to_exchange, routing_key, arguments FROM bindings "
                    "WHERE vhost=? ORDER BY seq", (v,))
            ]
        except (sqlite3.DatabaseError, msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise DefinitionStoreError(f"{self.path}: {exc}") from exc
        return Definitions(exchanges, queues, bindings)

    def apply(self, changes: Iterable[Change], vhost: str | None = None) -> None:
        """Write ``changes`` to ``vhost`` (None: the store's) in order, in one transaction;
        on disk when this returns."""
        v = self.vhost if vhost is None else vhost
        db = self._db
        with self._transaction():
            for c in changes:
                if isinstance(c, ExchangeDef):
                    db.execute(
                        "INSERT OR REPLACE INTO exchanges (vhost, name, type, auto_delete, internal, "
                        "arguments) VALUES (?, ?, ?, ?, ?, ?)",
                        (v, c.name, c.type, c.auto_delete, c.internal, self._encode(c.arguments)))
                elif isinstance(c, QueueDef):
                    db.execute(
                        "INSERT OR REPLACE INTO queues (vhost, name, auto_delete, arguments) "
                        "VALUES (?, ?, ?, ?)", (v, c.name, c.auto_delete, self._encode(c.arguments)))
                elif isinstance(c, BindingDef):
                    db.execute(
                        "INSERT OR IGNORE INTO bindings (vhost, source, destination, to_exchange, "
                        "routing_key, arguments) VALUES (?, ?, ?, ?, ?, ?)", self._binding_row(c, v))
                elif isinstance(c, Unbound):
                    db.execute(
                        "DELETE FROM bindings WHERE vhost=? AND source=? AND destination=? AND "
                        "to_exchange=? AND routing_key=? AND arguments=?", self._binding_row(c.binding, v))
                elif isinstance(c, Removed) and c.kind == "queue":
                    db.execute("DELETE FROM queues WHERE vhost=? AND name=?", (v, c.name))
                    db.execute("DELETE FROM bindings WHERE vhost=? AND destination=? AND to_exchange=0",
                               (v, c.name))
                elif isinstance(c, Removed) and c.kind == "exchange":
                    db.execute("DELETE FROM exchanges WHERE vhost=? AND name=?", (v, c.name))
                    db.execute("DELETE FROM bindings WHERE vhost=? AND (source=? OR "
                               "(destination=? AND to_exchange=1))", (v, c.name, c.name))
                else:
                    raise ValueError(f"not a definition change: {c!r}")

    def users(self) -> dict[str, str]:
        """Name -> stored password (``broker.passwords``) of every user, in name order."""
        try:
            return dict(self._db.execute("SELECT name, password_hash FROM users ORDER BY name"))
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            raise DefinitionStoreError(f"{self.path}: {exc}") from exc

    def put_users(self, users: dict[str, str]) -> None:
        """Add these users, or give them these stored passwords; on disk when this returns."""
        with self._transaction():
            self._db.executemany("INSERT OR REPLACE INTO users (name, password_hash) VALUES (?, ?)",
                                 users.items())

    def delete_user(self, name: str) -> bool:
        """Remove a user (and its tags and permissions); False when there is none of that name."""
        with self._transaction():
            self._db.execute("DELETE FROM user_tags WHERE name=?", (name,))
            self._db.execute("DELETE FROM permissions WHERE user=?", (name,))
            self._db.execute("DELETE FROM topic_permissions WHERE user=?", (name,))
            return self._db.execute("DELETE FROM users WHERE name=?", (name,)).rowcount > 0

    def user_tags(self) -> dict[str, list[str]]:
        """Name -> tags of the users that have a user_tags row (the others have DEFAULT_TAGS)."""
        try:
            return {name: [t for t in tags.split(",") if t] for name, tags in
                    self._db.execute("SELECT name, tags FROM user_tags ORDER BY name")}
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            raise DefinitionStoreError(f"{self.path}: {exc}") from exc

    def put_user(self, name: str, password_hash: str | None, tags: list[str] | None) -> None:
        """Add or change one user in one transaction: its stored password (None: unchanged, the
        user must exist) and its tags (None: unchanged); on disk when this returns."""
        with self._transaction():
            if password_hash is not None:
                self._db.execute("INSERT OR REPLACE INTO users (name, password_hash) VALUES (?, ?)",
                                 (name, password_hash))
            if tags is not None:
                self._db.execute("INSERT OR REPLACE INTO user_tags (name, tags) VALUES (?, ?)",
                                 (name, ",".join(tags)))

    def permissions(self) -> dict[str, dict[str, tuple[str, str, str]]]:
        """user -> vhost -> (configure, write, read)."""
        table: dict[str, dict[str, tuple[str, str, str]]] = {}
        try:
            for user, vhost, c, w, rd in self._db.execute(
                    "SELECT user, vhost, configure, write, read FROM permissions ORDER BY user, vhost"):
                table.setdefault(user, {})[vhost] = (c, w, rd)
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            raise DefinitionStoreError(f"{self.path}: {exc}") from exc
        return table

    def topic_permissions(self) -> dict[str, dict[str, dict[str, tuple[str, str]]]]:
        """user -> vhost -> exchange -> (write, read)."""
        table: dict[str, dict[str, dict[str, tuple[str, str]]]] = {}
        try:
            for user, vhost, x, w, rd in self._db.execute(
                    "SELECT user, vhost, exchange, write, read FROM topic_permissions "
                    "ORDER BY user, vhost, exchange"):
                table.setdefault(user, {}).setdefault(vhost, {})[x] = (w, rd)
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            raise DefinitionStoreError(f"{self.path}: {exc}") from exc
        return table

    def put_permissions(self, user: str, vhost: str, perms: tuple[str, str, str] | None) -> None:
        """Set (None: clear) a user's permissions on a vhost; on disk when this returns."""
        with self._transaction():
            if perms is None:
                self._db.execute("DELETE FROM permissions WHERE user=? AND vhost=?", (user, vhost))
            else:
                self._db.execute("INSERT OR REPLACE INTO permissions (user, vhost, configure, "
                                 "write, read) VALUES (?, ?, ?, ?, ?)", (user, vhost, *perms))

    def put_topic_permissions(self, user: str, vhost: str, exchange: str | None,
                              perms: tuple[str, str] | None) -> None:
        """Set a user's topic permission on an exchange, or clear it (``perms`` None; ``exchange``
        None: all of the vhost's)."""
        with self._transaction():
            if perms is None and exchange is None:
                self._db.execute("DELETE FROM topic_permissions WHERE user=? AND vhost=?",
                                 (user, vhost))
            elif perms is None:
                self._db.execute("DELETE FROM topic_permissions WHERE user=? AND vhost=? AND "
                                 "exchange=?", (user, vhost, exchange))
            else:
                self._db.execute("INSERT OR REPLACE INTO topic_permissions (user, vhost, exchange, "
                                 "write, read) VALUES (?, ?, ?, ?, ?)", (user, vhost, exchange, *perms))

    def policies(self) -> list[dict[str, Any]]:
        """Every stored policy: RabbitMQ's shape, ``operator`` true for operator policies."""
        try:
            return [{"vhost": v, "name": n, "operator": bool(op), "pattern": pat, "apply-to": ap,
                     "definition": json.loads(d), "priority": pr}
                    for v, n, op, pat, ap, d, pr in self._db.execute(
                        f"SELECT {', '.join(_POLICY_COLUMNS)} FROM policies ORDER BY vhost, name")]
        except (sqlite3.DatabaseError, UnicodeDecodeError, ValueError) as exc:
            raise DefinitionStoreError(f"{self.path}: {exc}") from exc

    def put_policy(self, policy: dict[str, Any], operator: bool = False) -> None:
        """Add or replace a policy (RabbitMQ's shape); on disk when this returns."""
        with self._transaction():
            self._db.execute(
                f"INSERT OR REPLACE INTO policies ({', '.join(_POLICY_COLUMNS)}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (policy["vhost"], policy["name"], int(operator), policy["pattern"],
                 policy["apply-to"], json.dumps(policy["definition"], sort_keys=True),
                 policy["priority"]))

    def delete_policy(self, vhost: str, name: str, operator: bool = False) -> bool:
        """Remove a policy; False when there is none of that name."""
        with self._transaction():
            return self._db.execute("DELETE FROM policies WHERE vhost=? AND name=? AND operator=?",
                                    (vhost, name, int(operator))).rowcount > 0

    def parameters(self) -> list[dict[str, Any]]:
        """Every stored runtime parameter, RabbitMQ's shape: {value, vhost, component, name}."""
        try:
            return [{"value": json.loads(value), "vhost": v, "component": c, "name": n}
                    for v, c, n, value in self._db.execute(
                        f"SELECT {', '.join(_PARAMETER_COLUMNS)} FROM parameters "
                        "ORDER BY vhost, component, name")]
        except (sqlite3.DatabaseError, UnicodeDecodeError, ValueError) as exc:
            raise DefinitionStoreError(f"{self.path}: {exc}") from exc

    def put_parameter(self, vhost: str, component: str, name: str, value: Any) -> None:
        """Add or replace a parameter; on disk when this returns."""
        with self._transaction():
            self._db.execute(
                f"INSERT OR REPLACE INTO parameters ({', '.join(_PARAMETER_COLUMNS)}) "
                "VALUES (?, ?, ?, ?)", (vhost, component, name, json.dumps(value, sort_keys=True)))

    def delete_parameter(self, vhost: str, component: str, name: str) -> bool:
        """Remove a parameter; False when there is none of that name."""
        with self._transaction():
            return self._db.execute(
                "DELETE FROM parameters WHERE vhost=? AND component=? AND name=?",
                (vhost, component, name)).rowcount > 0

    @contextmanager
    def _transaction(self, count: bool = True) -> Iterator[None]:
        """One batch: committed with the next generation (unless not ``count``; on disk when
        this returns), the generation file updated, then checkpointed into the main file."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
            if count:
                db.execute("UPDATE meta SET value = value + 1 WHERE key='generation'")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.generation = self._meta("generation")
        if self._generation_file is not None:
            self._generation_file.write(self.generation)
        if self.checkpoints:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Copy the WAL into the main file and empty it: from here a damaged WAL costs nothing
        committed. A failure is logged (the batch stays committed, in the WAL)."""
        try:
            busy = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            log.warning("%s: checkpoint failed (%s): the latest definitions are in its WAL only",
                        self.path, exc)
            return
        if busy:
            log.warning("%s: checkpoint incomplete: the latest definitions are in its WAL only",
                        self.path)

    def _binding_row(self, b: BindingDef, vhost: str) -> tuple[Any, ...]:
        return (vhost, b.source, b.destination, b.to_exchange, b.routing_key,
                self._encode(b.arguments))


@dataclass(frozen=True)
class Opened:
    """A data directory's definitions, checked (:func:`open_definitions`)."""

    store: DefinitionStore
    new: bool  # a brand-new data directory: RabbitMQ's default user may be created
    marked: bool  # the marker is written (a new or adopted directory gets it once its users are in)
    behind: int  # change batches committed once that the database no longer holds


def open_definitions(data: DataDir, vhost: str = "/", *, create: bool = True) -> Opened:
    """The definitions of ``data``, never those of a new directory in place of lost ones.

    With the marker (``broker.storage.data_dir``), definitions.db must be there, intact, and hold the
    marker's node id; without it, a directory is new only if it has no tables, no WAL frames
    and no queue data (``create``: may one be created here), and a database from a Shoal that
    wrote no marker is adopted. Anything else raises DataDirDamaged: one line naming the file,
    and nothing in the directory changed."""
    node = data.read_marker()
    path = data.definitions
    wal = path.with_name(f"{path.name}-wal")
    wal_frames = wal.exists() and wal.stat().st_size > 32  # 32: the WAL's header alone
    problem = wal_damage(wal) if wal_frames else None
    if problem:
        raise data.damaged(wal, problem)
    try:
        seen = inspect(path)
    except NewerDefinitions:
        raise
    except DefinitionStoreError as exc:
        raise data.damaged(path, str(exc).removeprefix(f"{path}: ")) from None
    if node is not None:
        if not seen.exists:
            raise data.damaged(path, f"missing or empty, though {data.marker} says this data directory "
                                     "was initialised")
        if seen.problem:
            raise data.damaged(path, seen.problem)
        if seen.node is None:
            raise data.damaged(path, "holds none of this data directory's definitions (its "
                                     "content is lost)")
        if seen.node != node:
            raise data.damaged(path, f"belongs to node {seen.node}, not to this data directory "
                                     f"(node {node}, {data.marker})")
        new = False
    elif not seen.tables:
        if wal_frames:
            raise data.damaged(path, f"holds no definitions, and {wal.name} holds pages SQLite "
                                     "cannot use (their checksums fail)")
        if data.holds_queue_data():
            raise data.damaged(path, f"missing or empty, though {data.path} holds queue data")
        if not create:
            raise DefinitionStoreError(f"no broker data in {data.path}")
        new = True
    elif seen.problem:
        raise data.damaged(path, seen.problem)
    else:  # from a Shoal that wrote no marker, or a first start cut short before it
        new = seen.node is not None and seen.generation == 0 and seen.users == 0
    try:
        store = DefinitionStore(path, vhost, generation_file=data.generation)
    except DefinitionStoreError as exc:
        raise data.damaged(path, str(exc).removeprefix(f"{path}: ")) from None
    recorded = GenerationFile(data.generation).read()
    behind = recorded - store.generation if recorded is not None and node is not None else 0
    if behind > 0 or recorded != store.generation:
        GenerationFile(data.generation).write(store.generation)
    return Opened(store, new, node is not None, max(behind, 0))


def restore(vhost: VirtualHost, definitions: Definitions) -> list[str]:
    """Declare ``definitions`` on a fresh ``vhost``: exchanges, then queues, then bindings.

    A definition the broker now refuses (say, an argument a later version checks more
    strictly) is logged and skipped, never fatal; so is a binding whose end is missing.
    Returns one line per skipped definition."""
    skipped: list[str] = []

    def attempt(what: str, declare: Any, *args: Any, **kwargs: Any) -> None:
        try:
            declare(*args, **kwargs)
        except AMQPError as exc:
            line = f"{what}: {exc.reply_text}"
            log.error("definitions: not restored: %s", line)
            skipped.append(line)

    for x in definitions.exchanges:
        attempt(f"exchange '{x.name}'", vhost.declare_exchange, x.name, x.type, durable=True,
                auto_delete=x.auto_delete, internal=x.internal, arguments=x.arguments)
    for q in definitions.queues:
        attempt(f"queue '{q.name}'", vhost.declare_queue, q.name, owner=None, durable=True,
                auto_delete=q.auto_delete, arguments=q.arguments, reserved=True)
    for b in definitions.bindings:
        what = f"binding of '{b.source}' to '{b.destination}' ({b.routing_key!r})"
        if b.to_exchange:
            attempt(what, vhost.bind_exchange, b.destination, b.source, b.routing_key, b.arguments)
        else:
            attempt(what, vhost.bind_queue, b.destination, b.source, b.routing_key, b.arguments,
                    owner=None)
    return skipped
