"""The virtual hosts in ``definitions.db``: which exist, what was said of them, deleting one.

A row per vhost (RabbitMQ's ``vhost`` record: name, description, tags, default queue type,
metadata). A data directory without the table -- a new one, or one written before there were
vhosts -- gets it with "/" alone, so everything already stored (all of it "/"'s) stays where
it was. Deleting a vhost deletes its row and every row of every table that names it (its
exchanges, queues, bindings, permissions, topic permissions, policies, parameters), in one
transaction: what rabbit_vhost:delete takes away.

Called from: the supervisor process (``broker.storage.definition_store``'s store mixes it in).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

DEFAULT_VHOST = "/"
VHOSTS_TABLE = """CREATE TABLE IF NOT EXISTS vhosts (
    name TEXT PRIMARY KEY, description TEXT NOT NULL, tags TEXT NOT NULL,
    default_queue_type TEXT NOT NULL, metadata TEXT NOT NULL
)"""
_COLUMNS = ("name", "description", "tags", "default_queue_type", "metadata")
# Every table whose rows belong to one vhost (its ``vhost`` column).
PER_VHOST = ("exchanges", "queues", "bindings", "permissions", "topic_permissions", "policies",
             "parameters")


class VhostRows:
    """The vhosts table of a :class:`~broker.storage.definition_store.DefinitionStore`."""

    _db: sqlite3.Connection

    def _transaction(self, count: bool = True) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _install_vhosts(self) -> None:
        """The table, with "/" in it, where there is none (inside the caller's transaction)."""
        self._db.execute(VHOSTS_TABLE)
        self._db.execute("INSERT OR IGNORE INTO vhosts VALUES (?, '', '[]', 'classic', '{}')",
                         (DEFAULT_VHOST,))

    def vhosts(self) -> list[dict[str, Any]]:
        """Every stored vhost, by name: name, description, tags, default_queue_type, metadata."""
        return [{"name": name, "description": description, "tags": json.loads(tags),
                 "default_queue_type": queue_type, "metadata": json.loads(metadata)}
                for name, description, tags, queue_type, metadata in self._db.execute(
                    f"SELECT {', '.join(_COLUMNS)} FROM vhosts ORDER BY name")]

    def put_vhost(self, name: str, description: str = "", tags: list[str] | None = None,
                  default_queue_type: str = "classic") -> None:
        """Add or update a vhost; on disk when this returns."""
        with self._transaction():
            self._db.execute(
                f"INSERT OR REPLACE INTO vhosts ({', '.join(_COLUMNS)}) VALUES (?, ?, ?, ?, ?)",
                (name, description, json.dumps(list(tags or [])), default_queue_type,
                 json.dumps({"description": description, "tags": list(tags or [])})))

    def delete_vhost(self, name: str) -> bool:
        """Remove a vhost and everything stored in it; False when there is none of that name."""
        with self._transaction():
            for table in _tables_present(self._db):
                self._db.execute(f"DELETE FROM {table} WHERE vhost=?", (name,))
            return self._db.execute("DELETE FROM vhosts WHERE name=?", (name,)).rowcount > 0


def _tables_present(db: sqlite3.Connection) -> Iterator[str]:
    present = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    return (table for table in PER_VHOST if table in present)
