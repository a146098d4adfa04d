"""A queue: its entries, its consumers, and Qpid's three interfaces between them.

Theory of operation
-------------------
Qpid's Consumer-Queue Interactions (docs/design.md, "The seeds"; the quotes below are its
rules) names three calls between consumers and a queue; each is a method here, called by the
supervisor when a worker's request arrives, and each returns the consumers to wake:

* ``AbstractQueue#setNotifyWorkDesired``  → :meth:`Queue.set_notify_work_desired`
* ``QueueConsumer#notifyWork``            → the ``list[QueueConsumer]`` most methods return;
  the runtime sets each one's notify slot and kicks its worker
* ``AbstractQueue#deliverSingleMessage``  → :meth:`Queue.pull` (a batch of them)

Storage. The available entries are a :class:`broker.queues.fifo_entries.FifoEntries` (``_fifo``): one
head for every acquiring consumer, released entries before it (Qpid's Message Delivery), browsers' pointers
past it; a waiting entry is its message, or only its body handle, until it is handed out.
Acquired entries are indexed by id (``_acquired``) so that :meth:`delete` can drop
them. Every per-message operation is O(1) (O(log r) for r released entries); ``purge`` and
``delete`` are O(1) too: the queue is empty at once, its entries go to the host's graveyard.

This is the plain queue, the hot path: no TTL, limits, priorities, groups or held messages.
Queue arguments that need those pick :class:`broker.queues.featured.featured_queue.FeaturedQueue` at declare
time (:mod:`broker.queues.featured.queue_kinds`), so nothing here tests for them per message.

Time and the virtual host: a queue reads no clock; it asks its host
(:class:`broker.queues.queue_host.QueueHost`). Browsers' next entries: :mod:`broker.queues.browsing`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, ClassVar

from broker.errors import AccessRefused, InternalError, NotFound
from broker.messages.deadletter import DeadLetterReason
from broker.messages.message import Message, drop_reference
from broker.messages.message_journal import MessageJournal
from broker.queues.arguments import PLAIN, QueueSettings
from broker.queues.browsing import browsers_before
from broker.queues.consumer_manager import (
    INTERESTED,
    NOTIFIED,
    REMOVED,
    QueueConsumer,
    QueueConsumerManager,
)
from broker.queues.consumer_modes import ExpiresWhenUnused, SingleActiveConsumer
from broker.queues.entry_state import ACQUIRED, AVAILABLE, DELETED, new_entry_id
from broker.queues.fifo_entries import FifoEntries
from broker.queues.message_counts import QueueCounts
from broker.queues.queue_host import QueueHost, StandaloneHost


class QueueEntry:
    """One message on one queue (Qpid: QueueEntry).

    ``id`` is the runtime's handle for the entry, unique in the process
    (:func:`new_entry_id`). A plain queue makes the entry only when it is
    first handed out (acquired or browsed) or needs a state (released, restored redelivered):
    until then its log holds the message alone, or just its body handle
    (:mod:`broker.queues.fifo_entries`), and draws the id at that moment. Queues with arguments,
    whose bookkeeping is keyed by id, make the entry and draw its id at enqueue.
    """

    __slots__ = ("id", "message", "position", "queue", "redelivered", "state")

    def __init__(self, queue: Queue, position: int, message: Message, entry_id: int = 0) -> None:
        self.id = entry_id
        self.position = position
        self.message = message
        self.redelivered = False
        self.state = AVAILABLE
        self.queue = queue

    def __repr__(self) -> str:
        return (
            f"QueueEntry(id={self.id}, position={self.position}, state={self.state.name}, "
            f"redelivered={self.redelivered})"
        )


class Queue:
    """A queue of one virtual host (Qpid: AbstractQueue) with its QueueConsumerManager."""

    # Class-level facts the virtual host reads on publish, so a plain queue costs no branch.
    plain: ClassVar[bool] = True
    # A durable queue of a broker with --data-dir: its persistent messages' index records go
    # here (the virtual host sets it at declare); None: nothing is recorded.
    store: MessageJournal | None = None

    def __init__(
        self,
        name: str,
        *,
        durable: bool = False,
        exclusive_owner: Hashable | None = None,
        auto_delete: bool = False,
        arguments: Mapping[str, Any] | None = None,
        on_drop: Callable[[Message], None] | None = None,
        vhost: str = "/",
        settings: QueueSettings = PLAIN,
        host: QueueHost[Queue] | None = None,
    ) -> None:
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments: dict[str, Any] = dict(arguments or {})
        self.vhost = vhost
        self.consumers = QueueConsumerManager()
        self.has_ever_had_consumers = False
        self.deleted = False
        # Its virtual host's count of queues declared, when it was (broker.topology.vhost.Routing: a
        # publish split over steps skips a queue declared after it under a chosen name).
        self.declared = 0
        self._on_drop = on_drop
        self._host: QueueHost[Queue] = host if host is not None else StandaloneHost()
        self._fifo: FifoEntries[QueueEntry] = FifoEntries(self, QueueEntry, self._host.body_codec)
        self._acquired: dict[int, QueueEntry] = {}
        self._next_position = 1  # also what ever entered it: its message_stats.publish
        self.counts = QueueCounts()  # deliveries, gets, acks (broker.queues.message_counts)
        self._exclusive_consumer: QueueConsumer | None = None
        self.settings = settings
        # Consumer modes (broker.queues.consumer_modes), held whatever the storage: None when off.
        self.single_active: SingleActiveConsumer | None = (
            SingleActiveConsumer() if settings.single_active_consumer else None
        )
        self.lease: ExpiresWhenUnused | None = (
            ExpiresWhenUnused(settings.expires, self._host.now) if settings.expires is not None else None
        )
        self._setup(settings)
        if self.lease is not None:
            self._reschedule()

    def _setup(self, settings: QueueSettings) -> None:
        """Per-storage initialisation; featured storage extends it (broker.queues.featured.featured_queue)."""

    def __repr__(self) -> str:
        return (
            f"Queue({self.name!r}, messages={self.message_count}, "
            f"acquired={self.acquired_count}, consumers={self.consumer_count})"
        )

    # ------------------------------------------------------------------- properties

    @property
    def description(self) -> str:
        """RabbitMQ ``rs/1``: ``queue 'q' in vhost '/'`` -- the subject of every error text."""
        return f"queue '{self.name}' in vhost '{self.vhost}'"

    @property
    def exclusive(self) -> bool:
        """Whether one connection owns this queue (AMQP 0-9-1 queue.declare exclusive)."""
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        """Available (ready) entries -- what queue.declare-ok and basic.get-ok report."""
        fifo = self._fifo  # FifoEntries.__len__ written out: this is read several times a message
        return len(fifo.released) + len(fifo.log) - fifo.head

    @property
    def acquired_count(self) -> int:
        """Entries delivered and not yet settled or released (unacknowledged)."""
        return len(self._acquired)

    @property
    def consumer_count(self) -> int:
        """Attached consumers, interested or not."""
        return len(self.consumers)

    @property
    def active_consumer(self) -> QueueConsumer | None:
        """x-single-active-consumer: the one consumer that gets messages (else None)."""
        mode = self.single_active
        return mode.active if mode is not None else None

    @property
    def should_auto_delete(self) -> bool:
        """An auto-delete queue whose last consumer went (never one that had none)."""
        return (
            self.auto_delete and self.has_ever_had_consumers
            and not self.consumers and not self.deleted
        )

    # --------------------------------------------------------------------- entries

    def enqueue(self, message: Message) -> list[QueueConsumer]:
        """Append a message; returns the consumers to notify (Qpid: "A new message arrives").

        Called by VirtualHost.publish (basic.publish). Qpid: exactly one interested acquiring
        consumer is notified, highest priority first, and every interested browser; nobody
        when nobody is interested.
        """
        if self.deleted:
            raise InternalError(f"enqueue on deleted {self.description}")
        message.refs += 1
        self._fifo.append(message, self._next_position)  # its entry is made when taken
        self._next_position += 1
        if self.store is not None and (message.stored is not None or message.origin is not None):
            self.store.enqueued(self.name, message, self._host.now)
        # Qpid: non-acquiring consumers "should always be notified about new messages".
        notify = self.consumers.non_acquiring() if self.consumers.has_non_acquiring else []
        consumer = self.consumers.notify_one()
        if consumer is not None:
            notify.append(consumer)
        return notify

    def restore(self, message: Message, *, redelivered: bool, now: float) -> None:
        """A persistent message comes back at start, in enqueue order (broker.storage.message_store);
        ``redelivered`` if it had been delivered. Nobody is notified: no consumer exists yet."""
        if self.deleted:
            raise InternalError(f"restore on deleted {self.description}")
        message.refs += 1
        self._fifo.append(message, self._next_position)
        self._next_position += 1
        if self.store is not None:  # replaying: its records are on disk already
            self.store.enqueued(self.name, message, now)
        if redelivered:
            self._fifo.last().redelivered = True
            if self.store is not None:
                self.store.delivered(self.name, message)

    def offer(self, message: Message, now: float | None = None) -> list[QueueConsumer] | None:
        """Enqueue unless the queue refuses (x-overflow reject-publish): None when refused.

        Called by VirtualHost.publish for queues with arguments and for dead-lettered copies;
        a plain queue never refuses.
        """
        return self.enqueue(message)

    def pull(
        self, consumer: QueueConsumer, max_n: int, now: float | None = None
    ) -> tuple[list[QueueEntry], bool]:
        """Deliver up to ``max_n`` entries to ``consumer``; returns ``(entries, more)``.

        Qpid ``AbstractQueue#deliverSingleMessage``, batched; called when a worker's pull
        request arrives. Acquiring consumers acquire; browsers only advance their pointer.
        ``more`` is True when ``max_n`` came back and more is available to this consumer: it
        stays Notified and should pull again. Otherwise it moves to the back of Interested
        (Qpid: "asymptotic fairness") and waits for the next notification. ``now`` matters to
        queues with TTLs (expired messages are never delivered); a plain queue ignores it.
        """
        if max_n < 1:
            raise ValueError(f"max_n must be at least 1, not {max_n}")
        if consumer not in self.consumers or not consumer.interested:
            return [], False
        if not consumer.acquiring:
            return self._browse(consumer, max_n)
        if self.consumers.higher_priority_active(consumer):
            # Qpid: a higher-priority consumer that wants work takes the message.
            self.consumers.back_of_interested(consumer)
            return [], False
        entries = self._acquire(max_n)
        more = len(entries) == max_n and self.message_count > 0
        if more:
            self.consumers.mark_notified(consumer)
        else:
            self.consumers.back_of_interested(consumer)
        return entries, more

    def get(self, now: float | None = None) -> QueueEntry | None:
        """Acquire the next available entry for basic.get, or None (basic.get-empty).

        Qpid's Message Delivery: Basic.Get is "a temporary subscription that can only ever receive one
        message" -- a subscription at the queue head that acquires once and goes away, so it
        needs no consumer record and notifies nobody. basic.get restarts an x-expires lease
        (rabbit_amqqueue_process ensure_expiry_timer).
        """
        if self.lease is not None:
            self.touch(now)
        return self._get(now)

    def _get(self, now: float | None) -> QueueEntry | None:
        """The storage's half of :meth:`get`."""
        return self._take_next()

    def release(self, entry: QueueEntry, now: float | None = None) -> list[QueueConsumer]:
        """Put an acquired entry back at its original position, redelivered; returns whom to wake.

        Called for basic.reject/nack with requeue, basic.recover, and a channel, connection or
        worker going away with unacknowledged messages. Qpid's Message Delivery: acquiring
        consumers see the returned message next; browsers are not rewound, so only those that
        have not yet passed its position are told. Qpid's Consumer-Queue Interactions: "a
        previously unavailable message becomes available" notifies one interested acquiring
        consumer. No-op for an entry that is not acquired
        (e.g. its queue was deleted).
        """
        if entry.queue is not self or entry.state is not ACQUIRED:
            return []
        if self.deleted:
            return self._settle_orphan(entry)
        del self._acquired[entry.id]
        entry.state = AVAILABLE
        entry.redelivered = True
        self._fifo.put_back(entry)
        notify = browsers_before(self.consumers, entry.position)
        consumer = self.consumers.notify_one()
        if consumer is not None:
            notify.append(consumer)
        return notify

    def settle(self, entry: QueueEntry) -> list[QueueConsumer]:
        """Remove an acquired entry for good (basic.ack); returns whom to wake.

        The message's body is dropped (``on_drop``) when no entry references it any more.
        No-op for an entry that is not acquired (already settled, or its queue was deleted).
        Only a message-group queue wakes anyone: settling can free a group (Qpid: "a
        previously unavailable (blocked by message grouping) message becomes available").
        """
        if entry.queue is not self or entry.state is not ACQUIRED:
            return []
        del self._acquired[entry.id]
        entry.state = DELETED
        self._unref(entry.message)
        return []

    def discard(self, entry: QueueEntry) -> list[QueueConsumer]:
        """basic.reject / basic.nack with requeue=false: dead-letter (reason ``rejected``), settle.

        Without ``x-dead-letter-exchange`` this is settle. The dead-lettered copy is routed when
        the runtime next calls ``VirtualHost.drain``. Returns whom to wake on this queue.
        """
        if entry.queue is not self or entry.state is not ACQUIRED:
            return []
        if self.deleted:
            return self._settle_orphan(entry)
        self._dead_letter(entry.message, DeadLetterReason.REJECTED)
        return self.settle(entry)

    def purge(self) -> int:
        """Drop every available entry (queue.purge); acquired ones stay until settled.

        Returns how many. The queue is empty at once; the entries go to the host's graveyard,
        which drops their messages a slice at a time (RabbitMQ does not dead-letter them).
        """
        count = self.message_count
        if self.store is not None:
            self.store.purged(self.name, [e.message for e in self._acquired.values()])
        self._fifo.bury(self._host, self._on_drop)
        return count

    def delete(self) -> list[QueueConsumer]:
        """Drop every ready entry and detach every consumer (queue.delete).

        Returns the consumers that were attached: the runtime sends them basic.cancel.
        Acquired (delivered, unsettled) entries keep their message until the runtime settles
        or releases them, whatever the client does: a worker may still be copying the body
        out of the arena. Releasing one then drops it (there is no queue to return to), and
        discarding one does not dead-letter it. Both go through :meth:`_settle_orphan`.
        """
        if self.deleted:
            return []
        self.deleted = True
        if self.store is not None:
            self.store.deleted(self.name)
        self._fifo.bury(self._host, self._on_drop)
        self._exclusive_consumer = None
        return self.consumers.clear()

    def _settle_orphan(self, entry: QueueEntry) -> list[QueueConsumer]:
        """An acquired entry of a deleted queue is given back: let its message go."""
        del self._acquired[entry.id]
        entry.state = DELETED
        self._unref(entry.message)
        return []

    def available_entries(self) -> list[QueueEntry]:
        """Available entries in position order (introspection; O(n))."""
        return self._fifo.entries()

    def acquired_entries(self) -> list[QueueEntry]:
        """Acquired, unsettled entries in acquisition order (introspection; O(n))."""
        return list(self._acquired.values())

    def entries(self) -> Iterator[QueueEntry]:
        """Every entry still holding its message: available ones, then acquired ones."""
        yield from self.available_entries()
        yield from list(self._acquired.values())

    def body_refs(self) -> Iterator[Any]:
        """The body handle of every message the queue holds (a dead-letter copy's: its
        origin's), available or acquired, without making entries (an arena sweep)."""
        yield from self._fifo.body_refs()
        for entry in list(self._acquired.values()):
            yield (entry.message.origin or entry.message).body_ref

    def stored_in(self, file: int, limit: int) -> list[tuple[Message, bool]] | None:
        """The messages held here whose E record is in index file ``file``, each with whether
        it was delivered (broker.storage.index_moves); None when that cannot be told by looking at
        ``limit`` entries past the delivered ones (:meth:`FifoEntries.stored_in`)."""
        acquired = [(entry.message, True) for entry in self._acquired.values()
                    if entry.message.stored is not None and entry.message.stored[5] == file]
        available = self._fifo.stored_in(file, limit)
        return None if available is None else acquired + available

    # ----------------------------------------------------------------------- timers

    def next_deadline(self) -> float | None:
        """The earliest ``now`` at which :meth:`tick` has work (a TTL, a held message, x-expires)."""
        lease = self.lease
        if lease is None:
            return self._storage_deadline()
        return lease.deadline(self._storage_deadline(), bool(self.consumers))

    def _storage_deadline(self) -> float | None:
        """The storage's half of :meth:`next_deadline`: none for the plain FIFO."""
        return None

    def tick(self, now: float) -> list[QueueConsumer]:
        """Expire messages at the head and release held ones that are due; returns whom to wake.

        Called by VirtualHost.tick (the runtime's timer) once ``now`` reaches next_deadline().
        """
        return []

    def touch(self, now: float | None = None) -> None:
        """The queue was used (queue.declare, passive or not): restarts an x-expires lease."""
        lease = self.lease
        if lease is not None:
            lease.last_used = self._time(now)
            self._reschedule()

    def change_settings(self, settings: QueueSettings) -> None:
        """A policy changed the queue's effective arguments (broker.topology.policies): an
        ``x-expires`` lease that changed starts again (RabbitMQ init_exp). The caller switches a
        plain queue to featured storage first when the new settings need it."""
        self.settings = settings
        self.lease = ExpiresWhenUnused.renewed(self.lease, settings.expires, self._host.now)
        self._reschedule()

    def unused_expired(self, now: float) -> bool:
        """Whether an x-expires queue has no consumers and was unused for its whole lease."""
        lease = self.lease
        return lease is not None and not self.consumers and now >= lease.end()

    # -------------------------------------------------------------- delivery content

    def delivery_count(self, entry: QueueEntry) -> int:
        """How many times this entry was returned to the queue (quorum ``delivery_count``)."""
        return 0

    def delivery_headers(self, entry: QueueEntry, *, basic_get: bool = False) -> dict[str, Any] | None:
        """Headers to re-encode the delivered content header with; None: send it as published.

        A dead-lettered copy (``message.reheadered``) carries new headers, and its expiration
        property is gone (``message.expiration`` is None). Called by the runtime per delivery.
        """
        message = entry.message
        return message.headers if message.reheadered else None

    # -------------------------------------------------------------------- consumers

    def add_consumer(self, consumer: QueueConsumer) -> None:
        """Attach a consumer, NotInterested until it says otherwise (basic.consume).

        RabbitMQ: 403 ACCESS_REFUSED "queue 'q' in vhost '/' in exclusive use" when the queue
        has an exclusive consumer, or an exclusive consumer asks for a queue already consumed.
        """
        single = self.single_active
        if single is not None:
            single.admit(consumer, self.description)
        if self.deleted:
            raise NotFound(f"no {self.description}")
        if self._exclusive_consumer is not None or (consumer.exclusive and self.consumers):
            raise AccessRefused(f"{self.description} in exclusive use")
        self.consumers.add(consumer)
        self.has_ever_had_consumers = True
        if consumer.exclusive:
            self._exclusive_consumer = consumer
        if single is not None:
            single.added(consumer)

    def remove_consumer(self, consumer: QueueConsumer) -> list[QueueConsumer]:
        """Detach a consumer, leaving no reference to it; returns whom to wake instead.

        Called for basic.cancel, channel/connection close and worker death. Qpid: if it was
        Notified ("did not do the work we expected") or was the higher priority holding others
        back, the work goes to another consumer. x-expires: the lease starts again when the last
        consumer goes; x-single-active-consumer: the next in line takes over when the active one
        goes, and is notified if it wanted work.
        """
        single = self.single_active
        if single is not None:
            single.forget(consumer)
        notify = self._detach(consumer)
        if self.lease is not None and not self.consumers:
            self.touch()
        if single is not None:
            successor = single.succeed(consumer)
            if successor is not None:
                notify += self._set_interest(successor, True)
        return notify

    def _detach(self, consumer: QueueConsumer) -> list[QueueConsumer]:
        """The storage's half of :meth:`remove_consumer`."""
        previous = self.consumers.remove(consumer)
        if previous is REMOVED:
            return []
        if consumer is self._exclusive_consumer:
            self._exclusive_consumer = None
        if previous is INTERESTED or previous is NOTIFIED:
            return self._hand_over()
        return []

    def set_notify_work_desired(self, consumer: QueueConsumer, desired: bool) -> list[QueueConsumer]:
        """Qpid ``AbstractQueue#setNotifyWorkDesired``: credit, channel.flow, TCP back-pressure.

        Becoming interested with work available notifies that consumer (Qpid: "Consumer
        becomes Interested"). A Notified consumer turning uninterested hands its work to
        another, and a higher-priority one turning uninterested lets lower priorities consume
        (Qpid: "A high priority consumer becomes uninterested"). A waiting single-active
        consumer's wish is only recorded.
        """
        single = self.single_active
        if single is not None and single.defers(consumer, desired):
            return []
        return self._set_interest(consumer, desired)

    def _set_interest(self, consumer: QueueConsumer, desired: bool) -> list[QueueConsumer]:
        """The storage's half of :meth:`set_notify_work_desired`."""
        if consumer not in self.consumers:
            return []
        previous = consumer.state
        if not self.consumers.set_interest(consumer, desired):
            return []
        if desired:
            return self._notify_newly_interested(consumer)
        if previous is INTERESTED or previous is NOTIFIED:
            return self._hand_over()
        return []

    # ---------------------------------------------------------------------- helpers

    def _notify_newly_interested(self, consumer: QueueConsumer) -> list[QueueConsumer]:
        if not consumer.acquiring:
            return [consumer] if self._next_after(consumer.browse_position) else []
        if not self.message_count or self.consumers.higher_priority_active(consumer):
            return []
        self.consumers.mark_notified(consumer)
        return [consumer]

    def _hand_over(self) -> list[QueueConsumer]:
        # Work that someone was expected to do needs a new taker -- unless a consumer at the
        # top priority is already Notified: it keeps pulling until the queue is empty.
        if not self.message_count:
            return []
        consumer = self.consumers.notify_one(unless_notified=True)
        return [consumer] if consumer is not None else []

    def _take_next(self) -> QueueEntry | None:
        entry = self._fifo.take()
        if entry is None:
            return None
        entry.state = ACQUIRED
        if not entry.id:
            entry.id = new_entry_id()
        self._acquired[entry.id] = entry
        return entry

    def _acquire(self, max_n: int) -> list[QueueEntry]:
        taken: list[QueueEntry] = []
        while len(taken) < max_n:
            entry = self._take_next()
            if entry is None:
                break
            taken.append(entry)
        return taken

    def _next_after(self, position: int) -> QueueEntry | None:
        """The first entry still on the queue past ``position`` (broker.queues.browsing)."""
        return self._fifo.next_after(self._acquired, position)

    def _browse(self, consumer: QueueConsumer, max_n: int) -> tuple[list[QueueEntry], bool]:
        return self._fifo.browse(consumer, max_n, self._acquired)

    def _unref(self, message: Message) -> None:
        if self.store is not None and message.stored is not None:
            self.store.removed(self.name, message)
        # drop_reference's first step inline: one call fewer per settled message (the hot path).
        message.refs -= 1
        if message.refs == 0:
            # A dead-letter copy releases its origin, whose last reference calls on_drop.
            if message.origin is not None:
                drop_reference(message.origin, self._on_drop)
            elif self._on_drop is not None:
                self._on_drop(message)

    def _dead_letter(self, message: Message, reason: DeadLetterReason) -> None:
        # rabbit_amqqueue_process with_dlx: only a queue with a dead-letter exchange republishes.
        if self.settings.dead_letter_exchange is not None:
            self._host.dead_letter(self, message, reason)

    def _time(self, now: float | None) -> float:
        """``now`` if the runtime passed it (and the host learns it), else the host's latest."""
        if now is None:
            return self._host.now
        self._host.advance(now)
        return now

    def _reschedule(self) -> None:
        deadline = self.next_deadline()
        if deadline is not None:
            self._host.schedule(self, deadline)
