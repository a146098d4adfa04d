"""Durable topology and users on disk: ``DIR/definitions.db``, an SQLite database the supervisor owns.

Definitions change rarely and in small numbers, so SQLite (stdlib, crash-safe, one file) is
worth more here than a log of our own. Every batch of changes (:mod:`broker.definitions`) is
one transaction, committed with ``synchronous=FULL`` in WAL mode: the commit is on disk
(fsync) before it returns, and a crash mid-commit leaves the previous state. Arguments are
stored as msgpack with sorted keys -- the encoding the rings use, so what comes back is
exactly what the supervisor had, and two spellings of one table are one row.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from broker.definitions import (
    BindingDef,
    Change,
    Definitions,
    ExchangeDef,
    QueueDef,
    Removed,
    Unbound,
)
from broker.errors import AMQPError
from broker.vhost import VirtualHost

log = logging.getLogger("shoal.definitions")

SCHEMA_VERSION = 1

_SCHEMA = """
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
"""


class DefinitionStoreError(Exception):
    """The database cannot be read as Shoal's definitions (damaged, or from a newer Shoal)."""


class DefinitionStore:
    """The durable exchanges, queues and bindings of one broker (one virtual host today)."""

    def __init__(self, path: str | Path, vhost: str = "/") -> None:
        self.path = Path(path)
        self.vhost = vhost
        self._encode = msgspec.msgpack.Encoder(order="sorted").encode
        self._decode = msgspec.msgpack.Decoder(dict[str, Any]).decode
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise DefinitionStoreError(
                    f"{self.path}: written by a newer Shoal (schema {version}, this one reads "
                    f"{SCHEMA_VERSION})")
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            raise DefinitionStoreError(f"{self.path}: {exc}") from exc

    def close(self) -> None:
        self._db.close()

    def load(self) -> Definitions:
        """Everything stored, each kind in the order it was created."""
        v = self.vhost
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
        except (sqlite3.DatabaseError, msgspec.DecodeError) as exc:
            raise DefinitionStoreError(f"{self.path}: {exc}") from exc
        return Definitions(exchanges, queues, bindings)

    def apply(self, changes: Iterable[Change]) -> None:
        """Write ``changes`` in order, in one transaction; on disk when this returns."""
        v = self.vhost
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
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
                        "routing_key, arguments) VALUES (?, ?, ?, ?, ?, ?)", self._binding_row(c))
                elif isinstance(c, Unbound):
                    db.execute(
                        "DELETE FROM bindings WHERE vhost=? AND source=? AND destination=? AND "
                        "to_exchange=? AND routing_key=? AND arguments=?", self._binding_row(c.binding))
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
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def users(self) -> dict[str, str]:
        """Name -> stored password (``broker.passwords``) of every user, in name order."""
        try:
            return dict(self._db.execute("SELECT name, password_hash FROM users ORDER BY name"))
        except sqlite3.DatabaseError as exc:
            raise DefinitionStoreError(f"{self.path}: {exc}") from exc

    def put_users(self, users: dict[str, str]) -> None:
        """Add these users, or give them these stored passwords; on disk when this returns."""
        with self._transaction():
            self._db.executemany("INSERT OR REPLACE INTO users (name, password_hash) VALUES (?, ?)",
                                 users.items())

    def delete_user(self, name: str) -> bool:
        """Remove a user; False when there is none of that name."""
        with self._transaction():
            return self._db.execute("DELETE FROM users WHERE name=?", (name,)).rowcount > 0

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _binding_row(self, b: BindingDef) -> tuple[Any, ...]:
        return (self.vhost, b.source, b.destination, b.to_exchange, b.routing_key,
                self._encode(b.arguments))


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
