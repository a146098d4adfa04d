"""A featured queue's message expiry: each entry's expiry time, and expiring at the head.

RabbitMQ's rules, 3.10: an expiry is ``min(x-message-ttl, expiration)`` from enqueue and is kept
when a message is requeued; expired messages are removed only at the head (so per-message TTLs
can queue up behind longer ones, and in a priority queue low priorities behind high ones),
checked on publish, on delivery and on the timer, and are never delivered.

Bounded steps (Overload): expiring a message spends the host's per-step ``expire_budget``, one
unit, or ``DEAD_LETTER_COST`` when it is dead-lettered (:mod:`broker.queues.queue_host`); with the
budget spent, the rest wait for the next step. The queue removes what expired
(:meth:`FeaturedQueue._drop_available`); pending zero-TTL entries are exempt while their round
of pulls lasts (:mod:`broker.queues.featured.zero_ttl`).

Called from: the supervisor process (``broker.queues.featured.featured_queue``).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

from broker.queues.arguments import QueueSettings, parse_expiration
from broker.queues.featured.message_groups import HeapItem
from broker.queues.queue_entry import QueueEntry
from broker.queues.queue_host import DEAD_LETTER_COST, QueueHost


class MessageExpiry:
    """Expiry times by entry id (monotonic seconds) under a queue's ``x-message-ttl``."""

    __slots__ = ("cost", "times", "ttl")

    def __init__(self, settings: QueueSettings) -> None:
        self.ttl: int | None = None  # x-message-ttl in ms, or None
        self.cost = 1  # budget units per expired message (host.expire_budget)
        self.configure(settings)
        self.times: dict[int, float] = {}

    def configure(self, settings: QueueSettings) -> None:
        """The queue's (new) x-message-ttl, for entries enqueued from now on (an expiry is
        computed at enqueue), and what expiring one costs: a dead-lettered one more."""
        self.ttl = settings.message_ttl
        self.cost = DEAD_LETTER_COST if settings.dead_letter_exchange is not None else 1

    def start(self, entry: QueueEntry, now: float) -> int | None:
        """Set a new entry's expiry time; returns its TTL in ms (None: it never expires)."""
        # rabbit_amqqueue_process calculate_msg_expiry: the smaller of the two TTLs.
        ttl = self.ttl
        expiration = entry.message.expiration
        if expiration is not None:
            own = parse_expiration(expiration)
            ttl = own if ttl is None else min(ttl, own)
        if ttl is not None:
            self.times[entry.id] = now + ttl / 1000.0
        return ttl

    def expired(self, entry: QueueEntry, now: float) -> bool:
        """Whether ``entry`` has an expiry time and ``now`` has reached it."""
        times = self.times
        expires = times.get(entry.id) if times else None
        return expires is not None and now >= expires

    def head_deadline(self, ready: list[HeapItem], pending: Mapping[int, QueueEntry]) -> float | None:
        """The ready heap's head's expiry time; None when it has none or is a ``pending``
        zero-TTL entry (exempt while its round of pulls lasts)."""
        times = self.times
        if not times or not ready:
            return None
        head = ready[0][1].id
        return None if pending and head in pending else times.get(head)

    def spend(self, host: QueueHost[Any]) -> bool:
        """Take one expired message's cost from the step's budget; False when it is spent."""
        if host.expire_budget <= 0:
            return False
        host.expire_budget -= self.cost
        return True

    def pop_expired_head(
        self, ready: list[HeapItem], pending: Mapping[int, QueueEntry], now: float, host: QueueHost[Any]
    ) -> QueueEntry | None:
        """Pop the ready heap's head if it has expired and the step's budget pays for it (the
        caller drops it); None when the head is not expiring, is a ``pending`` zero-TTL entry
        (exempt until its round of pulls is over), or the budget is spent."""
        times = self.times
        if not times or not ready:
            return None
        entry = ready[0][1]
        if pending and entry.id in pending:
            return None
        expires = times.get(entry.id)
        if expires is None or now < expires or not self.spend(host):
            return None
        heapq.heappop(ready)
        return entry
