"""The queue for arguments: TTLs, length limits, priorities, held messages, groups, delivery limit.

Theory of operation
-------------------
A plain :class:`broker.queues.queue.Queue` serves every acquiring consumer from one FIFO head. The
arguments handled here break that, so this storage trades the plain log for heaps (``heapq``,
O(log n) per message) and is chosen at declare time only for queues that need it:

* ``_ready`` -- available entries as ``(key, entry)``, a min-heap. The key is the position, or
  for ``x-max-priority`` queues ``(max - priority) << 48 | position``: higher priority first,
  FIFO within a priority, and a released entry goes back to its original place in its priority.
* ``_held`` -- entries held until their ``x-qpid-not-valid-before`` time (Qpid Broker-J
  ``holdOnPublishEnabled``), a :class:`broker.queues.featured.held_messages.HeldMessages`. :meth:`tick` moves
  the due ones into ``_ready`` and notifies (Qpid: "a previously unavailable (held) message
  becomes available").
* ``_groups`` -- message groups (Qpid ``qpid.group_header_key``), a
  :class:`broker.queues.featured.message_groups.MessageGroups` (or ``UNGROUPED``): it parks the entries of a
  group someone else owns in that group's own heap and hands them back to ``_ready`` when the
  group is free again; the queue then notifies one consumer.
* ``_order`` -- every entry by position, for browsers (they see arrival order and never rewind,
  Qpid's Message Delivery): a :class:`broker.queues.featured.arrival_order.ArrivalOrder`.
* ``_expiry`` -- expiry times per entry id, a :class:`broker.queues.featured.message_expiry.MessageExpiry`
  (RabbitMQ's TTL rules are in that module).
* ``_deliveries`` -- how many times each entry was returned, under ``x-delivery-limit``, a
  :class:`broker.queues.featured.delivery_limit.DeliveryCounts` (quorum queues' rules are in that module).
* ``_limit`` -- ``x-max-length`` / ``-bytes`` and ``x-overflow``, a
  :class:`broker.queues.featured.length_limit.LengthLimit` (None without one).

A TTL of 0 (``x-message-ttl: 0``, or ``expiration: "0"``) is RabbitMQ's replacement for the
``immediate`` flag: delivered only to a consumer that can take it at once, else expired on
arrival. How that is decided across a notification and the pulls it causes -- the *round* --
is :mod:`broker.queues.featured.zero_ttl`'s; the queue holds a
:class:`broker.queues.featured.zero_ttl.ZeroTtlRound` (``_zero``) and asks it.

Bounded steps (Overload). Expiring and releasing held messages spend the host's per-step
``expire_budget`` (a dead-lettered message costs ``DEAD_LETTER_COST``): when it runs out, the
rest wait for the next step -- the queue's deadline stays due, so the runtime's timer comes back
at once, and in between other requests are served. A pull that meets an expired head with no
budget left answers what it has with ``more`` (its consumer pulls again next step); a basic.get
answers get-empty. Expired messages are still removed from the head in order, so dead letters
keep their order. ``purge`` and ``delete`` hand the heaps to the host's graveyard (see
:class:`broker.queues.graveyard.Graveyard`) and are O(acquired entries).

Called from: the supervisor process, as a :class:`broker.queues.queue.Queue`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any, ClassVar

from broker.errors import InternalError
from broker.messages.deadletter import DeadLetterReason
from broker.messages.message import Message
from broker.queues.arguments import REJECT_PUBLISH_DLX, QueueSettings
from broker.queues.browsing import browsers_before
from broker.queues.consumer_manager import INTERESTED, NOT_INTERESTED, QueueConsumer
from broker.queues.entry_state import ACQUIRED, AVAILABLE, DELETED, HELD, new_entry_id
from broker.queues.featured.arrival_order import ArrivalOrder
from broker.queues.featured.delivery_limit import DeliveryCounts
from broker.queues.featured.held_messages import HeldMessages, due_time
from broker.queues.featured.length_limit import length_limit, pop_head
from broker.queues.featured.message_expiry import MessageExpiry
from broker.queues.featured.message_groups import HeapItem, Owner, Ungrouped, message_groups
from broker.queues.featured.priorities import heap_key
from broker.queues.featured.zero_ttl import ZeroTtlRound, can_take_at_once
from broker.queues.queue import Queue
from broker.queues.queue_entry import QueueEntry


class FeaturedQueue(Queue):
    """A queue whose arguments need more than a FIFO (see the module docstring)."""

    plain: ClassVar[bool] = False

    def _setup(self, settings: QueueSettings) -> None:
        super()._setup(settings)
        self._init_storage(settings)

    def _init_storage(self, settings: QueueSettings) -> None:
        self._limit = length_limit(settings)
        self._max_priority = settings.max_priority
        self._hold = settings.hold_on_publish
        self._groups: Ungrouped = message_groups(settings)
        self._ready: list[HeapItem] = []
        self._held = HeldMessages()
        self._expiry = MessageExpiry(settings)
        self._deliveries = DeliveryCounts(settings.delivery_limit)
        self._order = ArrivalOrder()
        self._starved = False  # a pull or get met an expired head with no budget left
        # Zero-TTL entries awaiting the pulls their notification causes (module docstring),
        # id -> entry in enqueue order; and consumers that became interested while some were
        # pending -> the last position enqueued before that (they may not take those).
        self._zero = ZeroTtlRound()
        self._count = 0
        self._bytes = 0

    def change_settings(self, settings: QueueSettings) -> None:
        """Queue.change_settings, and the storage's share: the new length limit applies at once
        (drop-head dead-letters the excess from the head, RabbitMQ init_max_length), the new
        x-message-ttl to messages enqueued from now on (an expiry is computed at enqueue), the
        delivery limit to the next return."""
        self._limit = length_limit(settings)
        self._expiry.configure(settings)
        self._deliveries.limit = settings.delivery_limit
        super().change_settings(settings)
        limit = self._limit
        if limit is not None and limit.drops_head:
            while limit.exceeded(self._count, self._bytes) and self._drop_head():
                pass
        self._reschedule()

    # ------------------------------------------------------------------- properties

    @property
    def message_count(self) -> int:
        """Ready entries, held ones included (Qpid counts them in the queue depth)."""
        return self._count

    @property
    def message_bytes(self) -> int:
        """Body bytes of the entries message_count counts (x-max-length-bytes)."""
        return self._bytes

    # --------------------------------------------------------------------- entries

    def enqueue(self, message: Message) -> list[QueueConsumer]:
        """Append a message; returns the consumers to notify ([] if the queue refused it)."""
        return self.offer(message) or []

    def restore(self, message: Message, *, redelivered: bool, now: float) -> None:
        """Queue.restore, with the queue's rules applied as at first arrival, at ``now`` (the
        original enqueue time): its TTL counts from then, a length limit applies again."""
        self.offer(message, now)
        entries = self._order.entries
        if redelivered and entries and entries[-1].message is message:
            entries[-1].redelivered = True
            if self.store is not None:
                self.store.delivered(self.name, message)

    def offer(self, message: Message, now: float | None = None) -> list[QueueConsumer] | None:
        """Enqueue, enforcing the length limit, TTL and hold; None when reject-publish refuses.

        Called by VirtualHost.publish (basic.publish) and for dead-lettered copies.
        """
        if self.deleted:
            raise InternalError(f"enqueue on deleted {self.description}")
        limit = self._limit
        if (limit is not None and not limit.drops_head
                and limit.would_overflow(self._count, self._bytes, message)):
            if limit.overflow == REJECT_PUBLISH_DLX:
                self._dead_letter(message, DeadLetterReason.MAXLEN)
            return None
        now = self._time(now)
        entry = QueueEntry(self, self._next_position, message, new_entry_id())
        self._next_position += 1
        message.refs += 1
        if self.store is not None and (message.stored is not None or message.origin is not None):
            self.store.enqueued(self.name, message, now)
        self._count += 1
        self._bytes += message.body_size
        self._order.append(entry)
        ttl = self._expiry.start(entry, now)
        due = due_time(message, now, self._host.epoch_offset) if self._hold else None
        if due is not None:
            entry.state = HELD
            self._held.hold(due, entry)
        elif ttl == 0 and not can_take_at_once(entry, self._groups, self.consumers):
            # nobody can take it at once: expired on arrival
            self._drop_available(entry, DeadLetterReason.EXPIRED)
        else:
            self._insert(entry)
            if ttl == 0:
                self._zero.add(entry)  # kept for this round of pulls only
        return self._settle_in(entry, now)

    def pull(
        self, consumer: QueueConsumer, max_n: int, now: float | None = None
    ) -> tuple[list[QueueEntry], bool]:
        """Qpid ``deliverSingleMessage``, batched, skipping what this consumer may not take.

        Expired entries met on the way are dead-lettered, never delivered. In a grouped queue a
        higher-priority consumer does not hold lower ones back (it cannot take their groups).
        Pending zero-TTL entries this consumer may not take are stepped over; a pull that ends
        the round of pulls expires the pending entries nobody took (module docstring).
        """
        if max_n < 1:
            raise ValueError(f"max_n must be at least 1, not {max_n}")
        if consumer not in self.consumers or not consumer.interested:
            return [], False
        if not consumer.acquiring:
            return self._browse(consumer, max_n)
        if self._groups.priority_holds_back and self.consumers.higher_priority_active(consumer):
            self.consumers.back_of_interested(consumer)
            if self._zero.pending:
                self._end_round_if_over(self._time(now))
            return [], False
        now = self._time(now)
        entries: list[QueueEntry] = []
        skipped: list[QueueEntry] = []
        self._starved = False
        while len(entries) < max_n:
            entry = self._take_for(consumer, now, skipped)
            if entry is None:
                break
            entries.append(entry)
        if skipped:
            self._put_back(skipped)
        if entries:
            self._after_fetch(now)
        # Starved: expired messages are in the way and this step may expire no more. The
        # consumer stays Notified and pulls again (the next step drops more of them).
        more = (len(entries) == max_n or self._starved) and self._next_heap(consumer) is not None
        if more:
            self.consumers.mark_notified(consumer)
        else:
            self.consumers.back_of_interested(consumer)
        if self._zero.pending:
            self._end_round_if_over(now)
        return entries, more

    def _get(self, now: float | None) -> QueueEntry | None:
        """basic.get: the next entry no consumer's group blocks, or None (Qpid's one-message subscription).

        Never a pending zero-TTL entry: it is on its way to a consumer (module docstring).
        Get-empty, too, when more expired messages are in the way than this step may expire.
        """
        owner = self._groups.get_owner()
        skipped: list[QueueEntry] = []
        self._starved = False
        now = self._time(now)
        entry = self._take_for(owner, now, skipped)
        if skipped:
            self._put_back(skipped)
        if entry is not None:
            self._after_fetch(now)
        return entry

    def _after_fetch(self, now: float) -> None:
        """rabbit_amqqueue_process ``fetch``: the expired messages a fetch leaves at the head go
        at once (``drop_expired_msgs``), and the new head's expiry is timed. A head without an
        expiry (enqueued before a message-ttl policy) may hide expired ones behind it."""
        if self._expiry.times:
            self._expire_head(now)
            self._reschedule()

    def release(self, entry: QueueEntry, now: float | None = None) -> list[QueueConsumer]:
        """Requeue at the original position, counting the return; over the limit, dead-letter.

        quorum ``return_one``: the return is counted first and a count above
        ``x-delivery-limit`` dead-letters (reason ``delivery_limit``) instead of requeueing.
        """
        if entry.queue is not self or entry.state is not ACQUIRED:
            return []
        if self.deleted:
            return self._settle_orphan(entry)
        notify = self._unacquire(entry)
        entry.redelivered = True
        if self._deliveries.returned(entry):
            self._dead_letter(entry.message, DeadLetterReason.DELIVERY_LIMIT)
            self._delete(entry)
            return notify
        self._count += 1
        self._bytes += entry.message.body_size
        self._insert(entry)
        return notify + self._settle_in(entry, self._time(now))

    def settle(self, entry: QueueEntry) -> list[QueueConsumer]:
        """basic.ack: remove for good; returns whom to wake when that frees a message group."""
        if entry.queue is not self or entry.state is not ACQUIRED:
            return []
        if self.deleted:
            return self._settle_orphan(entry)
        notify = self._unacquire(entry)
        self._delete(entry)
        return notify

    def purge(self) -> int:
        """queue.purge: drop ready and held entries (RabbitMQ does not dead-letter them).

        Returns how many. O(acquired entries): the heaps go to the host's graveyard whole, and
        the index and per-entry dicts are rebuilt for the acquired entries, which stay.
        """
        count = self._count
        if self.store is not None:
            self.store.purged(self.name, [e.message for e in self._acquired.values()])
        self._bury_storage()
        acquired = self._acquired
        expiry, returns = self._expiry.times, self._deliveries.keep_only(acquired)
        self._expiry.times = {i: expiry[i] for i in acquired if i in expiry}
        order = self._order.entries
        self._order = ArrivalOrder(acquired.values())
        host = self._host
        for container in (order, expiry, returns):
            host.discard(container)
        self._count = self._bytes = 0
        return count

    def delete(self) -> list[QueueConsumer]:
        """queue.delete: drop everything, detach every consumer (see Queue.delete)."""
        if self.deleted:
            return []
        # Acquired entries stay in _acquired until settled or released (Queue.delete).
        if self.store is not None:
            self.store.deleted(self.name)
        self._bury_storage()
        host = self._host
        for container in (self._order.entries, self._expiry.times, self._deliveries.returns):
            host.discard(container)
        self._init_storage(self.settings)
        self.deleted = True
        self._exclusive_consumer = None
        return self.consumers.clear()

    def _bury_storage(self) -> None:
        """Hand the ready, held and parked entries to the host's graveyard: none are left."""
        host, on_drop = self._host, self._on_drop
        host.bury(self._ready, pick=1, on_drop=on_drop)
        host.bury(self._held.take(), pick=2, on_drop=on_drop)
        for parked in self._groups.take_parked():
            host.bury(parked, pick=1, on_drop=on_drop)
        self._ready = []
        pending = self._zero.take_all()
        if pending:  # pending zero-TTL entries were ready ones
            host.discard(pending)

    def available_entries(self) -> list[QueueEntry]:
        """Available (not held, not acquired) entries in position order (introspection)."""
        return [e for e in self._order.entries if e.state is AVAILABLE]

    def held_entries(self) -> list[QueueEntry]:
        """Entries held until their not-valid-before time, earliest due first."""
        return self._held.entries()

    def entries(self) -> Iterator[QueueEntry]:
        """Every entry still holding its message: available and held, then acquired."""
        yield from [e for e in self._order.entries if e.state is AVAILABLE or e.state is HELD]
        yield from list(self._acquired.values())

    def stored_in(self, file: int, limit: int) -> list[tuple[Message, bool]] | None:
        """Queue.stored_in, in arrival order (:meth:`ArrivalOrder.stored_in`)."""
        return self._order.stored_in(file, limit, self.settings.message_ttl is not None)

    def body_refs(self) -> Iterator[Any]:
        """The body handle of every message the queue holds (a dead-letter copy's: its
        origin's), an arena sweep's view of :meth:`entries`."""
        for entry in self.entries():
            yield (entry.message.origin or entry.message).body_ref

    # ----------------------------------------------------------------------- timers

    def _storage_deadline(self) -> float | None:
        """The head's expiry, the first held message's due time or the oldest pending zero-TTL
        entry's ``ZERO_TTL_GRACE``, whichever comes first (a pending head is not expiring)."""
        deadline = self._expiry.head_deadline(self._ready, self._zero.pending)
        for other in (self._zero.grace_end(self._expiry.times), self._held.next_due()):
            if other is not None and (deadline is None or other < deadline):
                deadline = other
        return deadline

    def tick(self, now: float) -> list[QueueConsumer]:
        """Make due held messages available, expire at the head; notify for what is left.

        Pending zero-TTL entries older than ``ZERO_TTL_GRACE`` stop being exempt first.
        """
        now = self._time(now)
        self._zero.cut(self._expiry.times, now)
        released = self._held.release_due(now, self._host)
        for entry in released:
            self._insert(entry)
        self._expire_head(now)  # a held message may have outlived its TTL meanwhile
        notify: list[QueueConsumer] = []
        for entry in released:
            if entry.state is AVAILABLE:
                notify += self._announce(entry)
        return notify

    # -------------------------------------------------------------- delivery content

    def delivery_count(self, entry: QueueEntry) -> int:
        """Returns counted so far (quorum queues' ``delivery_count``)."""
        return self._deliveries.count(entry)

    def delivery_headers(self, entry: QueueEntry, *, basic_get: bool = False) -> dict[str, Any] | None:
        """Adds ``x-delivery-count`` as quorum queues do: on redeliveries, and always on basic.get."""
        return self._deliveries.headers(entry, super().delivery_headers(entry), basic_get=basic_get)

    # -------------------------------------------------------------------- consumers

    def _detach(self, consumer: QueueConsumer) -> list[QueueConsumer]:
        """Detach; a standard message group goes with its consumer (Broker-J clearAssignments).

        May end the round of pulls for pending zero-TTL entries (module docstring).
        """
        notify = super()._detach(consumer)
        for parked in self._groups.consumer_gone(consumer):
            notify += self._unpark(parked)
        self._zero.forget(consumer)
        if self._zero.pending:
            self._end_round_if_over(self._time(None))
        return notify

    def _set_interest(self, consumer: QueueConsumer, desired: bool) -> list[QueueConsumer]:
        """Qpid's setNotifyWorkDesired, plus the zero-TTL round (module docstring).

        A consumer becoming interested while zero-TTL entries are pending could not have taken
        them when they arrived, so it is marked late for them; one losing interest may end the
        round (its work was handed to another consumer, or there was nobody to take it).
        """
        if desired and self._zero.pending and consumer.acquiring and consumer.state is NOT_INTERESTED:
            self._zero.mark_late(consumer, self._next_position - 1)
        notify = super()._set_interest(consumer, desired)
        if not desired and self._zero.pending:
            self._end_round_if_over(self._time(None))
        return notify

    # ---------------------------------------------------------------------- helpers

    def _notify_newly_interested(self, consumer: QueueConsumer) -> list[QueueConsumer]:
        if not consumer.acquiring:
            return [consumer] if self._next_after(consumer.browse_position) else []
        if self._groups.priority_holds_back and self.consumers.higher_priority_active(consumer):
            return []
        if self._next_heap(consumer) is None:
            return []
        self.consumers.mark_notified(consumer)
        return [consumer]

    def _hand_over(self) -> list[QueueConsumer]:
        if not self._ready and not any(self._groups.parked_heaps()):
            return []
        consumer = self.consumers.notify_one(unless_notified=True)
        return [consumer] if consumer is not None else []

    def _settle_in(self, entry: QueueEntry, now: float) -> list[QueueConsumer]:
        # rabbit_amqqueue_process deliver_or_enqueue / requeue_and_run: drop-head, then drop
        # expired messages at the head; announce the entry only if it survived.
        limit = self._limit
        if limit is not None and limit.drops_head:
            while limit.exceeded(self._count, self._bytes) and self._drop_head():
                pass
        self._expire_head(now)
        notify = self._announce(entry) if entry.state is AVAILABLE else []
        self._reschedule()
        return notify

    def _announce(self, entry: QueueEntry) -> list[QueueConsumer]:
        """Qpid's notifyWork for an entry that became available: browsers behind it, one acquirer."""
        notify = browsers_before(self.consumers, entry.position)
        owner = self._groups.owner_of(entry.message)
        if owner is None:
            consumer = self.consumers.notify_one()
        elif isinstance(owner, QueueConsumer) and owner.state is INTERESTED:
            self.consumers.mark_notified(owner)
            consumer = owner
        else:
            consumer = None  # its owner is Notified already, not interested, or a basic.get
        if consumer is not None:
            notify.append(consumer)
        return notify

    def _insert(self, entry: QueueEntry) -> None:
        """Make an entry available: into its owned group's parked heap, else into _ready."""
        entry.state = AVAILABLE
        item = (heap_key(entry, self._max_priority), entry)
        if not self._groups.park(entry, item):
            heapq.heappush(self._ready, item)

    def _next_heap(self, owner: Owner | None) -> list[HeapItem] | None:
        """The heap whose top is ``owner``'s next entry (message groups may park some)."""
        return self._groups.next_heap(self._ready, owner)

    def _take_for(self, owner: Owner | None, now: float, skipped: list[QueueEntry]) -> QueueEntry | None:
        """Acquire ``owner``'s next entry, dropping expired ones on the way.

        Pending zero-TTL entries ``owner`` may not take are popped into ``skipped``: the caller
        puts them back (:meth:`_put_back`) once it has taken what it wants, so that one pull
        steps over each of them once.
        """
        while True:
            heap = self._next_heap(owner)
            if heap is None:
                return None
            entry = heapq.heappop(heap)[1]
            if heap is not self._ready and not heap:
                self._groups.emptied(heap, entry)
            zero = self._zero
            if zero.pending and entry.id in zero.pending:
                if not zero.take(entry, owner):
                    skipped.append(entry)  # basic.get, or a consumer that came too late
                    continue
            elif self._expiry.expired(entry, now):
                if not self._expiry.spend(self._host):  # the next step drops it (module docstring)
                    self._insert(entry)
                    self._starved = True
                    return None
                self._drop_available(entry, DeadLetterReason.EXPIRED)  # never delivered
                continue
            self._acquire_entry(entry, owner)
            return entry

    def _put_back(self, skipped: list[QueueEntry]) -> None:
        """Return pending zero-TTL entries a take stepped over to their heaps, same keys."""
        for entry in skipped:
            self._insert(entry)

    def _end_round_if_over(self, now: float) -> None:
        """No acquiring consumer is Notified: the pulls the zero-TTL entries' notification
        caused are over, so the pending ones nobody took expire (dead-lettered, ``expired``)."""
        if self.consumers.notified():
            return  # a Notified consumer will still pull (or give the work up)
        self._zero.end()
        self._expire_head(now)
        self._reschedule()

    def _acquire_entry(self, entry: QueueEntry, owner: Owner | None) -> None:
        entry.state = ACQUIRED
        self._acquired[entry.id] = entry
        self._count -= 1
        self._bytes -= entry.message.body_size
        self._groups.acquired(entry, owner)

    def _unacquire(self, entry: QueueEntry) -> list[QueueConsumer]:
        """An acquired entry is settled or returned; a shared group with none left is freed."""
        del self._acquired[entry.id]
        parked = self._groups.unacquired(entry)
        return self._unpark(parked) if parked else []

    def _unpark(self, parked: list[HeapItem]) -> list[QueueConsumer]:
        """A freed group may go to anyone again: its entries go back to _ready, and one
        consumer is notified (Qpid's notifyWork)."""
        for item in parked:
            heapq.heappush(self._ready, item)
        consumer = self.consumers.notify_one()
        return [consumer] if consumer is not None else []

    def _drop_head(self) -> bool:
        """Dead-letter the next message in delivery order (reason ``maxlen``); False if none."""
        entry = pop_head(self._ready, self._groups, self._held)
        if entry is None:
            return False
        self._drop_available(entry, DeadLetterReason.MAXLEN)
        return True

    def _expire_head(self, now: float) -> None:
        """Drop the expired entries at the head of _ready, as many as the step's budget pays for."""
        expiry, ready, pending, host = self._expiry, self._ready, self._zero.pending, self._host
        while (entry := expiry.pop_expired_head(ready, pending, now, host)) is not None:
            self._drop_available(entry, DeadLetterReason.EXPIRED)

    def _drop_available(self, entry: QueueEntry, reason: DeadLetterReason) -> None:
        """Remove a ready or held entry already taken off its heap, dead-lettering it."""
        self._count -= 1
        self._bytes -= entry.message.body_size
        self._dead_letter(entry.message, reason)
        self._delete(entry)

    def _delete(self, entry: QueueEntry) -> None:
        entry.state = DELETED
        pending = self._zero.pending
        if pending:
            pending.pop(entry.id, None)
        self._expiry.times.pop(entry.id, None)
        self._deliveries.forget(entry)
        self._order.deleted()
        self._unref(entry.message)

    def _next_after(self, position: int) -> QueueEntry | None:
        return self._order.next_after(position)

    def _browse(self, consumer: QueueConsumer, max_n: int) -> tuple[list[QueueEntry], bool]:
        seen = self._order.browse(consumer.browse_position, max_n)
        if seen:
            consumer.browse_position = seen[-1].position
        return seen, len(seen) == max_n and self._next_after(consumer.browse_position) is not None
