"""The queue's view of its consumers: Qpid's QueueConsumerManager, single-threaded.

Theory of operation
-------------------
Qpid keeps five lists (docs/design.md, "QueueConsumerManager states") -- All, NonAcquiring,
NotInterested, Interested, Notified -- with one
Interested and one Notified list per consumer priority, and moves a consumer between them to
record what the queue knows about it. Qpid needs lock-free linked lists for that because
consumers and queues run on different threads. Here one supervisor process owns every queue,
so (docs/design.md, "QueueConsumerManager") each list is an insertion-ordered dict used as an ordered set:

* a consumer's state is a field on the consumer, so the list holding it is found in O(1);
* every state change goes through one guarded function, :meth:`QueueConsumerManager._move`,
  which refuses (returns False) when the consumer is not in one of the expected states --
  Qpid's ``QueueConsumerNode#moveFromTo``;
* ``del bucket[c]; bucket2[c] = None`` is O(1), and "delete then re-insert" into the same
  list is "move to the back" (Qpid: "moved to the back of the Interested list");
* the Interested lists are ``OrderedDict`` because taking the *front* of a plain dict after
  many front deletions walks over the deleted slots; ``OrderedDict`` keeps a linked list.

Acquiring consumers live in exactly one of NotInterested / Interested[p] / Notified[p];
non-acquiring ones (browsers) in exactly one of NotInterested / NonAcquiring (Qpid: they "can
only move between the NonAcquiring and NotInterested lists"). All holds every consumer.

The manager knows nothing about messages: :class:`broker.queues.queue.Queue` decides *whether* there
is work and asks the manager *whom* to notify.
"""

from __future__ import annotations

import bisect
import enum
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Any

from mypy_extensions import mypyc_attr


class ConsumerState(enum.Enum):
    """Where a consumer sits in the QueueConsumerManager (Qpid: Qpid's NodeState)."""

    REMOVED = "removed"  # not attached to any queue
    NOT_INTERESTED = "not_interested"
    INTERESTED = "interested"
    NOTIFIED = "notified"
    NON_ACQUIRING = "non_acquiring"  # an interested browser

    # Enum's own __hash__ is Python code (the name's hash); the states are tested against
    # frozensets on every move (a few per message): the identity hash is C, and agrees with
    # Enum's equality (identity).
    __hash__ = object.__hash__


REMOVED = ConsumerState.REMOVED
NOT_INTERESTED = ConsumerState.NOT_INTERESTED
INTERESTED = ConsumerState.INTERESTED
NOTIFIED = ConsumerState.NOTIFIED
NON_ACQUIRING = ConsumerState.NON_ACQUIRING

_ACTIVE = frozenset({INTERESTED, NOTIFIED})
_ATTACHED = frozenset({NOT_INTERESTED, INTERESTED, NOTIFIED, NON_ACQUIRING})
_ONLY_REMOVED = frozenset({REMOVED})
_ONLY_NOT_INTERESTED = frozenset({NOT_INTERESTED})
_ONLY_INTERESTED = frozenset({INTERESTED})
_ONLY_NON_ACQUIRING = frozenset({NON_ACQUIRING})

Bucket = OrderedDict  # an ordered set: keys are consumers, values None


class QueueConsumer:
    """The queue's proxy for one consumer (Qpid: QueueConsumer) -- keyed by the runtime.

    ``key`` is opaque to the domain; the runtime uses ``(worker, consumer id, slot)`` and sets
    that notify slot when the queue returns this consumer (Qpid: ``QueueConsumer#notifyWork``).
    """

    __slots__ = (
        "acquiring",
        "browse_position",
        "exclusive",
        "key",
        "no_ack",
        "priority",
        "state",
        "tag",
    )

    def __init__(
        self,
        key: Hashable,
        tag: str,
        priority: int = 0,
        acquiring: bool = True,
        exclusive: bool = False,
        no_ack: bool = False,
    ) -> None:
        self.key: Any = key
        self.tag = tag
        self.priority = priority
        self.acquiring = acquiring
        self.exclusive = exclusive
        self.no_ack = no_ack
        self.state = REMOVED
        # Qpid's Message Delivery: a browser's pointer into the queue -- the last position it has seen.
        # Acquiring consumers need none: without selectors they all share the queue head.
        self.browse_position = 0

    @property
    def interested(self) -> bool:
        """True in Interested, Notified or NonAcquiring (Qpid: ``isNotifyWorkDesired``)."""
        return self.state in _ACTIVE or self.state is NON_ACQUIRING

    def __repr__(self) -> str:
        return (
            f"QueueConsumer({self.key!r}, {self.tag!r}, priority={self.priority}, "
            f"acquiring={self.acquiring}, state={self.state.name})"
        )


