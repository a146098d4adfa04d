"""Publish credit between the supervisor and the workers: RabbitMQ's credit flow on the rings.

A worker stops reading a connection that has sent ``workers``' PUBLISH_CREDIT publishes the
supervisor has not given back yet. The supervisor gives credit back once it has applied them,
unless those publishes feed a queue the supervisor is *behind* on: a consumer there waits for
work it has credit for, and the queue holds at least FLOW_BACKLOG ready messages. Credit is
then withheld from the connections whose publishes since their last credit reached such a
queue, and from those only, so the rings and the host's cores carry that queue's settles and
pulls rather than more publishes for it until its consumers have caught up. A connection
publishing to other queues keeps its credit.

A consumer counts while it is Notified (its worker said it is interested, and the queue has
work for it). A consumer working through a backlog with its whole prefetch out says it is not
interested for moments at a time: one that came back within FLOW_HOLD the last time still
counts while it is away (up to FLOW_HOLD), as without it an unbounded publisher takes the
supervisor's and the host's time from its consumers; one away longer (a slow client) does not.
Nor does one its worker says its client limits (``r.Pull.limited``: its prefetch was full, and
less than half came back within the worker's PULL_DEFER), however often it acks: it waits on
its application, not on the supervisor. A slow consumer so holds back no publisher: RabbitMQ
lets its queue grow, and every publisher keeps its rate.

What a connection's publishes reached is kept as the (exchange, routing key) pairs they were
published with, and routed to queues only while the supervisor is behind on some queue.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Protocol

from broker.queues.consumer_manager import NOTIFIED, QueueConsumer
from ipc import records as r

# The supervisor is behind on a queue while a consumer it woke waits there on this many.
FLOW_BACKLOG = 1000
# A consumer working through a backlog with its whole prefetch out says it is not interested for
# moments at a time: one that came back within this long the last time still counts as waiting
# while it is away (up to this long). A slow consumer (away longer) does not.
FLOW_HOLD = 0.05
# Credit goes back to a connection once this much is due (half the workers' PUBLISH_CREDIT,
# so a publisher never waits for it), smaller amounts on the timer's tick: a steady
# publisher's worker is not woken by a Credit event per publish.
CREDIT_CHUNK = 200

# Where a connection's publishes went: (exchange, routing key), or ANYWHERE for a publish
# whose headers route it (CC / BCC, a headers exchange): counted as feeding every queue.
Destination = tuple[str, str] | None
ANYWHERE: Destination = None


class _Queue(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def message_count(self) -> int: ...


class Subscribed(Protocol):
    """What credit flow reads of a subscription: its consumer and its queue."""

    @property
    def consumer(self) -> QueueConsumer: ...
    @property
    def queue(self) -> _Queue: ...


class _Woken:
    """A woken consumer as credit flow follows it: since when it is away (not notified),
    whether it came back within FLOW_HOLD the last time, and whether its last pull said its
    client limits it (r.Pull.limited)."""

    __slots__ = ("away", "limited", "quick")

    def __init__(self) -> None:
        self.away: float | None = None
        self.quick = False
        self.limited = False


class CreditFlow:
    """Publish credit due per ``(worker, conn)``, where those publishes went, and the consumers
    woken and not served yet."""

    __slots__ = ("behind_on", "consumers", "due", "feeds", "withheld")

    def __init__(self) -> None:
        # Publish records applied per (worker, conn) whose credit is not given back yet.
        self.due: dict[tuple[int, int], int] = {}
        # Their destinations, per (worker, conn): cleared with the credit when it goes back.
        self.feeds: dict[tuple[int, int], dict[Destination, None]] = {}
        # (worker, consumer id) woken: candidates for "behind".
        self.consumers: dict[tuple[int, int], _Woken] = {}
        # Grants held back per (worker, conn), ever (the control socket's credit_flow).
        self.withheld: dict[tuple[int, int], int] = {}
        # The queues the supervisor was behind on at the last grant.
        self.behind_on: set[str] = set()

    def spent(self, key: tuple[int, int], n: int, destination: Destination) -> None:
        """``n`` publishes of connection ``key`` to ``destination`` were applied (or refused):
        their credit is due."""
        due = self.due
        due[key] = due.get(key, 0) + n
        feeds = self.feeds.get(key)
        if feeds is None:
            self.feeds[key] = {destination: None}
        elif destination not in feeds:
            feeds[destination] = None

    def woke(self, key: tuple[int, int], now: float) -> None:
        """The consumer ``key`` was woken (notified, or its standing pull run) at ``now``."""
        seen = self.consumers.get(key)
        if seen is None:
            self.consumers[key] = _Woken()
        elif seen.away is not None:
            seen.quick = now - seen.away <= FLOW_HOLD
            seen.away = None

    def pulled(self, key: tuple[int, int], limited: bool) -> None:
        """The consumer ``key`` pulled; ``limited``: its worker says its client limits it."""
        seen = self.consumers.get(key)
        if seen is not None:
            seen.limited = limited

    def grants(self, subs: Mapping[tuple[int, int], Subscribed],
               reaches: Callable[[Destination], Collection[str] | None], *,
               all_credit: bool, now: float = 0.0) -> dict[int, r.Credit]:
        """The Credit events to send, per worker: every connection with CREDIT_CHUNK or more due
        (with ``all_credit``, everything due), but none to a connection whose publishes reached
        a queue the supervisor is behind on. ``reaches``: the names of the queues a destination
        routes to (None: it may reach any)."""
        behind_on = self.behind_on = self._behind_on(subs, now) if self.consumers else set()
        grants: dict[int, r.Credit] = {}
        due, feeds = self.due, self.feeds
        for key, n in list(due.items()):
            if n < CREDIT_CHUNK and not all_credit:
                continue
            if behind_on and _feeds(feeds.get(key), behind_on, reaches):
                self.withheld[key] = self.withheld.get(key, 0) + 1
                continue
            del due[key]
            feeds.pop(key, None)
            worker, conn = key
            grant = grants.get(worker)
            if grant is None:
                grant = grants[worker] = r.Credit([], [])
            grant.conns.append(conn)
            grant.counts.append(n)
        return grants

    def _behind_on(self, subs: Mapping[tuple[int, int], Subscribed], now: float) -> set[str]:
        """The queues holding FLOW_BACKLOG ready messages or more on which a woken acquiring
        consumer waits for work: it is notified, or it is away for a moment as it was the last
        time (``_Woken.quick``), and its client does not limit it (``_Woken.limited``).
        O(consumers notified, or away within FLOW_HOLD)."""
        consumers = self.consumers
        queues: set[str] = set()
        for key, seen in list(consumers.items()):  # each looked at: when it went away counts
            sub = subs.get(key)
            if sub is None:
                del consumers[key]
                continue
            if sub.consumer.state is NOTIFIED:
                if seen.away is not None:  # back (a pull of its own found more)
                    seen.quick = now - seen.away <= FLOW_HOLD
                    seen.away = None
            else:
                if seen.away is None:
                    seen.away = now
                if now - seen.away > FLOW_HOLD:
                    del consumers[key]
                    continue
                if not seen.quick:
                    continue
            if seen.limited:
                continue
            queue = sub.queue
            if queue.message_count >= FLOW_BACKLOG:
                queues.add(queue.name)
        return queues

    def forget_worker(self, worker: int) -> None:
        """A worker died: its connections' credit is moot."""
        for key in [k for k in self.due if k[0] == worker]:
            del self.due[key]
            self.feeds.pop(key, None)
        for key in [k for k in self.consumers if k[0] == worker]:
            del self.consumers[key]


def _feeds(destinations: Mapping[Destination, None] | None, queues: set[str],
           reaches: Callable[[Destination], Collection[str] | None]) -> bool:
    """Whether publishes to ``destinations`` reach one of ``queues``."""
    if not destinations:
        return False
    for destination in destinations:
        names = reaches(destination)
        if names is None or not queues.isdisjoint(names):
            return True
    return False
