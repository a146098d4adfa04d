"""The tables of ``definitions.db`` and the digests that cover their rows.

The core tables (``CORE_TABLES``: exchanges, queues, bindings, users, user tags, meta) are
covered by one digest, the meta row ``digest``: the XOR of a hash of every row, kept by
triggers in the transaction that changes a row. Each table added later is a :class:`SideTable`:
its rows have their own digest in a meta row (``digest.TABLE``), which the main digest covers as
it covers any meta row -- so a Shoal of schema 3 that knows nothing of a side table still finds
its digest right, and a directory opened without one gets it (empty) with no new schema.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

# 2: meta (node id, generation, digest); 1 is adopted (meta added). 3: user_tags; a 2 is
# upgraded in place (the table added, empty: a user without a row has broker.passwords'
# DEFAULT_TAGS).
SCHEMA_VERSION = 3

CORE_TABLES = """
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

# The columns each core row's hash covers (seq is left out: it orders, and is not a definition).
_HASHED = {
    "exchanges": ("vhost", "name", "type", "auto_delete", "internal", "arguments"),
    "queues": ("vhost", "name", "auto_delete", "arguments"),
    "bindings": ("vhost", "source", "destination", "to_exchange", "routing_key", "arguments"),
    "users": ("name", "password_hash"),
    "user_tags": ("name", "tags"),
    "meta": ("key", "value"),
}
DIGEST = "digest"  # the meta row holding the main digest, the one row it does not cover
MIX = "shoal_mix"  # the SQL function the triggers call: :func:`mix`
_EVENTS = (("INSERT", ("NEW",)), ("DELETE", ("OLD",)), ("UPDATE", ("OLD", "NEW")))


def mix(acc: int, *row: Any) -> int:
    """``acc`` XOR a 64-bit hash of ``row``: its own inverse, so an insert and the delete of
    the same row cancel out, and the digest does not depend on the order of changes."""
    h = hashlib.blake2b(repr(row).encode(), digest_size=8).digest()
    return acc ^ int.from_bytes(h, "little", signed=True)


def _trigger(table: str, columns: Sequence[str], digest_key: str, when: str = "") -> Iterator[str]:
    """The three triggers that fold each changed row of ``table`` into the meta row ``digest_key``."""
    for event, rows in _EVENTS:
        value = "value"
        for row in rows:
            value = f"{MIX}({value}, '{table}', " + ", ".join(f"{row}.{c}" for c in columns) + ")"
        yield (f"CREATE TRIGGER IF NOT EXISTS {table}_{event.lower()} AFTER {event} ON {table}"
               f"{when.format(rows[-1])} BEGIN UPDATE meta SET value = {value} "
               f"WHERE key = '{digest_key}'; END")


def core_triggers() -> Iterator[str]:
    """The triggers that keep the main digest (the meta row ``digest`` skips itself)."""
    for table, columns in _HASHED.items():
        when = f" WHEN {{0}}.key != '{DIGEST}'" if table == "meta" else ""
        yield from _trigger(table, columns, DIGEST, when)


def core_digest(db: sqlite3.Connection) -> int:
    """The main digest, computed from the rows (an older schema's missing table has none)."""
    acc = 0
    present = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for table, columns in _HASHED.items():
        if table not in present:
            continue
        where = f" WHERE key != '{DIGEST}'" if table == "meta" else ""
        for row in db.execute(f"SELECT {', '.join(columns)} FROM {table}{where}"):
            acc = mix(acc, table, *row)
    return acc


@dataclass(frozen=True)
class SideTable:
    """A table with its own digest row: its columns (every one hashed), the leading ``keys``
    of them that name a row, and what it is called in a damage report."""

    name: str
    columns: tuple[str, ...]
    keys: tuple[str, ...]
    create: str  # the CREATE TABLE statement

    @property
    def digest_key(self) -> str:
        return f"digest.{self.name}"

    def install(self, db: sqlite3.Connection) -> None:
        """The table, its digest row (an empty table's: 0) and triggers; in the caller's
        transaction."""
        db.execute(self.create)
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, 0)", (self.digest_key,))
        for trigger in _trigger(self.name, self.columns, self.digest_key):
            db.execute(trigger)

    def digest(self, db: sqlite3.Connection) -> int:
        acc = 0
        for row in db.execute(f"SELECT {', '.join(self.columns)} FROM {self.name}"):
            acc = mix(acc, self.name, *row)
        return acc

    def rows(self, db: sqlite3.Connection, **where: Any) -> list[tuple[Any, ...]]:
        """Every row (those whose columns equal ``where``'s values), in key order."""
        test = " AND ".join(f"{c}=?" for c in where)
        return db.execute(f"SELECT {', '.join(self.columns)} FROM {self.name}"
                          f"{' WHERE ' + test if test else ''} ORDER BY {', '.join(self.keys)}",
                          tuple(where.values())).fetchall()

    def replace(self, db: sqlite3.Connection, row: Sequence[Any]) -> None:
        """Add ``row``, or replace the one with its keys."""
        db.execute(f"INSERT OR REPLACE INTO {self.name} ({', '.join(self.columns)}) "
                   f"VALUES ({', '.join('?' * len(self.columns))})", tuple(row))

    def delete(self, db: sqlite3.Connection, **where: Any) -> int:
        """Remove the rows whose columns equal ``where``'s values; how many there were."""
        test = " AND ".join(f"{c}=?" for c in where)
        return db.execute(f"DELETE FROM {self.name} WHERE {test}", tuple(where.values())).rowcount


