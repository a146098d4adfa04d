"""The exchange and queue classes' requests: declare, delete, bind, unbind and purge as records.

exchange.declare / delete / bind / unbind and queue.bind / unbind / purge / delete carry none of
a channel's state but a queue name, which the channel resolves first ("" is the queue it last
declared, AMQP 0-9-1 §1.7.2.1). ``request`` turns the method into the supervisor's request
record, and ``ok`` the supervisor's ``Reply`` to it into the client's -ok. A reply comes unless
the record says nowait (queue.unbind has no nowait), as the supervisor's dispatcher decides.
queue.declare's record is ``declare_request``'s (a server-named queue is named here when
permissions are checked); its declare-ok is the channel's own: it names the queue and releases
what waited.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from pamqp import base
from pamqp import commands as spec

from ipc import records as r
from workers.access import Access

ExchangeMethod = spec.Exchange.Declare | spec.Exchange.Delete | spec.Exchange.Bind | spec.Exchange.Unbind
QueueMethod = spec.Queue.Bind | spec.Queue.Unbind | spec.Queue.Purge | spec.Queue.Delete
TopologyRequest = (r.ExchangeDeclare | r.ExchangeDelete | r.ExchangeBind | r.ExchangeUnbind
                   | r.QueueBind | r.QueueUnbind | r.QueuePurge | r.QueueDelete)

# The -ok of each reply, by the request's record tag (Reply.method).
_OK: dict[str, Callable[[r.Reply], base.Frame]] = {
    "xdecl": lambda _: spec.Exchange.DeclareOk(),
    "xdel": lambda _: spec.Exchange.DeleteOk(),
    "xbind": lambda _: spec.Exchange.BindOk(),
    "xunbind": lambda _: spec.Exchange.UnbindOk(),
    "qbind": lambda _: spec.Queue.BindOk(),
    "qunbind": lambda _: spec.Queue.UnbindOk(),
    "qpurge": lambda rep: spec.Queue.PurgeOk(rep.message_count),
    "qdel": lambda rep: spec.Queue.DeleteOk(rep.message_count),
}


def request(conn: int, ch: int, m: ExchangeMethod | QueueMethod, queue: str) -> TopologyRequest:
    """The request record of one of these methods on channel ``ch``; ``queue``: the queue a
    queue method names, resolved."""
    match m:
        case spec.Exchange.Declare():
            return r.ExchangeDeclare(conn, ch, m.exchange, m.exchange_type, m.passive, m.durable,
                                     m.auto_delete, m.internal, dict(m.arguments or {}), m.nowait)
        case spec.Exchange.Delete():
            return r.ExchangeDelete(conn, ch, m.exchange, m.if_unused, m.nowait)
        case spec.Exchange.Bind():
            return r.ExchangeBind(conn, ch, m.destination, m.source, m.routing_key,
                                  dict(m.arguments or {}), m.nowait)
        case spec.Exchange.Unbind():
            return r.ExchangeUnbind(conn, ch, m.destination, m.source, m.routing_key,
                                    dict(m.arguments or {}), m.nowait)
        case spec.Queue.Bind():
            # No queue and no key: the last declared queue, with its name as the key (queue.bind).
            key = m.routing_key if (m.queue or m.routing_key) else queue
            return r.QueueBind(conn, ch, queue, m.exchange, key, dict(m.arguments or {}),
                               m.nowait)
        case spec.Queue.Unbind():
            return r.QueueUnbind(conn, ch, queue, m.exchange, m.routing_key,
                                 dict(m.arguments or {}))
        case spec.Queue.Purge():
            return r.QueuePurge(conn, ch, queue, m.nowait)
        case spec.Queue.Delete():
            return r.QueueDelete(conn, ch, queue, m.if_unused, m.if_empty, m.nowait)
    raise TypeError(f"not an exchange or queue request: {m!r}")


def declare_request(conn: int, ch: int, m: spec.Queue.Declare, access: Access | None) -> r.QueueDeclare:
    """queue.declare's record on channel ``ch``, checked against ``access``; its queue is ""
    for a server-named queue the supervisor names (when nothing is checked)."""
    name = m.queue
    server_named = False
    if access is not None:
        if not name and not m.passive:
            # RabbitMQ names it before checking configure on that name (rabbit_guid's form)
            name = "amq.gen-" + secrets.token_urlsafe(16)
            server_named = True
        access.check_method(m, name)
    return r.QueueDeclare(conn, ch, name, m.passive, m.durable, m.exclusive, m.auto_delete,
                          dict(m.arguments or {}), m.nowait, server_named)


def ok(rep: r.Reply) -> base.Frame:
    """The -ok method the client gets for the supervisor's reply to one of these requests."""
    return _OK[rep.method](rep)
