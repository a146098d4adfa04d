"""The rows a worker lists its client connections with (``ipc.records.ConnectionsListed``).

Plain array-like structs, not tagged records: they travel only inside ``ConnectionsListed``,
for ``shoal list-connections`` and the management API's /api/connections and /api/channels.
"""

from __future__ import annotations

from typing import Any

import msgspec


class ChannelInfo(msgspec.Struct, frozen=True, array_like=True):
    """One open channel of a listed connection, as its worker knows it (the management API's
    /api/channels: every open channel, not only those the supervisor keeps books for)."""

    number: int
    prefetch: int  # basic.qos global=false (RabbitMQ's prefetch_count)
    global_prefetch: int  # basic.qos global=true (global_prefetch_count)
    confirm: bool
    tx: bool
    consumers: int
    unacked: int


class ConnectionInfo(msgspec.Struct, frozen=True, array_like=True):
    """One client connection as ``shoal list-connections`` shows it (rabbitmqctl's columns)."""

    conn: int
    peer: str  # the client's host:port
    user: str
    vhost: str
    state: str  # running, flow, blocking, blocked, closing (RabbitMQ's names)
    channels: int
    client: str  # client_properties["product"], when the client says
    recv_oct: int
    send_oct: int
    connected_at: float  # wall clock, seconds since the epoch
    # connection.start-ok's client-properties, JSON-able (bytes decoded, nested tables kept)
    client_properties: dict[str, Any] = {}
    open_channels: list[ChannelInfo] = []
