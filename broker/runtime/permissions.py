"""Permissions at runtime: ``shoal ctl set_permissions`` and friends, applied by the supervisor.

Theory of operation
-------------------
The model is ``broker.runtime.users``: the supervisor keeps the tables
(``broker.permissions``: user -> vhost -> (configure, write, read), and the topic permissions
user -> vhost -> exchange -> (write, read)); a change comes over the control socket
(set_permissions, clear_permissions, set_topic_permissions, clear_topic_permissions) and is

1. written to the data directory's definitions (one transaction, on disk when it returns);
2. applied to the supervisor's tables in place (a worker started later is given them in its
   ``WorkerConfig``);
3. sent to every worker as ``PermissionsChanged`` carrying both tables whole (they are small):
   the worker swaps its tables and bumps their version, which empties every connection's cache
   of answers (``workers.access``) -- the next check on an open connection sees the change, and
   the next connection.open too.

A user deleted loses its permissions (``forget``), and so does a vhost deleted
(``forget_vhost``). A vhost that does not exist (the dispatcher's set) is ``no_such_vhost``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from broker.permissions import Table, TopicTable, valid
from broker.runtime.dispatch import Dispatcher
from broker.runtime.users import UserError
from broker.storage.definition_store import DefinitionStore
from ipc import records as r

log = logging.getLogger("shoal.permissions")


class RuntimePermissions:
    """The supervisor's permissions and the changes made to them while it runs (module text)."""

    def __init__(self, table: Table, topics: TopicTable, users: Mapping[str, str],
                 store: DefinitionStore | None, dispatcher: Dispatcher,
                 flush: Callable[[], None]) -> None:
        self.table = table
        self.topics = topics
        self._users = users  # name -> stored password: who exists
        self._store = store
        self._dispatcher = dispatcher
        self._flush = flush

    # -- listings (rabbitmqctl's and the management API's rows) ---------------------------

    def listing(self, user: str | None = None, vhost: str | None = None) -> list[dict[str, Any]]:
        """One row per (user, vhost): user, vhost, configure, write, read; in name order."""
        if user is not None:
            self._user_exists(user)
        if vhost is not None:
            self._vhost_exists(vhost)
        return [{"user": u, "vhost": v, "configure": p[0], "write": p[1], "read": p[2]}
                for u in sorted(self.table) if user is None or u == user
                for v, p in sorted(self.table[u].items()) if vhost is None or v == vhost]

    def topic_listing(self, user: str | None = None,
                      vhost: str | None = None) -> list[dict[str, Any]]:
        if user is not None:
            self._user_exists(user)
        if vhost is not None:
            self._vhost_exists(vhost)
        return [{"user": u, "vhost": v, "exchange": x, "write": p[0], "read": p[1]}
                for u in sorted(self.topics) if user is None or u == user
                for v, xs in sorted(self.topics[u].items()) if vhost is None or v == vhost
                for x, p in sorted(xs.items())]

    # -- changes --------------------------------------------------------------------------

    async def set(self, user: str, vhost: str, configure: str, write: str,
                  read: str) -> dict[str, Any]:
        self._user_exists(user)
        self._vhost_exists(vhost)
        perms = (str(configure), str(write), str(read))
        for regex in perms:
            if (why := valid(regex)) is not None:
                raise UserError("invalid", why)
        if self._store is not None:
            self._store.put_permissions(user, vhost, perms)
        self.table.setdefault(user, {})[vhost] = perms
        log.info("permissions of user '%s' on vhost '%s' set to %s", user, vhost, perms)
        self._tell()
        return {"user": user, "vhost": vhost, "configure": perms[0], "write": perms[1],
                "read": perms[2]}

    async def clear(self, user: str, vhost: str) -> dict[str, Any]:
        self._user_exists(user)
        self._vhost_exists(vhost)
        if self._store is not None:
            self._store.put_permissions(user, vhost, None)
        had = self.table.get(user, {}).pop(vhost, None) is not None
        if user in self.table and not self.table[user]:
            del self.table[user]
        log.info("permissions of user '%s' on vhost '%s' cleared", user, vhost)
        self._tell()
        return {"cleared": had, "user": user, "vhost": vhost}

    async def set_topic(self, user: str, vhost: str, exchange: str, write: str,
                        read: str) -> dict[str, Any]:
        self._user_exists(user)
        self._vhost_exists(vhost)
        perms = (str(write), str(read))
        for regex in perms:
            if (why := valid(regex)) is not None:
                raise UserError("invalid", why)
        if self._store is not None:
            self._store.put_topic_permissions(user, vhost, exchange, perms)
        self.topics.setdefault(user, {}).setdefault(vhost, {})[exchange] = perms
        log.info("topic permissions of user '%s' on exchange '%s' in vhost '%s' set to %s",
                 user, exchange, vhost, perms)
        self._tell()
        return {"user": user, "vhost": vhost, "exchange": exchange, "write": perms[0],
                "read": perms[1]}

    async def clear_topic(self, user: str, vhost: str, exchange: str | None) -> dict[str, Any]:
        """One exchange's topic permission, or (``exchange`` None) all of the vhost's."""
        self._user_exists(user)
        self._vhost_exists(vhost)
        if self._store is not None:
            self._store.put_topic_permissions(user, vhost, exchange, None)
        per_vhost = self.topics.get(user, {})
        if exchange is None:
            per_vhost.pop(vhost, None)
        else:
            per_vhost.get(vhost, {}).pop(exchange, None)
            if vhost in per_vhost and not per_vhost[vhost]:
                del per_vhost[vhost]
        if user in self.topics and not self.topics[user]:
            del self.topics[user]
        self._tell()
        return {"cleared": True, "user": user, "vhost": vhost, "exchange": exchange}

    def forget(self, user: str) -> None:
        """A deleted user's permissions go with it (the store deleted its rows)."""
        if self.table.pop(user, None) is not None or self.topics.pop(user, None) is not None:
            self._tell()

    def forget_vhost(self, vhost: str) -> None:
        """A deleted vhost's permissions, everyone's, go with it (the store deleted its rows)."""
        had = [perms.pop(vhost, None) is not None for perms in self.table.values()]
        had += [topics.pop(vhost, None) is not None for topics in self.topics.values()]
        if any(had):
            self._tell()

    # -- helpers --------------------------------------------------------------------------

    def _user_exists(self, user: str) -> None:
        if user not in self._users:
            raise UserError("missing", f'User "{user}" does not exist')

    def _vhost_exists(self, vhost: str) -> None:
        if vhost not in self._dispatcher.vhosts:
            raise UserError("missing", f'Virtual host "{vhost}" does not exist')

    def _tell(self) -> None:
        self._dispatcher.topic_permissions = self.topics  # changed: verdicts kept so far go
        for outbox in self._dispatcher.outbox:
            outbox.append(r.PermissionsChanged(_copy(self.table), _copy_topics(self.topics)))
        self._flush()


def _copy(table: Table) -> Table:
    return {u: dict(vs) for u, vs in table.items()}


def _copy_topics(topics: TopicTable) -> TopicTable:
    return {u: {v: dict(xs) for v, xs in vs.items()} for u, vs in topics.items()}
