"""One message on one queue (Qpid: QueueEntry), and what an entry knows of its queue.

Its own module so that :mod:`broker.queues.queue` and the featured storage make entries, and the
runtime reads them, without this module knowing the queue classes: an entry's ``queue`` is an
:class:`EntryQueue`, which :class:`broker.queues.queue.Queue` is.
"""

from __future__ import annotations

from typing import Any, Protocol

from broker.messages.message import Message
from broker.queues.consumer_manager import QueueConsumer
from broker.queues.entry_state import AVAILABLE
from broker.queues.message_counts import QueueCounts


class EntryQueue(Protocol):
    """What the runtime asks of an entry's queue (:class:`broker.queues.queue.Queue`)."""

    name: str
    counts: QueueCounts

    def delivery_headers(self, entry: QueueEntry, *, basic_get: bool = False) -> dict[str, Any] | None: ...

    def settle(self, entry: QueueEntry) -> list[QueueConsumer]: ...

    def release(self, entry: QueueEntry, now: float | None = None) -> list[QueueConsumer]: ...

    def discard(self, entry: QueueEntry) -> list[QueueConsumer]: ...


class QueueEntry:
    """One message on one queue (Qpid: QueueEntry).

    ``id`` is the runtime's handle for the entry, unique in the process
    (:func:`new_entry_id`). A plain queue makes the entry only when it is
    first handed out (acquired or browsed) or needs a state (released, restored redelivered):
    until then its log holds the message alone, or just its body handle
    (:mod:`broker.queues.fifo_entries`), and draws the id at that moment. Queues with arguments,
    whose bookkeeping is keyed by id, make the entry and draw its id at enqueue.
    """

    __slots__ = ("id", "message", "position", "queue", "redelivered", "state")

    def __init__(self, queue: EntryQueue, position: int, message: Message, entry_id: int = 0) -> None:
        self.id = entry_id
        self.position = position
        self.message = message
        self.redelivered = False
        self.state = AVAILABLE
        self.queue = queue

    def __repr__(self) -> str:
        return (
            f"QueueEntry(id={self.id}, position={self.position}, state={self.state.name}, "
            f"redelivered={self.redelivered})"
        )
