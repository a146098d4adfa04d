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
  damaged WAL can cost at most the batch a crash caught between its commit and checkpoint. In
  the broker the checkpoint runs on a thread (``broker.storage.wal_checkpoint``), and the next
  commit waits for it;
* the ``meta`` table holds the node id (the data directory's marker holds it too,
  ``broker.storage.data_dir``), the generation (one more per committed batch; ``DIR/definitions.gen``
  gets it after each commit, so a database that comes back behind is seen) and a digest: the
  XOR of a hash of every row, kept by triggers in the transaction that changes the row. A start
  checks the digest and ``PRAGMA integrity_check``: a damaged page is refused, never half-read;
* :func:`inspect` reads through a read-only connection, which never checkpoints or deletes
  the WAL: a refused start leaves every file as it found it.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from broker.errors import AMQPError
from broker.storage.data_dir import DataDir, new_node_id
from broker.storage.definition_integrity import (
    DefinitionStoreError,
    GenerationFile,
    Inspection,
    NewerDefinitions,
    check_version,
    inspect,
    wal_damage,
)
from broker.storage.definition_tables import (
    CORE_TABLES,
    DIGEST,
    MIX,
    PARAMETERS,
    PERMISSIONS,
    POLICIES,
    SCHEMA_VERSION,
    SIDE_TABLES,
    TOPIC_PERMISSIONS,
    USER_LIMITS,
    VHOST_LIMITS,
    VHOSTS,
    SideTable,
    core_digest,
    core_triggers,
    mix,
)
from broker.storage.vhost_rows import VhostRows
from broker.storage.wal_checkpoint import Checkpoints, StartThread, checkpoint
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

__all__ = ["SCHEMA_VERSION", "DefinitionStore", "DefinitionStoreError", "GenerationFile", "Inspection",
           "NewerDefinitions", "Opened", "inspect", "open_definitions", "restore", "wal_damage"]

