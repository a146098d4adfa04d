"""Held messages of a featured queue: not available before their ``x-qpid-not-valid-before``.

Qpid Broker-J ``holdOnPublishEnabled``: a message whose header names a Unix time (ms) still
to come is held until then (Qpid: "held"); the queue's timer makes the due ones available and
notifies (Qpid: "a previously unavailable (held) message becomes available").

Called from: the supervisor process (``broker.queues.featured.featured_queue``).
"""

from __future__ import annotations

import heapq
from typing import Any

from broker.messages.message import Message
from broker.queues.arguments import NOT_VALID_BEFORE
from broker.queues.queue_entry import QueueEntry
from broker.queues.queue_host import QueueHost

HeldItem = tuple[float, int, QueueEntry]  # (due, position, entry): due first, FIFO among equals


def due_time(message: Message, now: float, epoch_offset: float) -> float | None:
    """When ``message`` becomes available (monotonic seconds), or None if it is not held."""
    headers = message.headers
    value = headers.get(NOT_VALID_BEFORE) if headers else None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    due = value / 1000.0 - epoch_offset  # Unix ms → monotonic seconds
    return due if due > now else None


class HeldMessages:
    """A heap of held entries, earliest due first."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[HeldItem] = []

    def __bool__(self) -> bool:
        return bool(self._heap)

    def hold(self, due: float, entry: QueueEntry) -> None:
        """Hold ``entry`` until ``due``."""
        heapq.heappush(self._heap, (due, entry.position, entry))

    def next_due(self) -> float | None:
        """The earliest due time, or None when nothing is held."""
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> QueueEntry | None:
        """Take the earliest entry if it is due by ``now``."""
        heap = self._heap
        if heap and heap[0][0] <= now:
            return heapq.heappop(heap)[2]
        return None

    def release_due(self, now: float, host: QueueHost[Any]) -> list[QueueEntry]:
        """Take the entries due by ``now``, earliest first, one unit of the step's
        ``expire_budget`` each, as many as it pays for (the rest wait for the next step)."""
        released: list[QueueEntry] = []
        while host.expire_budget > 0 and (entry := self.pop_due(now)) is not None:
            host.expire_budget -= 1
            released.append(entry)
        return released

    def pop_first(self) -> QueueEntry | None:
        """Take the earliest entry, due or not (x-max-length drop-head reached the holds)."""
        return heapq.heappop(self._heap)[2] if self._heap else None

    def entries(self) -> list[QueueEntry]:
        """The held entries, earliest due first."""
        return [entry for _, _, entry in sorted(self._heap)]

    def take(self) -> list[HeldItem]:
        """Hand the whole heap over (purge, delete: to the graveyard); nothing is held after."""
        heap, self._heap = self._heap, []
        return heap
