"""Users at runtime: ``shoal ctl add_user`` and friends, applied by the supervisor.

Theory of operation
-------------------
The supervisor keeps who may log in as name -> stored password (``broker.passwords``: RabbitMQ's
``rabbit_password_hashing_sha256``, or a sha512 or md5 hash given as one) and name -> tags. A
change comes over the control socket (``broker.runtime.control``: add_user, put_user,
delete_user, change_password, set_user_tags) and is applied in this order:

1. written to the data directory's definitions (``DefinitionStore.put_user``/``delete_user``, one
   transaction, on disk when it returns; a change is rare, so on the supervisor's loop);
2. the supervisor's own tables change in place -- the very dicts a worker or management process
   started later is given through its pipe, so a replacement starts with the change;
3. every worker gets ``UsersChanged`` on its event ring and changes its table in place (each
   start-ok checks that table: a new login sees the change at once); a deleted user's open
   connections are closed with ``320 CONNECTION_FORCED - user 'U' is deleted``;
4. the management process gets the change as one JSON line on its stdin
   (``broker.runtime.management_child``, ``management.process``).

Without a data directory (tests) the change lasts until the broker stops. Tags are RabbitMQ's
free-form words (``administrator``, ``monitoring``, ``management``, ``policymaker``, ...); a user
without stored tags has ``broker.passwords.DEFAULT_TAGS``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from broker.passwords import DEFAULT_TAGS, HASHINGS, SHA256, algorithm_of, hash_password
from broker.runtime.dispatch import Dispatcher
from broker.storage.definition_store import DefinitionStore
from ipc import records as r

log = logging.getLogger("shoal.users")


class UserError(Exception):
    """A change refused: ``code`` is ``missing``, ``exists`` or ``invalid``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_tags(tags: Any) -> list[str]:
    """RabbitMQ's tags: a list, or one string of comma- (or space-) separated words."""
    if tags is None:
        return []
    words = tags if isinstance(tags, list) else str(tags).replace(",", " ").split()
    return [str(t).strip() for t in words if str(t).strip()]


def check_hash(password_hash: str, algorithm: str = SHA256) -> str:
    """``password_hash`` when it is a stored password of RabbitMQ's ``algorithm`` module."""
    if algorithm not in HASHINGS:
        raise UserError("invalid", f"hashing algorithm {algorithm} is not supported")
    if algorithm_of(password_hash) != algorithm:
        raise UserError("invalid", f"password_hash is not a {algorithm} hash (base64 of a 4-byte "
                                   f"salt and a {HASHINGS[algorithm].upper()})")
    return password_hash


class RuntimeUsers:
    """The supervisor's users and the changes made to them while it runs (module text)."""

    def __init__(self, table: dict[str, str], tags: dict[str, list[str]],
                 store: DefinitionStore | None, dispatcher: Dispatcher,
                 flush: Callable[[], None],
                 tell_management: Callable[[dict[str, Any]], Awaitable[None]] | None = None) -> None:
        self.table = table  # name -> stored password: the supervisor's own, changed in place
        self.tags = tags  # name -> tags, for those with stored tags; changed in place
        self._store = store
        self._dispatcher = dispatcher
        self._flush = flush
        self._tell_management = tell_management

    def impersonators(self) -> list[str]:
        """The users tagged impersonator (they may publish with another user_id)."""
        return sorted(n for n in self.table if "impersonator" in self.tags_of(n))

    def tags_of(self, name: str) -> list[str]:
        return list(self.tags.get(name, DEFAULT_TAGS))

    def listing(self) -> list[dict[str, Any]]:
        """Every user in name order: name, tags, password_hash, hashing_algorithm."""
        return [self._item(name) for name in sorted(self.table)]

    def _item(self, name: str) -> dict[str, Any]:
        stored = self.table[name]
        return {"name": name, "tags": self.tags_of(name), "password_hash": stored,
                "hashing_algorithm": algorithm_of(stored) or SHA256}

    async def add(self, name: str, password: str | None = None, password_hash: str | None = None,
                  tags: list[str] | None = None, algorithm: str = SHA256) -> dict[str, Any]:
        """rabbitmqctl add_user: a new user (refused when the name is taken), no tags unless given."""
        if name in self.table:
            raise UserError("exists", f'User "{name}" already exists')
        return await self.put(name, password, password_hash, tags if tags is not None else [],
                              algorithm)

    async def put(self, name: str, password: str | None = None, password_hash: str | None = None,
                  tags: list[str] | None = None, algorithm: str = SHA256) -> dict[str, Any]:
        """Create or change a user (PUT /api/users/NAME): a password, or a stored one of the
        ``algorithm`` module, or neither to keep the one it has; tags None keeps them (a new
        user: none)."""
        if not name:
            raise UserError("invalid", "a user needs a non-empty name")
        if password is not None:
            stored: str | None = hash_password(password)
        elif password_hash is not None:
            stored = check_hash(password_hash, algorithm) if password_hash else None
            if stored is None:  # RabbitMQ: an empty password_hash -- no password login
                raise UserError("invalid", "an empty password_hash is not supported by this Shoal yet")
        else:
            stored = None
        new = name not in self.table
        if new and stored is None:
            raise UserError("invalid", f'User "{name}" needs a password or a password_hash')
        if new and tags is None:
            tags = []
        if self._store is not None:
            self._store.put_user(name, stored, tags)
        if stored is not None:
            self.table[name] = stored
        if tags is not None:
            self.tags[name] = list(tags)
        log.info("user '%s' %s", name, "added" if new else "changed")
        await self._tell({name: self.table[name]} if stored is not None else {}, [],
                         {name: self.tags_of(name)})
        return {**self._item(name), "created": new}

    async def change_password(self, name: str, password: str) -> dict[str, Any]:
        self._exists(name)
        return await self.put(name, password=password)

    async def set_tags(self, name: str, tags: list[str]) -> dict[str, Any]:
        self._exists(name)
        return await self.put(name, tags=tags)

    async def delete(self, name: str) -> dict[str, Any]:
        """rabbitmqctl delete_user: gone from the store and every table; its connections are
        closed by their workers."""
        self._exists(name)
        if self._store is not None:
            self._store.delete_user(name)
        del self.table[name]
        self.tags.pop(name, None)
        log.info("user '%s' deleted", name)
        await self._tell({}, [name], {})
        return {"deleted": name}

    def _exists(self, name: str) -> None:
        if name not in self.table:
            raise UserError("missing", f'User "{name}" does not exist')

    async def _tell(self, users: dict[str, str], removed: list[str],
                    tags: dict[str, list[str]]) -> None:
        """Every worker (its event ring) and the management process learn the change."""
        if users or removed:
            for outbox in self._dispatcher.outbox:
                outbox.append(r.UsersChanged(dict(users), list(removed), self.impersonators()))
            self._flush()
        if self._tell_management is not None:
            await self._tell_management({"users": users, "removed": removed, "tags": tags})
