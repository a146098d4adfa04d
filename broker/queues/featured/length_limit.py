"""A featured queue's length limit: ``x-max-length`` / ``-bytes`` and what ``x-overflow`` does.

RabbitMQ's rules, 3.10: the limits count ready messages (held ones too, here): ``drop-head``
dead-letters from the head after an enqueue or requeue takes the queue over; ``reject-publish``
refuses the new message (``reject-publish-dlx`` also dead-letters it). The queue keeps its own
count and bytes (:attr:`FeaturedQueue.message_count`, ``message_bytes``) and asks the limit.

Called from: the supervisor process (``broker.queues.featured.featured_queue``).
"""

from __future__ import annotations

import heapq

from broker.messages.message import Message
from broker.queues.arguments import DROP_HEAD, QueueSettings
from broker.queues.featured.held_messages import HeldMessages
from broker.queues.featured.message_groups import HeapItem, Ungrouped
from broker.queues.queue_entry import QueueEntry


class LengthLimit:
    """``x-max-length`` and / or ``x-max-length-bytes`` with their ``x-overflow`` mode."""

    __slots__ = ("drops_head", "max_bytes", "max_length", "overflow")

    def __init__(self, max_length: int | None, max_bytes: int | None, overflow: str) -> None:
        self.max_length = max_length
        self.max_bytes = max_bytes
        self.overflow = overflow
        self.drops_head = overflow == DROP_HEAD  # else reject-publish(-dlx): refuse the new one

    def would_overflow(self, count: int, size: int, message: Message) -> bool:
        """Whether ``message`` would take a queue of ``count`` messages and ``size`` body bytes
        over the limit (rabbit_amqqueue_process will_overflow)."""
        return (self.max_length is not None and count + 1 > self.max_length) or (
            self.max_bytes is not None and size + message.body_size > self.max_bytes
        )

    def exceeded(self, count: int, size: int) -> bool:
        """Whether a queue of ``count`` messages and ``size`` body bytes is over the limit."""
        return (self.max_length is not None and count > self.max_length) or (
            self.max_bytes is not None and size > self.max_bytes
        )


def length_limit(settings: QueueSettings) -> LengthLimit | None:
    """The queue's length limit, or None when it has neither x-max-length nor -bytes."""
    if settings.max_length is None and settings.max_length_bytes is None:
        return None
    return LengthLimit(settings.max_length, settings.max_length_bytes, settings.overflow)


def pop_head(ready: list[HeapItem], groups: Ungrouped, held: HeldMessages) -> QueueEntry | None:
    """Take the next message in delivery order off its heap, for drop-head: the head of the
    ready heap or of a message group's parked heap, whichever comes first; else the first held
    message. None when there is none."""
    heap: list[HeapItem] | None = ready or None
    for parked in groups.parked_heaps():
        if parked and (heap is None or parked[0][0] < heap[0][0]):
            heap = parked
    if heap is None:
        return held.pop_first()
    entry = heapq.heappop(heap)[1]
    if heap is not ready and not heap:
        groups.emptied(heap, entry)
    return entry