# Permissions (issue 37): a directory opened without them gets them, and every user it has
# gets full permissions on "/" (RabbitMQ's default user has them; an upgrade keeps everyone
# working): DefinitionStore does that.
PERMISSIONS = SideTable("permissions", ("user", "vhost", "configure", "write", "read"),
                        ("user", "vhost"), """CREATE TABLE IF NOT EXISTS permissions (
    user TEXT NOT NULL, vhost TEXT NOT NULL,
    configure TEXT NOT NULL, write TEXT NOT NULL, read TEXT NOT NULL,
    PRIMARY KEY (user, vhost)
)""")
TOPIC_PERMISSIONS = SideTable(
    "topic_permissions", ("user", "vhost", "exchange", "write", "read"),
    ("user", "vhost", "exchange"), """CREATE TABLE IF NOT EXISTS topic_permissions (
    user TEXT NOT NULL, vhost TEXT NOT NULL, exchange TEXT NOT NULL,
    write TEXT NOT NULL, read TEXT NOT NULL,
    PRIMARY KEY (user, vhost, exchange)
)""")
# Policies (issue 36 §4); ``operator`` 1 for operator policies, ``definition`` JSON text.
POLICIES = SideTable(
    "policies", ("vhost", "name", "operator", "pattern", "apply_to", "definition", "priority"),
    ("vhost", "name"), """CREATE TABLE IF NOT EXISTS policies (
    vhost TEXT NOT NULL, name TEXT NOT NULL, operator INTEGER NOT NULL, pattern TEXT NOT NULL,
    apply_to TEXT NOT NULL, definition TEXT NOT NULL, priority INTEGER NOT NULL,
    PRIMARY KEY (vhost, name, operator)
)""")
# Runtime parameters (issue 39: dynamic shovels). The value is RabbitMQ's JSON, kept as text
# (its URIs hold passwords, as RabbitMQ's own store does).
PARAMETERS = SideTable(
    "parameters", ("vhost", "component", "name", "value"), ("vhost", "component", "name"),
    """CREATE TABLE IF NOT EXISTS parameters (
    vhost TEXT NOT NULL, component TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (vhost, component, name)
)""")

# Virtual hosts (issue 37): a directory opened without the table gets it with "/" in it
# (broker.storage.vhost_rows); ``tags`` and ``metadata`` JSON text.
VHOSTS = SideTable(
    "vhosts", ("name", "description", "tags", "default_queue_type", "metadata"), ("name",),
    """CREATE TABLE IF NOT EXISTS vhosts (
    name TEXT PRIMARY KEY, description TEXT NOT NULL, tags TEXT NOT NULL,
    default_queue_type TEXT NOT NULL, metadata TEXT NOT NULL
)""")

# Vhost and user limits (issue 37; broker.runtime.limits): one row per limit that is set.
VHOST_LIMITS = SideTable("vhost_limits", ("vhost", "name", "value"), ("vhost", "name"),
                         """CREATE TABLE IF NOT EXISTS vhost_limits (
    vhost TEXT NOT NULL, name TEXT NOT NULL, value INTEGER NOT NULL, PRIMARY KEY (vhost, name)
)""")
USER_LIMITS = SideTable("user_limits", ("user", "name", "value"), ("user", "name"),
                        """CREATE TABLE IF NOT EXISTS user_limits (
    user TEXT NOT NULL, name TEXT NOT NULL, value INTEGER NOT NULL, PRIMARY KEY (user, name)
)""")

# In the order a start installs them and checks their digests.
SIDE_TABLES = (PERMISSIONS, TOPIC_PERMISSIONS, POLICIES, PARAMETERS, VHOSTS, VHOST_LIMITS, USER_LIMITS)
