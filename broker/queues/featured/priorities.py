"""Priorities (``x-max-priority``): where an available entry sorts in the ready heap.

RabbitMQ's priority queues: a message's ``priority`` property, capped at the queue's
``x-max-priority``, decides; higher priority first, FIFO within a priority, and a released
entry goes back to its original place in its priority. One int key does all three.

Called from: the supervisor process, by :class:`broker.queues.featured.featured_queue.FeaturedQueue`.
"""

from __future__ import annotations

from broker.queues.queue_entry import QueueEntry

PRIORITY_SHIFT = 48  # positions stay below 2**48


def heap_key(entry: QueueEntry, max_priority: int | None) -> int:
    """The entry's key in the ready heap: its position; with ``x-max-priority``,
    ``(max - priority) << 48 | position``."""
    if max_priority is None:
        return entry.position
    priority = min(entry.message.priority or 0, max_priority)
    return ((max_priority - priority) << PRIORITY_SHIFT) | entry.position
