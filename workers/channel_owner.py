"""What a channel (``workers.channel.Channel``) knows of the connection and the worker that
own it: its fixed configuration, and the narrow views (Protocols) it uses of its owners.

The channel holds these views, never the owners' classes: ``workers.connection_handler`` and
``workers.worker`` implement them, and nothing here imports either (no import cycle). The
views are generic over the channel class (``Ch``), so this module does not import it either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ipc import records as r
from ipc.logfile import BodyLog
from tracing import TraceWriter
from workers.confirm_gate import ConfirmGate
from workers.consumer_target import ConsumerTarget, CreditPool
from workers.outgoing import Outgoing

Ch = TypeVar("Ch", bound=CreditPool)


class _Arena(Protocol):
    def free(self, offset: int) -> None: ...


class _Region(Protocol):
    @property
    def arena(self) -> _Arena: ...


class WorkerServices(Protocol[Ch]):
    """What a channel uses of its worker (``workers.worker.Worker``): the request outbox,
    consumer targets and their slots, message bodies in the arena, the body log and the
    confirms waiting for it, and the trace."""

    confirm_waiters: set[ConfirmGate]

    @property
    def region(self) -> _Region: ...
    @property
    def trace(self) -> TraceWriter | None: ...
    @property
    def body_log(self) -> BodyLog | None: ...

    def send(self, rec: Any) -> None: ...
    def new_target(self, tag: str, channel: Ch, queue: str, *, no_ack: bool,
                   browse: bool, prefetch: int) -> ConsumerTarget[Ch] | None: ...
    def drop_target(self, target: ConsumerTarget[Ch]) -> None: ...
    def body(self, d: r.Delivery) -> tuple[memoryview, memoryview]: ...
    def own_body(self, offset: int, header_len: int,
                 body_len: int) -> tuple[memoryview, memoryview]: ...
    def after_body_sync(self, call: Callable[[], object]) -> None: ...
    def store_body(self, offset: int, header_len: int,
                   body_len: int) -> tuple[int, int, int] | None: ...


class ChannelOwner(Protocol[Ch]):
    """What a channel uses of the connection handler that owns it: the output, the
    connection's publish credit, the confirms to flush after the batch, back-pressure."""

    credit: int
    confirms_pending: set[Ch]

    @property
    def backpressured(self) -> bool: ...
    @property
    def worker(self) -> WorkerServices[Ch]: ...

    def send(self, event: Outgoing) -> None: ...


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    """What a channel knows of its connection, fixed once the connection is open."""

    conn_id: int
    cancel_notify: bool  # the client takes basic.cancel from the server (capabilities)