log = logging.getLogger("shoal.definitions")


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
        self._off_loop: Checkpoints | None = None  # where they run: on a thread, or here
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.DatabaseError as exc:
            raise DefinitionStoreError(f"{self.path}: {exc}") from exc
        try:
            self._db.create_function(MIX, -1, mix, deterministic=True)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            # INSERT OR REPLACE deletes the row it replaces: its DELETE trigger must run too.
            self._db.execute("PRAGMA recursive_triggers=ON")
            if check_version(self._db, self.path) < SCHEMA_VERSION or not self._has_meta():
                with self._transaction(count=False):
                    self._install(node or new_node_id())
            for table in SIDE_TABLES:
                if not self._has_table(table.name):
                    with self._transaction(count=False):
                        table.install(self._db)
                        if table is PERMISSIONS:
                            self._grant_everyone()
                        elif table is VHOSTS:
                            self._default_vhost()
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

    def _grant_everyone(self) -> None:
        """Every user already here gets full permissions on the vhost (the permissions table
        was just added: RabbitMQ's default user has them, and an upgrade keeps everyone
        working); inside the caller's transaction."""
        self._db.executemany(
            "INSERT OR IGNORE INTO permissions (user, vhost, configure, write, read) "
            "VALUES (?, ?, '.*', '.*', '.*')",
            [(name, self.vhost) for (name,) in self._db.execute("SELECT name FROM users")])

    def _meta(self, key: str) -> Any:
        return self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()[0]

    def _install(self, node: str) -> None:
        """Shoal's tables (those already there are kept), meta, the digest of every row, and
        the triggers that keep it; inside the caller's transaction."""
        for statement in CORE_TABLES.split(";"):
            if statement.strip():
                self._db.execute(statement)
        self._db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('node', ?)", (node,))
        self._db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('generation', 0)")
        self._db.execute("DELETE FROM meta WHERE key=?", (DIGEST,))
        self._db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (DIGEST, core_digest(self._db)))
        for trigger in core_triggers():
            self._db.execute(trigger)
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def checkpoint_off_loop(self, start: StartThread) -> None:
        """From here each commit's checkpoint runs on a thread (``start``: how one is run),
        and the next commit waits for it (``broker.storage.wal_checkpoint``)."""
        self._off_loop = Checkpoints(self.path, start)

    def close(self) -> None:
        if self._off_loop is not None:
            self._off_loop.close()
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

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """A read whose failure (a damaged page, text that is not UTF-8, JSON that is not) is
        a DefinitionStoreError naming the file."""
        try:
            yield
        except (sqlite3.DatabaseError, UnicodeDecodeError, ValueError) as exc:
            raise DefinitionStoreError(f"{self.path}: {exc}") from exc

    def users(self) -> dict[str, str]:
        """Name -> stored password (``broker.passwords``) of every user, in name order."""
        with self._reading():
            return dict(self._db.execute("SELECT name, password_hash FROM users ORDER BY name"))

    def put_users(self, users: dict[str, str]) -> None:
        """Add these users, or give them these stored passwords; on disk when this returns."""
        with self._transaction():
            self._db.executemany("INSERT OR REPLACE INTO users (name, password_hash) VALUES (?, ?)",
                                 users.items())

    def delete_user(self, name: str) -> bool:
        """Remove a user (and its tags and permissions); False when there is none of that name."""
        with self._transaction():
            self._db.execute("DELETE FROM user_tags WHERE name=?", (name,))
            PERMISSIONS.delete(self._db, user=name)
            TOPIC_PERMISSIONS.delete(self._db, user=name)
            USER_LIMITS.delete(self._db, user=name)
            return self._db.execute("DELETE FROM users WHERE name=?", (name,)).rowcount > 0

    def user_tags(self) -> dict[str, list[str]]:
        """Name -> tags of the users that have a user_tags row (the others have DEFAULT_TAGS)."""
        with self._reading():
            return {name: [t for t in tags.split(",") if t] for name, tags in
                    self._db.execute("SELECT name, tags FROM user_tags ORDER BY name")}

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
        with self._reading():
            for user, vhost, c, w, rd in PERMISSIONS.rows(self._db):
                table.setdefault(user, {})[vhost] = (c, w, rd)
        return table

    def topic_permissions(self) -> dict[str, dict[str, dict[str, tuple[str, str]]]]:
        """user -> vhost -> exchange -> (write, read)."""
        table: dict[str, dict[str, dict[str, tuple[str, str]]]] = {}
        with self._reading():
            for user, vhost, x, w, rd in TOPIC_PERMISSIONS.rows(self._db):
                table.setdefault(user, {}).setdefault(vhost, {})[x] = (w, rd)
        return table

    def put_permissions(self, user: str, vhost: str, perms: tuple[str, str, str] | None) -> None:
        """Set (None: clear) a user's permissions on a vhost; on disk when this returns."""
        with self._transaction():
            if perms is None:
                PERMISSIONS.delete(self._db, user=user, vhost=vhost)
            else:
                PERMISSIONS.replace(self._db, (user, vhost, *perms))

    def put_topic_permissions(self, user: str, vhost: str, exchange: str | None,
                              perms: tuple[str, str] | None) -> None:
        """Set a user's topic permission on an exchange, or clear it (``perms`` None; ``exchange``
        None: all of the vhost's)."""
        with self._transaction():
            if perms is None and exchange is None:
                TOPIC_PERMISSIONS.delete(self._db, user=user, vhost=vhost)
            elif perms is None:
                TOPIC_PERMISSIONS.delete(self._db, user=user, vhost=vhost, exchange=exchange)
            else:
                TOPIC_PERMISSIONS.replace(self._db, (user, vhost, exchange, *perms))

    def policies(self) -> list[dict[str, Any]]:
        """Every stored policy: RabbitMQ's shape, ``operator`` true for operator policies."""
        with self._reading():
            return [{"vhost": v, "name": n, "operator": bool(op), "pattern": pat, "apply-to": ap,
                     "definition": json.loads(d), "priority": pr}
                    for v, n, op, pat, ap, d, pr in POLICIES.rows(self._db)]

    def put_policy(self, policy: dict[str, Any], operator: bool = False) -> None:
        """Add or replace a policy (RabbitMQ's shape); on disk when this returns."""
        with self._transaction():
            POLICIES.replace(self._db, (
                policy["vhost"], policy["name"], int(operator), policy["pattern"],
                policy["apply-to"], json.dumps(policy["definition"], sort_keys=True),
                policy["priority"]))

    def delete_policy(self, vhost: str, name: str, operator: bool = False) -> bool:
        """Remove a policy; False when there is none of that name."""
        with self._transaction():
            return POLICIES.delete(self._db, vhost=vhost, name=name, operator=int(operator)) > 0

    def parameters(self) -> list[dict[str, Any]]:
        """Every stored runtime parameter, RabbitMQ's shape: {value, vhost, component, name}."""
        with self._reading():
            return [{"value": json.loads(value), "vhost": v, "component": c, "name": n}
                    for v, c, n, value in PARAMETERS.rows(self._db)]

    def put_parameter(self, vhost: str, component: str, name: str, value: Any) -> None:
        """Add or replace a parameter; on disk when this returns."""
        with self._transaction():
            PARAMETERS.replace(self._db, (vhost, component, name, json.dumps(value, sort_keys=True)))

    def delete_parameter(self, vhost: str, component: str, name: str) -> bool:
        """Remove a parameter; False when there is none of that name."""
        with self._transaction():
            return PARAMETERS.delete(self._db, vhost=vhost, component=component, name=name) > 0

    def vhost_limits(self) -> dict[str, dict[str, int]]:
        """vhost -> {limit name: value} (broker.runtime.limits)."""
        return self._limits(VHOST_LIMITS)

    def user_limits(self) -> dict[str, dict[str, int]]:
        """user -> {limit name: value}."""
        return self._limits(USER_LIMITS)

    def put_vhost_limits(self, vhost: str, limits: dict[str, int]) -> None:
        """Make ``limits`` the vhost's limits, all of them (empty: none); on disk when this returns."""
        self._put_limits(VHOST_LIMITS, {"vhost": vhost}, limits)

    def put_user_limits(self, user: str, limits: dict[str, int]) -> None:
        """Make ``limits`` the user's limits, all of them (empty: none)."""
        self._put_limits(USER_LIMITS, {"user": user}, limits)

    def _limits(self, table: SideTable) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        with self._reading():
            for owner, name, value in table.rows(self._db):
                out.setdefault(owner, {})[name] = value
        return out

    def _put_limits(self, table: SideTable, owner: dict[str, str], limits: dict[str, int]) -> None:
        (value,) = owner.values()
        with self._transaction():
            table.delete(self._db, **owner)
            for name, limit in sorted(limits.items()):
                table.replace(self._db, (value, name, limit))

    @contextmanager
    def _transaction(self, count: bool = True) -> Iterator[None]:
        """One batch: committed with the next generation (unless not ``count``; on disk when
        this returns), the generation file updated, then checkpointed into the main file (the
        previous batch's checkpoint is over first: the WAL never holds two)."""
        db = self._db
        if self._off_loop is not None:
            self._off_loop.settle()
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
            if self._off_loop is not None:
                self._off_loop.begin()
            else:
                checkpoint(self._db, self.path)

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
