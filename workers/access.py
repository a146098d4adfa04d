"""Permission checks in the worker: RabbitMQ 3.10's table of which method needs which permission
on which resource (``rabbit_channel``), with a per-connection cache of the answers.

The worker holds ``PermissionTables`` (``broker.permissions``' tables, from the WorkerConfig and
then ``PermissionsChanged``); each change bumps its version. Each open connection has an
``Access``: answers cached by (permission, kind, name), and for basic.publish by exchange alone
(one dict lookup on the hot path), both emptied when the version they were computed at is not
the tables' any more -- a permission removed counts from the next operation on an open
connection. A refusal is ``403 ACCESS_REFUSED - access to queue|exchange 'N' in vhost 'V'
refused for user 'U'`` with the refused method's ids, raised before its request leaves the
worker, so it changes nothing.
"""

from __future__ import annotations

from typing import Any, Final

from pamqp import commands as spec

from broker import errors
from broker.permissions import (
    CONFIGURE,
    READ,
    WRITE,
    Table,
    TopicTable,
    granted,
    refused,
    resource,
)


class PermissionTables:
    """The worker's permissions; ``table`` None: no checks at all (tests without a supervisor)."""

    __slots__ = ("table", "topics", "version")

    def __init__(self, table: Table | None, topics: TopicTable | None = None) -> None:
        self.table = table
        self.topics: TopicTable = topics or {}
        self.version = 0

    def replace(self, table: Table, topics: TopicTable) -> None:
        self.table = table
        self.topics = topics
        self.version += 1

    def may_enter(self, user: str, vhost: str) -> bool:
        """connection.open: whether the user has an entry for the vhost."""
        return self.table is None or vhost in self.table.get(user, {})


_QUEUE = "queue"
_EXCHANGE = "exchange"

# The methods a channel has checked before it asks the supervisor (queue.declare is checked
# by workers.topology.declare_request, once a server-named queue has its name).
CHECKED_METHODS: Final = frozenset((
    spec.Exchange.Declare, spec.Exchange.Delete, spec.Exchange.Bind, spec.Exchange.Unbind,
    spec.Queue.Bind, spec.Queue.Unbind, spec.Queue.Purge, spec.Queue.Delete, spec.Basic.Get,
    spec.Basic.Consume,
))


class Access:
    """One connection's permission checks (module text)."""

    __slots__ = ("_cache", "_publish", "_tables", "_version", "user", "vhost")

    def __init__(self, tables: PermissionTables, user: str, vhost: str) -> None:
        self._tables = tables
        self.user = user
        self.vhost = vhost
        self._version = tables.version
        self._cache: dict[tuple[int, str, str], bool] = {}
        self._publish: dict[str, bool] = {}

    def _fresh(self) -> None:
        if self._version != self._tables.version:
            self._version = self._tables.version
            self._cache.clear()
            self._publish.clear()

    def allowed(self, which: int, kind: str, name: str) -> bool:
        self._fresh()
        key = (which, kind, name)
        ok = self._cache.get(key)
        if ok is None:
            table = self._tables.table
            ok = table is None or granted(table, self.user, self.vhost, which, name)
            self._cache[key] = ok
        return ok

    def check(self, which: int, kind: str, name: str, ids: tuple[int, int]) -> None:
        if not self.allowed(which, kind, name):
            raise errors.AccessRefused(refused(kind, name, self.vhost, self.user), *ids)

    def may_publish(self, exchange: str) -> bool:
        """basic.publish: write on the exchange ("" is amq.default); cached per exchange."""
        if self._version != self._tables.version:
            self._fresh()
        ok = self._publish.get(exchange)
        if ok is None:
            ok = self.allowed(WRITE, _EXCHANGE, resource(exchange))
            self._publish[exchange] = ok
        return ok

    def publish_refused(self, exchange: str) -> errors.AMQPError:
        return errors.AccessRefused(refused(_EXCHANGE, resource(exchange), self.vhost, self.user),
                                    60, 40)

    def check_method(self, m: Any, queue: str) -> None:
        """The checks RabbitMQ makes before it carries out ``m``; ``queue``: the queue a queue or
        basic method names, resolved ("" left as is: the channel answers 404 then)."""
        t = type(m)
        if t is spec.Exchange.Declare:
            if m.passive:
                return
            ids = (40, 10)
            self.check(CONFIGURE, _EXCHANGE, m.exchange, ids)
            ae = (m.arguments or {}).get("alternate-exchange")
            if isinstance(ae, (str, bytes)) and ae:
                self.check(READ, _EXCHANGE, m.exchange, ids)
                self.check(WRITE, _EXCHANGE, ae.decode() if isinstance(ae, bytes) else ae, ids)
        elif t is spec.Exchange.Delete:
            self.check(CONFIGURE, _EXCHANGE, m.exchange, (40, 20))
        elif t is spec.Exchange.Bind or t is spec.Exchange.Unbind:
            ids = (40, 30) if t is spec.Exchange.Bind else (40, 40)
            self.check(WRITE, _EXCHANGE, m.destination, ids)
            self.check(READ, _EXCHANGE, m.source, ids)
        elif t is spec.Queue.Declare:
            if m.passive or not queue:
                return
            ids = (50, 10)
            self.check(CONFIGURE, _QUEUE, queue, ids)
            dlx = (m.arguments or {}).get("x-dead-letter-exchange")
            if isinstance(dlx, (str, bytes)):
                self.check(READ, _QUEUE, queue, ids)
                self.check(WRITE, _EXCHANGE, dlx.decode() if isinstance(dlx, bytes) else dlx,
                           ids)
        elif t is spec.Queue.Delete:
            if queue:
                self.check(CONFIGURE, _QUEUE, queue, (50, 40))
        elif t is spec.Queue.Purge:
            if queue:
                self.check(READ, _QUEUE, queue, (50, 30))
        elif t is spec.Queue.Bind or t is spec.Queue.Unbind:
            if queue:
                ids = (50, 20) if t is spec.Queue.Bind else (50, 50)
                self.check(WRITE, _QUEUE, queue, ids)
                self.check(READ, _EXCHANGE, m.exchange, ids)
        elif t is spec.Basic.Get:
            if queue:
                self.check(READ, _QUEUE, queue, (60, 70))
        elif t is spec.Basic.Consume:
            if queue and queue != "amq.rabbitmq.reply-to":
                self.check(READ, _QUEUE, queue, (60, 20))
