"""What a virtual host is to its queues and to the runtime's timer: time, steps, deadlines.

:class:`broker.topology.vhost.VirtualHost` derives from :class:`StepHost`: its queues call it as their
:class:`broker.queues.queue_host.QueueHost` (``now``, ``schedule``, ``dead_letter``, ``bury``,
``discard``, ``expire_budget``), and the runtime calls :meth:`StepHost.advance`,
:meth:`StepHost.next_deadline`, :meth:`StepHost.tick` and :meth:`StepHost.drain`.

Time, timers and dead letters. The domain reads no clock: ``now`` (monotonic seconds) comes in
as an argument, and the virtual host remembers the latest (:meth:`StepHost.advance`).
Queues register deadlines (TTL at the head, held messages, x-expires leases; kept by
:class:`broker.topology.timers.Timers`) and the runtime calls :meth:`StepHost.tick` when
:meth:`StepHost.next_deadline` is reached. A queue that
dead-letters a message asks the virtual host for a copy (:meth:`StepHost.dead_letter`) at
once, pinning the body; the copy is routed by :meth:`StepHost.drain`, which publish and tick
call themselves and the runtime calls after each batch of requests: routing never re-enters a
queue in the middle of one of its own operations.

Bounded steps (Overload: no single operation holds the supervisor for long). A *step* is what
happens at one ``now``: a batch of requests (:meth:`advance` to a later time starts a new one)
or a timer tick. Each step may expire or release from hold at most ``expire_slice`` messages
(``expire_budget``, spent by the queues) and drop at most ``reap_slice`` entries of purged and
deleted queues. queue.purge and queue.delete answer at once -- the queue is empty, or gone, at
once -- and hand their entries to the :class:`~broker.queues.graveyard.Graveyard`; the step reaps what its
budget allows and :meth:`next_deadline` says "now" while anything is left, so the runtime's
timer ticks again at once and other requests are served in between. Expiry left over by a spent
budget leaves the queue's deadline due: the same. Dead-letter copies are offered to at most
``dead_letter_slice`` queues a step (a dead-letter exchange may be bound to thousands); the rest
wait in order, :meth:`next_deadline` says "now", and a tick expires nothing until they are gone.

Called from: the supervisor process (``broker.topology.vhost``; ``broker.runtime.dispatch`` through it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from broker.messages.deadletter import DeadLetterReason
from broker.messages.message import Message
from broker.queues.consumer_manager import QueueConsumer
from broker.queues.graveyard import REAP, Graveyard, Words
from broker.queues.queue import Queue
from broker.queues.queue_host import DEAD_LETTER_SLICE, EXPIRE_SLICE, REAP_SLICE, BodyCodec
from broker.queues.sliced_work import SlicedWork
from broker.topology.routing import DeadLetterRouter
from broker.topology.timers import Timers


class TickOutcome(NamedTuple):
    """What a timer tick did: see StepHost.tick."""

    notify: list[QueueConsumer]  # consumers to notifyWork (held messages released, dead letters)
    deleted_queues: list[str]  # queues deleted by x-expires
    cancelled: list[QueueConsumer]  # their consumers, to cancel (consumer_cancel_notify)
    dead_lettered: int = 0  # dead-letter copies made (expired messages of queues with a DLX)


class StepHost:
    """The host of a virtual host's queues, working in bounded steps (module docstring).

    The virtual host keeps the queues by name (``_queues``) and deletes them
    (:meth:`_delete_queue`): the timer step deletes unused x-expires queues through it.
    """

    _queues: dict[str, Queue]

    def __init__(self, dead_letters: DeadLetterRouter, *, now: float, epoch_offset: float,
                 sliced: SlicedWork | None = None) -> None:
        # The latest monotonic time the runtime passed in, and Unix time minus monotonic time
        # (the runtime's time.time() - time.monotonic()): x-death times and held messages'
        # x-qpid-not-valid-before are Unix times.
        self.now = now
        self.epoch_offset = epoch_offset
        self._timers = Timers()
        self._dead_letters = dead_letters
        # Work per step (module docstring): the slices, and what is left of them in this step.
        self.expire_slice = EXPIRE_SLICE
        self.expire_budget = EXPIRE_SLICE
        self.dead_letter_slice = DEAD_LETTER_SLICE
        self._dead_letter_budget = DEAD_LETTER_SLICE
        # The step's sliced work (broker.queues.sliced_work): the graveyard's line (``REAP``),
        # and the lines the runtime adds (closed channels' consumers and deliveries). The
        # virtual hosts of one broker share one (``sliced``): one step's budgets, whichever
        # vhost's queue or channel the work is for.
        self.sliced = sliced if sliced is not None else SlicedWork(**{REAP: REAP_SLICE})
        self._graveyard = Graveyard(self.sliced)
        # The runtime's (broker.runtime.dispatch): lets plain queues keep a waiting message as its
        # body handle alone (broker.queues.fifo_entries). None: they never do.
        self.body_codec: BodyCodec | None = None

    def _delete_queue(self, queue: Queue) -> list[QueueConsumer]:
        """Delete ``queue`` from the virtual host; returns its consumers (broker.topology.vhost)."""
        raise NotImplementedError

    def advance(self, now: float) -> None:
        """The runtime's clock moved on: the ``now`` used where a call passes none, and a new
        step with fresh budgets (module docstring)."""
        if now > self.now:
            self.now = now
            self.expire_budget = self.expire_slice
            self.sliced.refill(REAP)
            self._dead_letter_budget = self.dead_letter_slice

    # Graveyard (broker.queues.queue_host.QueueHost): what purged and deleted queues let go of.

    def bury(self, items: list[Any], *, pick: int | None = None, keep: int = 0,
             on_drop: Callable[[Message], None] | None, words: Words | None = None) -> None:
        """Called by a queue: drop the entries ``items[keep:]``, as many as this step's budget
        allows now (a small queue's at once), the rest over the next steps."""
        self._graveyard.bury(items, pick=pick, keep=keep, on_drop=on_drop, words=words)
        self._reap()

    def discard(self, container: list[Any] | dict[Any, Any]) -> None:
        """Called by a queue: deallocate a container it let go of (the same way)."""
        self._graveyard.discard(container)
        self._reap()

    def defer(self, job: Callable[[int], int]) -> None:
        """Do ``job`` (``Graveyard.defer``) as this step's budget allows, the rest over the
        next steps, among the graveyard's other work and in its order."""
        self._graveyard.defer(job)
        self._reap()

    @property
    def reap_slice(self) -> int:
        """Graveyard work a step may do (module docstring)."""
        return self.sliced.slices[REAP]

    @reap_slice.setter
    def reap_slice(self, n: int) -> None:
        self.sliced.slices[REAP] = n

    def _reap(self) -> None:
        # Deferred work may bury or defer more (a queue deleted a slice at a time buries its
        # messages; an exchange auto-deleted with its last binding defers the bindings to it):
        # that goes to the end of the line, which the reap under way reaches as its budget
        # allows (broker.queues.sliced_work).
        self.sliced.run(REAP)

    @property
    def buried(self) -> int:
        """Entries of purged and deleted queues whose messages are not dropped yet."""
        return self._graveyard.pending

    def buried_body_refs(self) -> Iterator[Any]:
        """Their messages' body handles (a dead-letter copy's: its origin's): bodies still in
        use for an arena sweep (O(buried))."""
        return self._graveyard.body_refs()

    def dead_letter(self, queue: Queue, message: Message, reason: DeadLetterReason) -> None:
        """Called by a queue: copy ``message`` for its dead-letter exchange (routed by drain)."""
        self._dead_letters.add(queue, message, reason, self.now + self.epoch_offset)

    @property
    def dead_lettered(self) -> int:
        """Dead-letter copies made, ever."""
        return self._dead_letters.made

    def drain(self, *, whole: bool = False) -> list[QueueConsumer]:
        """Route pending dead letters, as many as this step's ``dead_letter_slice`` allows
        (the rest in the next steps, which :meth:`next_deadline` makes come at once; ``whole``:
        all of them, the runtime stopping); returns consumers to notify that no call returned
        yet.

        The runtime calls it after each batch of requests (queue-level calls -- pull, get,
        release, discard -- can dead-letter). publish and tick call it themselves.
        """
        if whole:
            return self._dead_letters.route()[0]
        if self._dead_letter_budget <= 0 or not self._dead_letters.pending:
            return []
        notify, offered = self._dead_letters.route(self._dead_letter_budget)
        self._dead_letter_budget -= offered
        return notify

    def schedule(self, queue: Queue, deadline: float) -> None:
        """Called by a queue: call its tick at ``deadline`` (earlier requests win)."""
        self._timers.schedule(queue, deadline)

    def next_deadline(self) -> float | None:
        """When the runtime's timer should next call :meth:`tick` (monotonic seconds), or None.

        ``now`` while sliced work is left (purged or deleted queues' entries to drop, the
        runtime's closed channels to tear down) or dead letters to route.
        """
        if self.sliced or self._dead_letters.pending:
            return self.now
        return self._timers.next_deadline()

    def tick(self, now: float, *, refill: bool = True) -> TickOutcome:
        """The runtime's timer: expire messages, release held ones, delete unused x-expires queues.

        Expired messages are dead-lettered or dropped (``on_drop`` already called). Returns the
        consumers to notify, and the queues deleted with the consumers to cancel.

        One step (module docstring): a slice of the graveyard, and at most ``expire_slice``
        messages expired or released (each due queue counts one too); a queue still due when
        the budget is spent is ticked again at once. ``refill=False``: the graveyard's budget is
        shared and its owner refilled it (``broker.topology.vhosts``: one slice a tick, however
        many vhosts tick).
        """
        self.advance(now)
        if refill:
            self.sliced.refill(REAP)
        self._dead_letter_budget = self.dead_letter_slice
        self._reap()
        # Dead letters still to route come first; no more expire until they have gone.
        notify = self.drain()
        self.expire_budget = 0 if self._dead_letters.pending else self.expire_slice
        before = self.dead_lettered
        due = self._timers.pop_due(now, self.expire_slice)
        deleted: list[str] = []
        cancelled: list[QueueConsumer] = []
        for index, (_deadline, queue) in enumerate(due):
            if self._queues.get(queue.name) is not queue:
                continue
            if self.expire_budget <= 0:  # the rest in the next tick, at once
                for later_deadline, later in due[index:]:
                    if self._queues.get(later.name) is later:
                        self.schedule(later, later_deadline)
                break
            self.expire_budget -= 1
            if queue.unused_expired(now):
                deleted.append(queue.name)
                cancelled += self._delete_queue(queue)
                continue
            notify += queue.tick(now)
            following = queue.next_deadline()
            if following is not None:
                self.schedule(queue, following)
        notify += self.drain()
        return TickOutcome(notify, deleted, cancelled, self.dead_lettered - before)
