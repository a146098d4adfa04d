"""Which queue class a declare gets: storage and consumer handling chosen once, from arguments.

A queue with no arguments is a plain :class:`broker.queue.Queue` -- the hot path, untouched by
any feature. Arguments select, at declare time:

* storage: :class:`broker.featured_queue.FeaturedQueue` for TTLs, length limits, priorities,
  held messages, message groups and delivery limits;
* consumer modes, as mixins over either storage: :class:`SingleActiveConsumer`
  (``x-single-active-consumer``) and :class:`ExpiresWhenUnused` (``x-expires``).

A per-message ``expiration`` needs featured storage too, but may reach any queue: the first one
to arrive at a plain queue upgrades it in place (:func:`upgrade`), once. That includes
``expiration: "0"`` (delivered only to a consumer that can take it at once, else expired on
arrival: see :mod:`broker.featured_queue`), so the plain queue's fast path never looks at TTLs.

Called from: the supervisor process (VirtualHost.declare_queue / publish).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

from broker.arguments import PLAIN, QueueSettings, parse_queue_arguments
from broker.consumer_manager import QueueConsumer
from broker.errors import AccessRefused
from broker.featured_queue import FeaturedQueue
from broker.message import Message
from broker.queue import Queue, QueueEntry, QueueHost


class SingleActiveConsumer(Queue):
    """``x-single-active-consumer``: only one consumer at a time gets messages (RabbitMQ 3.10).

    As RabbitMQ 3.10's classic queues do: the first consumer to register is active whatever
    its priority, and a later higher-priority consumer does not take over; when the active
    consumer goes, the waiting consumer with the highest priority -- earliest registered among
    equals -- becomes active. Waiting consumers are attached (counted in consumer_count) but
    stay in the seed's NotInterested list; their wish to work is remembered for when they
    become active. An exclusive basic.consume is refused: 403 "... in exclusive use".
    """

    def _setup(self, settings: QueueSettings) -> None:
        super()._setup(settings)
        self.active_consumer: QueueConsumer | None = None
        self._waiting: dict[QueueConsumer, bool] = {}  # registration order → wants work

    def add_consumer(self, consumer: QueueConsumer) -> None:
        """basic.consume: the first consumer becomes active, later ones wait in line."""
        if consumer.exclusive:
            raise AccessRefused(f"{self.description} in exclusive use")
        super().add_consumer(consumer)
        if self.active_consumer is None:
            self.active_consumer = consumer
        else:
            self._waiting[consumer] = False

    def set_notify_work_desired(self, consumer: QueueConsumer, desired: bool) -> list[QueueConsumer]:
        """seed setNotifyWorkDesired; a waiting consumer's wish is only recorded."""
        if consumer in self._waiting:
            self._waiting[consumer] = desired
            return []
        return super().set_notify_work_desired(consumer, desired)

    def remove_consumer(self, consumer: QueueConsumer) -> list[QueueConsumer]:
        """Detach; if it was the active consumer, the next in line takes over and is notified."""
        self._waiting.pop(consumer, None)
        notify = super().remove_consumer(consumer)
        if consumer is not self.active_consumer:
            return notify
        successor = self.active_consumer = self._next_in_line()
        if successor is not None and self._waiting.pop(successor):
            notify += super().set_notify_work_desired(successor, True)
        return notify

    def _next_in_line(self) -> QueueConsumer | None:
        # rabbit_queue_consumers:get_consumer -- priority_queue:out_p over the consumers.
        best: QueueConsumer | None = None
        for candidate in self._waiting:
            if best is None or candidate.priority > best.priority:
                best = candidate
        return best


class ExpiresWhenUnused(Queue):
    """``x-expires``: deleted after being unused for the lease (RabbitMQ queue TTL).

    Unused: no consumers, and no basic.get or queue.declare (passive or not) for that long.
    The lease restarts on each of those and when the last consumer goes. VirtualHost.tick
    deletes the queue (its messages are dropped, not dead-lettered).
    """

    def _setup(self, settings: QueueSettings) -> None:
        super()._setup(settings)
        self._lease = (settings.expires or 0) / 1000.0
        self._last_used = self._host.now
        self._reschedule()

    def touch(self, now: float | None = None) -> None:
        """queue.declare (RabbitMQ ``stat``) restarts the lease."""
        self._last_used = self._time(now)
        self._reschedule()

    def get(self, now: float | None = None) -> QueueEntry | None:
        """basic.get restarts the lease (rabbit_amqqueue_process ensure_expiry_timer)."""
        self.touch(now)
        return super().get(now)

    def remove_consumer(self, consumer: QueueConsumer) -> list[QueueConsumer]:
        """The lease starts again when the last consumer goes."""
        notify = super().remove_consumer(consumer)
        if not self.consumers:
            self.touch()
        return notify

    def unused_expired(self, now: float) -> bool:
        """No consumers and unused for the whole lease."""
        return not self.consumers and now >= self._last_used + self._lease

    def next_deadline(self) -> float | None:
        """The storage's deadline, or the lease's end while nobody consumes."""
        deadline = super().next_deadline()
        if self.consumers:
            return deadline
        end = self._last_used + self._lease
        return end if deadline is None or end < deadline else deadline


_CLASSES: dict[tuple[type[Queue], ...], type[Queue]] = {}


def queue_class(settings: QueueSettings, *, featured: bool = False) -> type[Queue]:
    """The class for these settings: plain or featured storage, plus consumer-mode mixins."""
    bases: list[type[Queue]] = []
    if settings.single_active_consumer:
        bases.append(SingleActiveConsumer)
    if settings.expires is not None:
        bases.append(ExpiresWhenUnused)
    bases.append(FeaturedQueue if featured or settings.needs_featured_storage else Queue)
    key = tuple(bases)
    if len(key) == 1:
        return key[0]
    cls = _CLASSES.get(key)
    if cls is None:
        cls = _CLASSES[key] = type("".join(b.__name__ for b in key), key, {})
    return cls


def make_queue(
    name: str,
    *,
    arguments: Mapping[str, Any] | None = None,
    settings: QueueSettings | None = None,
    vhost: str = "/",
    durable: bool = False,
    exclusive_owner: Hashable | None = None,
    auto_delete: bool = False,
    on_drop: Callable[[Message], None] | None = None,
    host: QueueHost | None = None,
) -> Queue:
    """A queue of the kind its arguments ask for (validated: 406 as RabbitMQ words it)."""
    if settings is None:
        settings = parse_queue_arguments(arguments, f"queue '{name}' in vhost '{vhost}'") if arguments else PLAIN
    cls = queue_class(settings)
    return cls(
        name, durable=durable, exclusive_owner=exclusive_owner, auto_delete=auto_delete,
        arguments=arguments, on_drop=on_drop, vhost=vhost, settings=settings, host=host,
    )


def upgrade(queue: Queue) -> Queue:
    """Switch a plain-storage queue to featured storage in place (same object, same entries).

    For the first message with a per-message ``expiration``: RabbitMQ honours it on any queue.
    Runtime references to the queue and its acquired entries stay valid.
    """
    if not queue.plain:
        return queue
    queue.__class__ = queue_class(queue.settings, featured=True)
    assert isinstance(queue, FeaturedQueue)
    queue.adopt_plain_entries()
    return queue
