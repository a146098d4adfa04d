"""Consumer modes a queue may hold, chosen once from its arguments: one object per mode.

A queue with neither mode holds ``None`` for each and pays one ``is None`` test in the calls
they touch (consume, cancel, interest changes, basic.get, the timer), never per message.
Either mode combines with plain or featured storage, since the storage never sees them.

Called from: the supervisor process, through :class:`broker.queues.queue.Queue`.
"""

from __future__ import annotations

from broker.errors import AccessRefused
from broker.queues.consumer_manager import QueueConsumer


class SingleActiveConsumer:
    """``x-single-active-consumer``: only one consumer at a time gets messages (RabbitMQ 3.10).

    As RabbitMQ 3.10's classic queues do: the first consumer to register is active whatever
    its priority, and a later higher-priority consumer does not take over; when the active
    consumer goes, the waiting consumer with the highest priority -- earliest registered among
    equals -- becomes active. Waiting consumers are attached (counted in consumer_count) but
    stay in Qpid's NotInterested list; their wish to work is remembered for when they
    become active. An exclusive basic.consume is refused: 403 "... in exclusive use".
    """

    __slots__ = ("_waiting", "active")

    def __init__(self) -> None:
        self.active: QueueConsumer | None = None
        self._waiting: dict[QueueConsumer, bool] = {}  # registration order → wants work

    def admit(self, consumer: QueueConsumer, description: str) -> None:
        """Before basic.consume attaches ``consumer``: an exclusive one is refused."""
        if consumer.exclusive:
            raise AccessRefused(f"{description} in exclusive use")

    def added(self, consumer: QueueConsumer) -> None:
        """The first consumer becomes active, later ones wait in line."""
        if self.active is None:
            self.active = consumer
        else:
            self._waiting[consumer] = False

    def defers(self, consumer: QueueConsumer, desired: bool) -> bool:
        """Whether a change of interest is only recorded (``consumer`` is waiting)."""
        if consumer in self._waiting:
            self._waiting[consumer] = desired
            return True
        return False

    def forget(self, consumer: QueueConsumer) -> None:
        """``consumer`` is being detached: it no longer waits."""
        self._waiting.pop(consumer, None)

    def succeed(self, consumer: QueueConsumer) -> QueueConsumer | None:
        """After ``consumer`` went: if it was active, the next in line takes over.

        Returns the successor when it wanted work (the queue then records its interest).
        """
        if consumer is not self.active:
            return None
        successor = self.active = self._next_in_line()
        if successor is not None and self._waiting.pop(successor):
            return successor
        return None

    def _next_in_line(self) -> QueueConsumer | None:
        # rabbit_queue_consumers:get_consumer -- priority_queue:out_p over the consumers.
        best: QueueConsumer | None = None
        for candidate in self._waiting:
            if best is None or candidate.priority > best.priority:
                best = candidate
        return best


class ExpiresWhenUnused:
    """``x-expires``: deleted after being unused for the lease (RabbitMQ queue TTL).

    Unused: no consumers, and no basic.get or queue.declare (passive or not) for that long.
    The lease restarts on each of those and when the last consumer goes. VirtualHost.tick
    deletes the queue (its messages are dropped, not dead-lettered).
    """

    __slots__ = ("_lease", "last_used")

    def __init__(self, expires_ms: int, now: float) -> None:
        self._lease = expires_ms / 1000.0
        self.last_used = now

    @staticmethod
    def renewed(lease: ExpiresWhenUnused | None, expires_ms: int | None,
                now: float) -> ExpiresWhenUnused | None:
        """The lease after a policy changed ``x-expires``: none without one, ``lease`` while
        its length is the same, else a new one from ``now`` (RabbitMQ init_exp)."""
        if expires_ms is None:
            return None
        if lease is not None and lease._lease == expires_ms / 1000.0:
            return lease
        return ExpiresWhenUnused(expires_ms, now)

    def end(self) -> float:
        """When the lease runs out unless the queue is used again."""
        return self.last_used + self._lease

    def deadline(self, storage_deadline: float | None, consumed: bool) -> float | None:
        """The storage's deadline, or the lease's end while nobody consumes."""
        if consumed:
            return storage_deadline
        end = self.last_used + self._lease
        return end if storage_deadline is None or end < storage_deadline else storage_deadline
