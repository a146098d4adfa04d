"""Publish credit between the supervisor and the workers: RabbitMQ's credit flow on the rings.

A worker stops reading a connection that has sent ``workers``' PUBLISH_CREDIT publishes the
supervisor has not given back yet. The supervisor gives credit back once it has applied them,
unless it is *behind*: a consumer it woke has not been served yet and that consumer's queue holds
at least FLOW_BACKLOG ready messages. Credit is then withheld from every publishing connection,
so the rings carry settles and pulls, not more publishes, until the consumers have caught up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from broker.consumer_manager import NOTIFIED, QueueConsumer
from ipc import records as r

# The supervisor is behind while a consumer it woke holds back on a queue this long.
FLOW_BACKLOG = 1000
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


class CreditFlow:
    """Publish credit due per ``(worker, conn)`` and the consumers woken since they last pulled."""

    __slots__ = ("behind", "due", "woken")

    def __init__(self) -> None:
        # Publish records applied per (worker, conn) whose credit is not given back yet.
        self.due: dict[tuple[int, int], int] = {}
        # (worker, consumer id) woken since they last pulled: candidates for "behind".
        self.woken: set[tuple[int, int]] = set()
        self.behind = False

    def grants(self, subs: Mapping[tuple[int, int], Subscribed], *,
               all_credit: bool) -> dict[int, r.Credit]:
        """The Credit events to send, per worker: every connection with CREDIT_CHUNK or more due
        (with ``all_credit``, everything due); none while the supervisor is behind."""
        self.behind = self._is_behind(subs)
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

    def _is_behind(self, subs: Mapping[tuple[int, int], Subscribed]) -> bool:
        """True while a woken acquiring consumer has not pulled yet and its queue holds
        FLOW_BACKLOG ready messages or more. O(consumers woken since they last pulled)."""
        woken = self.woken
        for key in list(woken):
            sub = subs.get(key)
            if sub is None or sub.consumer.state is not NOTIFIED:
                woken.discard(key)
            elif sub.queue.message_count >= FLOW_BACKLOG:
                return True
        return False

    def forget_worker(self, worker: int) -> None:
        """A worker died: its connections' credit is moot."""
        for key in [k for k in self.due if k[0] == worker]:
            del self.due[key]
