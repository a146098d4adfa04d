"""Zero-TTL messages of a featured queue: the round of pulls that may still take them.

A TTL of 0 (``x-message-ttl: 0``, or ``expiration: "0"`` -- which upgrades a plain queue to
featured storage, :func:`broker.queues.featured.queue_kinds.upgrade`) is RabbitMQ's
replacement for the ``immediate`` flag: the message "will expire upon reaching a queue unless it
can be delivered to a consumer immediately",
and is then dead-lettered with reason ``expired``. RabbitMQ decides that synchronously
(``deliver_or_enqueue``: ``attempt_delivery`` to a consumer with credit, else discard). Here
delivery is a notification followed by the consumer's pull, so the decision is split in two:

1. *At enqueue*: the message can be delivered at once when an acquiring consumer wants work --
   Interested or Notified in the QueueConsumerManager, i.e. it has credit (a consumer whose
   prefetch is full, whose channel is flowed off or whose socket is backed up has told the queue
   it is not interested) and, in a grouped queue, the message's group is free or its owner is
   such a consumer. Browsers do not count. If none can, the message expires on arrival: it is
   dead-lettered (reason ``expired``) or dropped without ever entering a heap, wherever it would
   have stood. If one can, the entry is *pending* (:attr:`ZeroTtlRound.pending`) and the usual
   notifyWork goes out.
2. *The round*: a pending entry is exempt from expiry only while the round of pulls that
   notification started lasts, i.e. while some acquiring consumer of the queue is Notified (Qpid's
   promise that it will pull, or say it is no longer interested, or go). The round is
   over when no consumer is Notified any more: after a pull that leaves its consumer Interested
   (the "empty" pull: it found nothing more for itself), a consumer losing interest or going
   away with nobody to hand the work to. Then every pending entry that was not taken is an
   ordinary expired entry: dead-lettered at once if it is at the head -- the usual case, and
   always so in an ``x-message-ttl: 0`` queue -- else, as RabbitMQ expires per-message TTLs,
   when it reaches the head; either way it is never delivered. A late pending entry is thus
   never lost (expired and dead-lettered) nor delivered twice (taking it ends its pending
   state). As a safety net a pending entry stops being exempt at the timer ``ZERO_TTL_GRACE``
   after its enqueue, should a round never end (a worker that neither pulls nor answers).

While pending, an entry goes only to a consumer that could have taken it when it arrived: never
to basic.get, and never to a consumer that became interested after it arrived (the round keeps,
for such consumers, the last position enqueued before their interest). Those step over pending
entries and take what lies behind them (such a consumer may be woken for pending entries it
then does not get: a spurious wake-up, as Qpid allows). A pending entry taken by a pull is
acquired once, like any other; its expiry is kept, so if it is requeued it expires at the head
at once (RabbitMQ keeps the original expiry on requeue). Nothing of this costs a queue without
zero-TTL messages more than an empty-dict check, nor the plain queue anything (untouched).

Called from: the supervisor process (``broker.queues.featured.featured_queue``).
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.queues.consumer_manager import INTERESTED, NOTIFIED, QueueConsumer, QueueConsumerManager
from broker.queues.featured.message_groups import Ungrouped
from broker.queues.queue_entry import QueueEntry

# A pending zero-TTL entry whose round of pulls never ends expires this long after its enqueue.
ZERO_TTL_GRACE = 1.0


def can_take_at_once(entry: QueueEntry, groups: Ungrouped, consumers: QueueConsumerManager) -> bool:
    """Whether an acquiring consumer wants work now and may take ``entry`` (step 1 above).

    Interested or Notified means it has credit: a consumer with a full prefetch, a flowed
    channel or a backed-up socket has said it is not interested. In a grouped queue the
    group must be free or owned by such a consumer.
    """
    owner = groups.owner_of(entry.message)
    if owner is not None:
        return isinstance(owner, QueueConsumer) and (
            owner.state is INTERESTED or owner.state is NOTIFIED
        )
    return consumers.top_active_priority() is not None


class ZeroTtlRound:
    """The pending zero-TTL entries of one queue, and the consumers that came too late for them.

    The queue tests ``pending`` (a dict, empty in the usual case) before calling anything else,
    so a queue without zero-TTL messages pays one empty-dict check.
    """

    __slots__ = ("_late", "pending")

    def __init__(self) -> None:
        self.pending: dict[int, QueueEntry] = {}  # id -> entry, in enqueue order
        # Consumers that became interested while entries were pending -> the last position
        # enqueued before that (they may not take those).
        self._late: dict[QueueConsumer, int] = {}

    def add(self, entry: QueueEntry) -> None:
        """``entry`` waits for this round of pulls (an acquiring consumer could take it)."""
        self.pending[entry.id] = entry

    def mark_late(self, consumer: QueueConsumer, last_position: int) -> None:
        """``consumer`` became interested now: it could not have taken what is pending."""
        self._late[consumer] = last_position

    def forget(self, consumer: QueueConsumer) -> None:
        """``consumer`` went."""
        if self._late:
            self._late.pop(consumer, None)

    def take(self, entry: QueueEntry, owner: object) -> bool:
        """Whether ``owner`` may take pending ``entry``; if so it is pending no more (its expiry
        stays, for a requeue). basic.get and late consumers may not."""
        if not isinstance(owner, QueueConsumer) or self._late.get(owner, 0) >= entry.position:
            return False
        pending = self.pending
        del pending[entry.id]
        if not pending:
            self._late.clear()
        return True

    def grace_end(self, expiry: Mapping[int, float]) -> float | None:
        """When the oldest pending entry stops being exempt (``ZERO_TTL_GRACE`` after its
        enqueue); None when nothing is pending."""
        pending = self.pending
        return expiry[next(iter(pending))] + ZERO_TTL_GRACE if pending else None

    def cut(self, expiry: dict[int, float], now: float) -> None:
        """Entries pending for ``ZERO_TTL_GRACE`` already stop being exempt (timer)."""
        pending = self.pending
        while pending:
            oldest = next(iter(pending))
            if expiry[oldest] + ZERO_TTL_GRACE > now:
                break
            del pending[oldest]
        if not pending:
            self._late.clear()

    def end(self) -> None:
        """The round is over: nothing is pending, nobody is late."""
        self.pending.clear()
        self._late.clear()

    def take_all(self) -> dict[int, QueueEntry]:
        """Hand the pending entries over (purge, delete); the round is over."""
        pending, self.pending = self.pending, {}
        self._late.clear()
        return pending
