"""Browsers' positions: where a browser goes next, and which browsers an entry concerns.

Qpid's Message Delivery (docs/design.md, "Browser position").

Browsers see the queue's contents -- available entries and acquired ones not yet settled -- in
position order, keep their own pointer (``QueueConsumer.browse_position``) and never rewind, so
an entry that becomes available concerns only the browsers whose pointer is still before it
(:func:`browsers_before`, for every kind of queue).

A plain :class:`broker.queues.queue.Queue` holds its entries in three places: the log from its head on
(consecutive positions), the heap of released entries and the acquired entries, both below the
log head; :meth:`broker.queues.fifo_entries.FifoEntries.next_after` finds a browser's next entry across
the three without merging them (:func:`first_acquired_after` for the acquired ones). A featured
queue keeps its own arrival order (broker.queues.featured.arrival_order).

Called from: the supervisor process (``broker.queues.queue``, ``broker.queues.fifo_entries``,
``broker.queues.featured.featured_queue``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeVar

from broker.queues.consumer_manager import QueueConsumer, QueueConsumerManager


class Browsable(Protocol):
    """What browsing reads of an entry (broker.queues.queue_entry.QueueEntry), and the id it draws."""

    id: int
    position: int


_Entry = TypeVar("_Entry", bound=Browsable)


def _position(entry: Browsable) -> int:
    return entry.position


def browsers_before(consumers: QueueConsumerManager, position: int) -> list[QueueConsumer]:
    """The interested browsers whose pointer is before ``position``: those to tell of an entry
    that became available there (released, or made available late)."""
    if not consumers.has_non_acquiring:
        return []
    return [b for b in consumers.iter_non_acquiring() if b.browse_position < position]


def first_acquired_after(acquired: Mapping[int, _Entry], position: int) -> _Entry | None:
    """The acquired entry with the lowest position past ``position``: O(acquired entries)."""
    after = [e for e in acquired.values() if e.position > position]
    return min(after, key=_position) if after else None
