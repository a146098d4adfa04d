"""The virtual hosts in ``definitions.db``: which exist, what was said of them, deleting one.

A row per vhost in the side table ``vhosts`` (``broker.storage.definition_tables.VHOSTS``:
RabbitMQ's ``vhost`` record -- name, description, tags, default queue type, metadata). A data
directory without the table -- a new one, or one written before there were vhosts -- gets it
with "/" alone, so everything already stored (all of it "/"'s) stays where it was. Deleting a
vhost deletes its row and every row of every table that names it (its exchanges, queues,
bindings, permissions, topic permissions, policies, parameters), in one transaction: what
rabbit_vhost:delete takes away.

Called from: the supervisor process (``broker.storage.definition_store``'s store mixes it in).
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import AbstractContextManager
from typing import Any

from broker.storage.definition_tables import VHOSTS

DEFAULT_VHOST = "/"
DEFAULT_DESCRIPTION = "Default virtual host"  # RabbitMQ's, of the "/" a new node makes
# Every table whose rows belong to one vhost (its ``vhost`` column).
PER_VHOST = ("exchanges", "queues", "bindings", "permissions", "topic_permissions", "policies",
             "parameters", "vhost_limits")


class VhostRows:
    """The vhosts of a :class:`~broker.storage.definition_store.DefinitionStore`."""

    _db: sqlite3.Connection

    def _transaction(self, count: bool = True) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _default_vhost(self) -> None:
        """"/" in a table just made (inside the caller's transaction)."""
        VHOSTS.replace(self._db, _row(DEFAULT_VHOST, DEFAULT_DESCRIPTION, [], "undefined"))

    def vhosts(self) -> list[dict[str, Any]]:
        """Every stored vhost, by name: name, description, tags, default_queue_type, metadata."""
        return [{"name": name, "description": description, "tags": json.loads(tags),
                 "default_queue_type": queue_type, "metadata": json.loads(metadata)}
                for name, description, tags, queue_type, metadata in VHOSTS.rows(self._db)]

    def put_vhost(self, name: str, description: str = "", tags: list[str] | None = None,
                  default_queue_type: str = "undefined") -> None:
        """Add or update a vhost; on disk when this returns."""
        with self._transaction():
            VHOSTS.replace(self._db, _row(name, description, list(tags or []), default_queue_type))

    def delete_vhost(self, name: str) -> bool:
        """Remove a vhost and everything stored in it; False when there is none of that name."""
        present = {t for (t,) in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        with self._transaction():
            for table in PER_VHOST:
                if table in present:
                    self._db.execute(f"DELETE FROM {table} WHERE vhost=?", (name,))
            return VHOSTS.delete(self._db, name=name) > 0


def _row(name: str, description: str, tags: list[str], default_queue_type: str) -> tuple[Any, ...]:
    return (name, description, json.dumps(tags), default_queue_type,
            json.dumps({"description": description, "tags": tags}))
