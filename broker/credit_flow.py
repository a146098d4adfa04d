"""Publish credit between the supervisor and the workers: RabbitMQ's credit flow on the rings.

A worker stops reading a connection that has sent ``workers``' PUBLISH_CREDIT publishes the
supervisor has not given back yet. The supervisor gives credit back once it has applied them,
unless it is *behind*: a consumer it woke has not been served yet (or, working through a backlog
with its whole prefetch out, is away for a moment as it was the last time) and that consumer's
queue holds at least FLOW_BACKLOG ready messages. Credit is then withheld from every publishing
connection, so the rings carry settles and pulls, not more publishes, until the consumers have
caught up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from broker.consumer_manager import NOTIFIED, QueueConsumer
from ipc import records as r

# The supervisor is behind while a consumer it woke holds back on a queue this long.
FLOW_BACKLOG = 1000
# A consumer working through a backlog with its whole prefetch out says it is not interested for
# moments at a time: one that came back within this long the last time still counts as waiting
# while it is away (up to this long). A slow consumer (away longer) does not.
FLOW_HOLD = 0.05
# Credit goes back to a connection once this much is due (half the workers' PUBLISH_CREDIT,
# so a publisher never waits for it), smaller amounts on the timer's tick: a steady
# publisher's worker is not woken by a Credit event per publish.
CREDIT_CHUNK = 200


class _QueueWithCount(Protocol):
    @property
    def message_count(self) -> int: ...


class Subscribed(Protocol):
    """What credit flow reads of a subscription: its consumer and its queue's length."""

    @property
    def consumer(self) -> QueueConsumer: ...
    @property
    def queue(self) -> _QueueWithCount: ...


class _Woken:
    """A woken consumer as credit flow follows it: since when it is away (not notified), and
    whether it came back within FLOW_HOLD the last time."""

    __slots__ = ("away", "quick")

    def __init__(self) -> None:
        self.away: float | None = None
        self.quick = False


class CreditFlow:
    """Publish credit due per ``(worker, conn)`` and the consumers woken (notified, or away a
    moment)."""

    __slots__ = ("behind", "due", "woken")

    def __init__(self) -> None:
        # Publish records applied per (worker, conn) whose credit is not given back yet.
        self.due: dict[tuple[int, int], int] = {}
        # (worker, consumer id) woken: candidates for "behind".
        self.woken: dict[tuple[int, int], _Woken] = {}
        self.behind = False

    def woke(self, key: tuple[int, int], now: float) -> None:
        """The consumer ``key`` was woken (notified, or its standing pull run) at ``now``."""
        seen = self.woken.get(key)
        if seen is None:
            self.woken[key] = _Woken()
        elif seen.away is not None:
            seen.quick = now - seen.away <= FLOW_HOLD
            seen.away = None

    def grants(self, subs: Mapping[tuple[int, int], Subscribed], *,
               all_credit: bool, now: float = 0.0) -> dict[int, r.Credit]:
        """The Credit events to send, per worker: every connection with CREDIT_CHUNK or more due
        (with ``all_credit``, everything due); none while the supervisor is behind."""
        self.behind = self._is_behind(subs, now)
        grants: dict[int, r.Credit] = {}
        if self.behind:
            return grants
        due = self.due
        for key, n in list(due.items()):
            if n < CREDIT_CHUNK and not all_credit:
                continue
            del due[key]
            worker, conn = key
            grant = grants.get(worker)
            if grant is None:
                grant = grants[worker] = r.Credit([], [])
            grant.conns.append(conn)
            grant.counts.append(n)
        return grants

    def _is_behind(self, subs: Mapping[tuple[int, int], Subscribed], now: float) -> bool:
        """True while a woken acquiring consumer waits for work -- it is notified, or it is away
        for a moment as it was the last time (``_Woken.quick``) -- and its queue holds
        FLOW_BACKLOG ready messages or more. O(consumers notified, or away within FLOW_HOLD)."""
        woken = self.woken
        behind = False
        for key, seen in list(woken.items()):  # each looked at: when it went away counts
            sub = subs.get(key)
            if sub is None:
                del woken[key]
                continue
            if sub.consumer.state is NOTIFIED:
                if seen.away is not None:  # back (a pull of its own found more)
                    seen.quick = now - seen.away <= FLOW_HOLD
                    seen.away = None
            else:
                if seen.away is None:
                    seen.away = now
                if now - seen.away > FLOW_HOLD:
                    del woken[key]
                    continue
                if not seen.quick:
                    continue
            if sub.queue.message_count >= FLOW_BACKLOG:
                behind = True
        return behind

    def forget_worker(self, worker: int) -> None:
        """A worker died: its connections' credit is moot."""
        for key in [k for k in self.due if k[0] == worker]:
            del self.due[key]
