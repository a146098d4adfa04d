"""A featured queue's delivery count: how often each entry came back, and ``x-delivery-limit``.

RabbitMQ's rules for quorum queues, 3.10 (``return_one``): every return of an acquired message
(reject or nack with requeue, a channel closing with it unacked) is counted first; a count above
``x-delivery-limit`` dead-letters the message (reason ``delivery_limit``) instead of requeueing
it. With a limit, deliveries carry the count as ``x-delivery-count``: redeliveries always, first
deliveries only to basic.get. Returns are counted with or without a limit (``delivery_count``);
an entry's count goes with the entry.

Called from: the supervisor process (``broker.queues.featured.featured_queue``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from broker.queues.queue_entry import QueueEntry


class DeliveryCounts:
    """Returns counted per entry id, under a queue's ``x-delivery-limit`` (None: no limit)."""

    __slots__ = ("limit", "returns")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.returns: dict[int, int] = {}

    def returned(self, entry: QueueEntry) -> bool:
        """Count a return of ``entry``; True when that takes it over the limit (the caller
        dead-letters it instead of requeueing)."""
        returns = self.returns[entry.id] = self.returns.get(entry.id, 0) + 1
        return self.limit is not None and returns > self.limit

    def count(self, entry: QueueEntry) -> int:
        """Returns counted so far (quorum queues' ``delivery_count``)."""
        return self.returns.get(entry.id, 0)

    def headers(self, entry: QueueEntry, headers: dict[str, Any] | None, *,
                basic_get: bool) -> dict[str, Any] | None:
        """``headers`` as delivered: with ``x-delivery-count`` under a limit, on redeliveries
        and always on basic.get."""
        if self.limit is None:
            return headers
        count = self.returns.get(entry.id, 0)
        if not count and not basic_get:
            return headers
        return {**(entry.message.headers or {}), "x-delivery-count": count}

    def forget(self, entry: QueueEntry) -> None:
        """``entry`` is gone (settled, dropped, dead-lettered)."""
        self.returns.pop(entry.id, None)

    def keep_only(self, ids: Iterable[int]) -> dict[int, int]:
        """Keep the counts of ``ids`` (purge: the acquired entries stay); returns the old map."""
        returns = self.returns
        self.returns = {i: returns[i] for i in ids if i in returns}
        return returns
