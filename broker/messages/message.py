"""A published message as the supervisor sees it: routing data and a handle, never the body.

docs/design.md ("The contract"): the supervisor never touches body bytes on the hot path. ``body_ref`` is an
opaque handle to the body in a worker's shared-memory arena; the domain only counts how many
queue entries hold it (``refs``) and calls the queue's ``on_drop`` when that reaches zero so the
runtime can free the block.

Dead-lettering (RabbitMQ ``rabbit_dead_letter:make_msg``) republishes a message with new headers
(``x-death``) and a new exchange and routing key. The domain cannot re-encode a content header,
so the copy is a :class:`broker.messages.deadletter.DeadLetter` that shares the body: it holds one
reference on its ``origin`` (the message that owns ``body_ref``) for as long as anything holds
the copy. ``on_drop`` is only ever called for an origin, exactly once per body. Every reference
drop therefore goes through :func:`drop_reference`.

Sender-selected distribution (RabbitMQ): a ``BCC`` header adds routing keys and is removed
before consumers see the message. A message keeps its BCC header in ``headers`` (its keys route
it, and its dead-letter copies, as RabbitMQ's ``routing_keys`` do); VirtualHost.publish makes
it a :class:`BlindCopied`, whose content header is re-encoded on every delivery, and the runtime
leaves BCC out of every re-encoded header (:func:`delivered_headers`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar


class Message:
    """One published message, shared by every queue entry it was routed to.

    What every message stores: routing data, the body handle and the reference count.

    Memory (S8: a queue may hold 1,000,000 messages). No per-instance ``__dict__``; a message
    published without headers, expiration or priority (and not traced) is a
    :class:`PlainMessage`, which stores these five slots and reads the other fields as the
    class-level defaults below. Everything else is a :class:`FullMessage`. Annotations say
    ``Message`` for either; only the runtime (``broker.runtime.dispatch``) and tests build them.
    """

    __slots__ = ("body_ref", "body_size", "exchange", "refs", "routing_key")

    # A plain message's values (FullMessage's slots shadow them).
    id: int = 0
    headers: dict[str, Any] | None = None
    expiration: str | None = None
    priority: int | None = None
    trace: tuple[int, int, int, int] | None = None  # (worker, pid, seq, ns) when tracing
    # A persistent message with --data-dir: (store id, worker, segment, offset, length, index
    # file), its identity in the index log and where it is on disk (broker.messages.message_journal).
    stored: tuple[int, int, int, int, int, int] | None = None

    # A dead-letter copy overrides both (broker.messages.deadletter.DeadLetter): the copy shares its
    # origin's body, and its content header must be re-encoded from ``headers`` on delivery.
    origin: Message | None = None
    reheadered: ClassVar[bool] = False

    body_ref: Any  # opaque to the domain: the runtime's arena handle
    body_size: int
    exchange: str
    refs: int  # queue entries (and runtime pins) referencing it; 0 after publish until routed
    routing_key: str

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self.id}, exchange={self.exchange!r}, "
            f"routing_key={self.routing_key!r}, refs={self.refs})"
        )


class PlainMessage(Message):
    """A published message with no headers, expiration or priority (the runtime's hot path)."""

    __slots__ = ()

    def __init__(self, exchange: str, routing_key: str, body_ref: object, body_size: int) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.body_ref = body_ref
        self.body_size = body_size
        self.refs = 0


class PageableMessage(PlainMessage):
    """A plain message published while its worker's arena was past half the paging mark: the
    pager holds it and may page its body out (``broker.storage.paging``), changing ``body_ref``. A
    queue keeps it as an object until then; a :class:`PlainMessage` (never paged) or a paged
    one that only its queue holds may be kept as its body handle alone (``broker.queues.fifo_entries``).
    The class is the flag: no slot is spent on it."""

    __slots__ = ()


class FullMessage(Message):
    """A message with headers, an expiration, a priority or a trace id (see :class:`Message`)."""

    __slots__ = ("expiration", "headers", "id", "priority", "stored", "trace")

    def __init__(
        self,
        id: int,  # the record field is called id
        exchange: str,
        routing_key: str,
        body_ref: object,
        body_size: int,
        headers: dict[str, Any] | None = None,
        *,
        expiration: str | None = None,
        priority: int | None = None,
    ) -> None:
        self.id = id
        self.exchange = exchange
        self.routing_key = routing_key
        self.body_ref = body_ref
        self.body_size = body_size
        self.headers = headers
        # basic.properties expiration (per-message TTL, milliseconds as a string) and priority,
        # exactly as published; None when the property is absent.
        self.expiration = expiration
        self.priority = priority
        self.refs = 0
        self.trace = None
        self.stored = None


BLIND_HEADER = "BCC"  # rabbit_basic ?DELETED_HEADER


class BlindCopied(FullMessage):
    """A published message with a ``BCC`` header: delivered re-encoded, without BCC.

    The same slots as :class:`FullMessage`, which every message with headers is
    (VirtualHost.publish switches ``__class__`` in place);
    only the class flag differs, so a plain message pays nothing.
    """

    __slots__ = ()
    reheadered: ClassVar[bool] = True


def delivered_headers(headers: dict[str, Any]) -> dict[str, Any]:
    """``headers`` as a consumer receives them: without ``BCC`` (RabbitMQ strip_bcc_header).

    Called by the runtime for every re-encoded content header; returns ``headers`` itself
    when there is no BCC.
    """
    if BLIND_HEADER not in headers:
        return headers
    return {key: value for key, value in headers.items() if key != BLIND_HEADER}


def drop_reference(message: Message, on_drop: Callable[[Message], None] | None) -> None:
    """Release one reference; the last one releases the origin, whose last calls ``on_drop``.

    The one way to let go of a message: queues settling entries, the runtime unpinning a
    browsed delivery. ``on_drop`` receives the message that owns ``body_ref``, never a copy.
    """
    while True:
        message.refs -= 1
        if message.refs:
            return
        origin = message.origin
        if origin is None:
            if on_drop is not None:
                on_drop(message)
            return
        message = origin
