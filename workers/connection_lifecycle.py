"""A client connection's life on a worker outside its message paths: admitted (the worker's
checks at connection.open handed to the protocol), opened (the client's
capabilities, its channels' settings, the log lines, ``ConnOpen``), listed (its row for
``rabbitmqctl list_connections``), failed (an error turned into channel.close or
connection.close, and what the closed part held released) and finished (its channels closed,
``ConnClose``).

``workers.connection_handler.ConnectionHandler`` routes the events and carries out what its
channels return; these happen a handful of times in a connection's life, so they live here,
as functions of the handler (``Handler``: what they use of it, a protocol, so that this module
does not import the handler that imports it).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from broker.errors import AMQPError
from ipc import records as r
from workers import events as ev
from workers.access import Access, PermissionTables
from workers.channel import Channel
from workers.channel_config import ChannelConfig
from workers.connection import AMQPConnection
from workers.consumer_target import Backpressure

log = logging.getLogger("shoal.connection")


class Handler(Protocol):
    """What these functions use of ``workers.connection_handler.ConnectionHandler``."""

    worker: Any  # a HandlerWorker: its send, dirty set and handlers by connection id
    conn_id: int
    proto: AMQPConnection
    channels: dict[int, Channel]
    opened: bool
    finished: bool
    cancel_notify: bool
    blocked_capable: bool
    output: Backpressure
    _channel_config: ChannelConfig
    confirms_pending: set[Channel]
    permissions: PermissionTables | None
    _closed_numbers: dict[int, int]
    peer: str
    connected_at: float

    @property
    def label(self) -> str: ...
    @property
    def state(self) -> str: ...
    def _limits_changed(self) -> None: ...


def admission(worker: object, proto: AMQPConnection) -> PermissionTables | None:
    """The worker's checks at connection.open, handed to the protocol (its permissions, its
    live set of vhosts, its limits; a test's worker may have none of them: no checks). The
    permissions are returned: the handler's channels check with them too."""
    permissions: PermissionTables | None = getattr(worker, "permissions", None)
    if permissions is not None:
        proto.vhost_access = permissions.may_enter
    vhosts = getattr(worker, "vhosts", None)  # the worker's live set (VhostsChanged)
    if vhosts is not None:
        proto.vhost_exists = vhosts.__contains__
    proto.limits = getattr(worker, "limits", None)  # workers.limits; None: no checks
    return permissions


def opened(h: Handler, event: ev.ConnectionOpened) -> None:
    """connection.open-ok was sent: the client's capabilities, its channels' settings, the
    log lines, and ``ConnOpen`` for the supervisor."""
    caps = (event.client_properties or {}).get("capabilities") or {}
    h.cancel_notify = bool(caps.get("consumer_cancel_notify", False))
    access = (Access(h.permissions, event.user, event.vhost)
              if h.permissions is not None else None)
    h._channel_config = ChannelConfig(h.conn_id, h.cancel_notify, h.output, access)
    h.blocked_capable = bool(caps.get("connection.blocked", False))
    h.opened = True
    name = (event.client_properties or {}).get("connection_name")
    if name:
        log.info("connection %s has a client-provided name: %s", h.label, name)
    log.info("connection %s: user '%s' authenticated and granted access to vhost '%s'",
             h.label, event.user, event.vhost)
    if log.isEnabledFor(logging.DEBUG):
        props = event.client_properties or {}
        log.debug("connection %s: client %s %s (%s), capabilities %s; negotiated frame_max "
                  "%d, channel_max %d, heartbeat %d s", h.label, props.get("product", "?"),
                  props.get("version", "?"), props.get("platform", "?"),
                  sorted(name for name, on in caps.items() if on) if isinstance(caps, dict)
                  else [], event.frame_max, event.channel_max, event.heartbeat)
    h.worker.send(r.ConnOpen(h.conn_id, event.user, event.vhost))
    h._limits_changed()


def connection_info(h: Handler) -> r.ConnectionInfo:
    """The connection's row for ``rabbitmqctl list_connections``."""
    proto = h.proto
    client = proto.client_properties.get("product")
    chans = [r.ChannelInfo(n, ch.consuming.prefetch, ch.credit.global_prefetch,
                           ch.confirms.active, ch.tx, len(ch.consumers), len(ch.unacked))
             for n, ch in h.channels.items() if not ch.closing]
    return r.ConnectionInfo(
        h.conn_id, h.peer, proto.user, proto.vhost, h.state, len(h.channels),
        client if isinstance(client, str) else "", proto.bytes_received, proto.bytes_sent,
        h.connected_at, jsonable_table(proto.client_properties), chans,
    )


def fail(h: Handler, exc: AMQPError, ch: Channel | None = None) -> None:
    """Turn an error into channel.close or connection.close (in one place:
    the protocol object), and release what the closed part held."""
    h.proto.handle_error(exc, ch.number if ch is not None else 0)
    if not exc.hard and ch is not None and not ch.closing:
        # RabbitMQ logs a channel exception at error (a hard one shows in the close line).
        log.error("channel error on connection %s, vhost: '%s', user: '%s', channel %d: %s",
                  h.label, h.proto.vhost, h.proto.user, ch.number,
                  exc.frame_text)
    if exc.hard:
        close_all_channels(h)
    elif ch is not None:
        close_channel(h, ch)
    h.worker.dirty.add(h)


def close_channel(h: Handler, ch: Channel) -> None:
    ch.close()
    h.confirms_pending.discard(ch)
    h.worker.send(r.ChanClose(h.conn_id, ch.number))
    h._closed_numbers[ch.number] = h._closed_numbers.get(ch.number, 0) + 1


def close_all_channels(h: Handler) -> None:
    for ch in list(h.channels.values()):
        if not ch.closing:
            close_channel(h, ch)


def finish(h: Handler) -> None:
    """The connection is over (closed or the socket went): the supervisor
    requeues its unacked messages and deletes its exclusive queues."""
    if h.finished:
        return
    h.finished = True
    h.proto.release_bodies()
    close_all_channels(h)
    h.channels.clear()
    if h.opened:
        h.worker.send(r.ConnClose(h.conn_id))
    h.worker.handlers.pop(h.conn_id, None)
    h._limits_changed()


def jsonable(value: Any) -> Any:
    """A field-table value as JSON can carry it: bytes decoded as UTF-8 (with replacement),
    tables and arrays kept nested, anything else unusual (decimal, timestamp) as its text."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        return jsonable_table(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


def jsonable_table(table: dict[Any, Any]) -> dict[str, Any]:
    return {k if isinstance(k, str) else str(jsonable(k)): jsonable(v) for k, v in table.items()}
