"""What a channel (``workers.channel.Channel``) is made with, and what each call on it returns.

A channel holds no reference to its connection handler or its worker (model: h2's
``H2Stream``, which knows its id and settings and *returns* frames and events). It is made
with its connection's fixed configuration (:class:`ChannelConfig`) and the worker's
resources it draws on (:class:`ChannelResources`: arenas, consumer slots, the body log, the
trace), and each call returns a :class:`ChannelOutput`: the request records for the
supervisor and the events for the client, in order, plus what the owner must arrange
(publish credit spent, confirms to coalesce, a commit waiting for the body log's sync).
``workers.connection_handler`` carries it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ipc import records as r
from ipc.logfile import BodyLog
from tracing import TraceWriter
from workers.access import Access
from workers.confirm_gate import BodySyncGate
from workers.consumer_target import Backpressure, ConsumerTargets
from workers.outgoing import Outgoing


class Bodies(Protocol):
    """Message bodies in the arenas (``workers.arenas.Arenas``)."""

    def body(self, d: r.Delivery) -> tuple[memoryview, memoryview] | None: ...
    def own_body(self, offset: int, header_len: int,
                 body_len: int) -> tuple[memoryview, memoryview]: ...
    def free(self, offset: int) -> None: ...


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    """What a channel knows of its connection, fixed once the connection is open: its id,
    whether the client takes basic.cancel from the server, and its output's back-pressure
    (one object the handler keeps current, shared by the connection's channels)."""

    conn_id: int
    cancel_notify: bool  # the client takes basic.cancel from the server (capabilities)
    output: Backpressure
    access: Access | None = None  # the connection's permission checks (workers.access)


@dataclass(frozen=True, slots=True)
class ChannelResources:
    """What a worker lends every channel: the arenas, the consumer targets and their slots,
    with ``--data-dir`` the body log and the set of confirm gates waiting for its sync, and
    the trace (``shoal serve --trace``)."""

    bodies: Bodies
    targets: ConsumerTargets
    body_log: BodyLog | None = None
    confirm_waiters: set[BodySyncGate] | None = None
    trace: TraceWriter | None = None


class ChannelOutput:
    """What one call on a channel produced: ``requests`` for the supervisor and ``events`` for
    the client, each in order; ``publishes`` (Publish records among the requests: the
    connection's credit they spend); ``confirms_due`` (acks to coalesce at the end of the
    batch: ``Channel.flush_confirms``); ``wait_body_sync`` (call ``Channel.commit_synced``
    once the body log is synced up to now)."""

    __slots__ = ("confirms_due", "events", "publishes", "requests", "wait_body_sync")

    def __init__(self) -> None:
        self.requests: list[object] = []
        self.events: list[Outgoing] = []
        self.publishes = 0
        self.confirms_due = False
        self.wait_body_sync = False