@mypyc_attr(allow_interpreted_subclasses=True)
class QueueConsumerManager:
    """Keeps every consumer of one queue in the list matching its state (Qpid's QCM).

    Called from: the supervisor process, only through :class:`broker.queues.queue.Queue`.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._all: Bucket[QueueConsumer, None] = self._new_bucket()
        self._non_acquiring: Bucket[QueueConsumer, None] = self._new_bucket()
        self._not_interested: Bucket[QueueConsumer, None] = self._new_bucket()
        self._interested: dict[int, Bucket[QueueConsumer, None]] = {}
        self._notified: dict[int, Bucket[QueueConsumer, None]] = {}
        # Qpid: "a list per consumer priority"; highest first so iteration order is the
        # notification order. Counts let an unused priority be dropped.
        self._priorities: list[int] = []
        self._per_priority: dict[int, int] = {}

    def _new_bucket(self) -> Bucket[QueueConsumer, None]:
        """One of Qpid's lists; a method so a test can count how the lists are walked."""
        return OrderedDict()

    # ----------------------------------------------------------------- the one mover

    def _bucket(self, state: ConsumerState, priority: int) -> Bucket[QueueConsumer, None] | None:
        if state is INTERESTED:
            return self._interested[priority]
        if state is NOTIFIED:
            return self._notified[priority]
        if state is NOT_INTERESTED:
            return self._not_interested
        if state is NON_ACQUIRING:
            return self._non_acquiring
        return None  # REMOVED: in no list

    def _move(self, consumer: QueueConsumer, from_states: frozenset[ConsumerState],
              to: ConsumerState) -> bool:
        """Move ``consumer`` to the back of the list for ``to`` if it is in one of ``from_states``.

        Qpid's ``QueueConsumerNode#moveFromTo``: the only place a consumer changes list, O(1).
        """
        if consumer.state not in from_states:
            return False
        old = self._bucket(consumer.state, consumer.priority)
        if old is not None:
            del old[consumer]
        new = self._bucket(to, consumer.priority)
        if new is not None:
            new[consumer] = None
        consumer.state = to
        return True

    # ------------------------------------------------------------------ membership

    def add(self, consumer: QueueConsumer) -> None:
        """Attach a consumer, NotInterested until it says otherwise (Qpid: addConsumer).

        Called by Queue.add_consumer (basic.consume arriving at the supervisor).
        """
        if consumer.state is not REMOVED:
            raise ValueError(f"{consumer!r} is already attached to a queue")
        if consumer.acquiring:
            self._use_priority(consumer.priority)
        self._all[consumer] = None
        consumer.browse_position = 0
        self._move(consumer, _ONLY_REMOVED, NOT_INTERESTED)

    def remove(self, consumer: QueueConsumer) -> ConsumerState:
        """Detach a consumer from every list; returns the state it was in (REMOVED if none).

        Called by Queue.remove_consumer (basic.cancel, channel/connection close, worker death).
        """
        previous = consumer.state
        if previous is REMOVED or consumer not in self._all:
            return REMOVED
        self._move(consumer, _ATTACHED, REMOVED)
        del self._all[consumer]
        # Qpid's Message Delivery, "Removal": null the pointer so nothing keeps a position alive.
        consumer.browse_position = 0
        if consumer.acquiring:
            self._release_priority(consumer.priority)
        return previous

    def clear(self) -> list[QueueConsumer]:
        """Detach everyone (queue deleted); returns them in attach order. The lists go
        whole, not one consumer at a time (a queue may have tens of thousands)."""
        consumers = list(self._all)
        for consumer in consumers:
            consumer.state = REMOVED
            consumer.browse_position = 0
        self._reset()
        return consumers

    def _use_priority(self, priority: int) -> None:
        count = self._per_priority.get(priority, 0)
        if count == 0:
            self._interested[priority] = self._new_bucket()
            self._notified[priority] = self._new_bucket()
            # Descending order; priorities are few and new ones rare, so insort is fine.
            bisect.insort(self._priorities, priority, key=lambda p: -p)
        self._per_priority[priority] = count + 1

    def _release_priority(self, priority: int) -> None:
        count = self._per_priority[priority] - 1
        if count:
            self._per_priority[priority] = count
            return
        del self._per_priority[priority], self._interested[priority], self._notified[priority]
        self._priorities.remove(priority)

    # ------------------------------------------------------------------- interest

    def set_interest(self, consumer: QueueConsumer, interested: bool) -> bool:
        """Move between NotInterested and Interested/NonAcquiring; False if nothing changed.

        Qpid ``QueueConsumerManagerImpl#setInterest``; called by Queue.set_notify_work_desired.
        """
        if interested:
            target = INTERESTED if consumer.acquiring else NON_ACQUIRING
            return self._move(consumer, _ONLY_NOT_INTERESTED, target)
        source = _ACTIVE if consumer.acquiring else _ONLY_NON_ACQUIRING
        return self._move(consumer, source, NOT_INTERESTED)

    def mark_notified(self, consumer: QueueConsumer) -> bool:
        """Interested → Notified (Qpid: "moved to the Notified list" once told of work)."""
        if consumer.state is NOTIFIED:
            return True  # already there: keep its place rather than re-inserting
        return consumer.acquiring and self._move(consumer, _ONLY_INTERESTED, NOTIFIED)

    def back_of_interested(self, consumer: QueueConsumer) -> bool:
        """Interested/Notified → back of Interested (Qpid: "asymptotic fairness")."""
        return self._move(consumer, _ACTIVE, INTERESTED)

    # ----------------------------------------------------------- choosing whom to notify

    def top_active_priority(self) -> int | None:
        """Highest priority with an Interested or Notified acquiring consumer."""
        for priority in self._priorities:
            if self._interested[priority] or self._notified[priority]:
                return priority
        return None

    def higher_priority_active(self, consumer: QueueConsumer) -> bool:
        """True while an acquiring consumer of strictly higher priority wants work.

        Qpid ``AbstractQueue#noHigherPriorityWithCredit``: that consumer will take the message.
        """
        top = self.top_active_priority()
        return top is not None and top > consumer.priority

    def notify_one(self, *, unless_notified: bool = False) -> QueueConsumer | None:
        """Move the first Interested consumer at the top active priority to Notified.

        Qpid: the queue "will only notify a single interested Consumer to avoid spurious
        wake-ups", highest priority first. With ``unless_notified`` nobody is woken when a
        consumer at that priority is already Notified: it will pull the work anyway (used when
        work is handed over rather than newly arrived).
        """
        top = self.top_active_priority()
        if top is None:
            return None
        if unless_notified and self._notified[top]:
            return None
        interested = self._interested[top]
        if not interested:
            return None  # only Notified consumers at the top: they will pull it
        consumer = next(iter(interested))
        self._move(consumer, _ONLY_INTERESTED, NOTIFIED)
        return consumer

    # --------------------------------------------------------------- introspection

    def __len__(self) -> int:
        return len(self._all)

    def __contains__(self, consumer: object) -> bool:
        return consumer in self._all

    def all(self) -> list[QueueConsumer]:
        """Every attached consumer, in attach order (Qpid: the "All" list)."""
        return list(self._all)

    def non_acquiring(self) -> list[QueueConsumer]:
        """Interested browsers (Qpid: the "NonAcquiring" list); all are told of new messages."""
        return list(self._non_acquiring)

    def iter_non_acquiring(self) -> Iterator[QueueConsumer]:
        """Like :meth:`non_acquiring` without copying; do not move consumers while iterating."""
        return iter(self._non_acquiring)

    @property
    def has_non_acquiring(self) -> bool:
        """Whether any browser is interested (O(1), checked on every enqueue)."""
        return bool(self._non_acquiring)

    def not_interested(self) -> list[QueueConsumer]:
        """Consumers that asked not to be woken (Qpid: the "NotInterested" list)."""
        return list(self._not_interested)

    def interested(self) -> list[QueueConsumer]:
        """Interested acquiring consumers, highest priority first, front of each list first."""
        return [c for p in self._priorities for c in self._interested[p]]

    def notified(self) -> list[QueueConsumer]:
        """Notified acquiring consumers, highest priority first."""
        return [c for p in self._priorities for c in self._notified[p]]

    def priorities(self) -> list[int]:
        """Priorities that have a pair of Interested/Notified lists, highest first."""
        return list(self._priorities)

    def lists_holding(self, consumer: QueueConsumer) -> list[str]:
        """Names of the state lists holding ``consumer`` (All excluded) -- for checks and tests."""
        named: list[tuple[str, Bucket[QueueConsumer, None]]] = [
            ("NonAcquiring", self._non_acquiring),
            ("NotInterested", self._not_interested),
        ]
        named += [(f"Interested[{p}]", self._interested[p]) for p in self._priorities]
        named += [(f"Notified[{p}]", self._notified[p]) for p in self._priorities]
        return [name for name, bucket in named if consumer in bucket]
