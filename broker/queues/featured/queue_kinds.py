"""Which queue class a declare gets: storage and consumer handling chosen once, from arguments.

A queue with no arguments is a plain :class:`broker.queues.queue.Queue` -- the hot path, untouched by
any feature. Arguments select, at declare time:

* storage: :class:`broker.queues.featured.featured_queue.FeaturedQueue` for TTLs, length limits, priorities,
  held messages, message groups and delivery limits;
* consumer modes, objects the queue holds whatever its storage
  (:mod:`broker.queues.consumer_modes`): ``x-single-active-consumer`` and ``x-expires``.

A per-message ``expiration`` needs featured storage too, but may reach any queue: the first one
to arrive at a plain queue upgrades it in place (:func:`upgrade`), once. That includes
``expiration: "0"`` (delivered only to a consumer that can take it at once, else expired on
arrival: see :mod:`broker.queues.featured.featured_queue`), so the plain queue's fast path
never looks at TTLs.

Called from: the supervisor process (VirtualHost.declare_queue / publish).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

from broker.messages.message import Message
from broker.queues.arguments import PLAIN, QueueSettings, parse_queue_arguments
from broker.queues.entry_state import new_entry_id
from broker.queues.featured.arrival_order import ArrivalOrder
from broker.queues.featured.featured_queue import FeaturedQueue
from broker.queues.fifo_entries import FifoEntries
from broker.queues.queue import Queue
from broker.queues.queue_entry import QueueEntry
from broker.queues.queue_host import QueueHost


def queue_class(settings: QueueSettings) -> type[Queue]:
    """The storage for these settings: the plain FIFO, or featured storage."""
    return FeaturedQueue if settings.needs_featured_storage else Queue


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
    host: QueueHost[Queue] | None = None,
) -> Queue:
    """A queue of the kind its arguments ask for (validated: 406 as RabbitMQ words it)."""
    if settings is None:
        where = f"queue '{name}' in vhost '{vhost}'"
        settings = parse_queue_arguments(arguments, where) if arguments else PLAIN
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
    # The one class switch left, and on purpose: plain storage is the hot path, inline in Queue's
    # methods; holding storage as a separate object would add a call to every publish, pull and
    # settle of every queue for the sake of this rare, once-per-queue upgrade. The consumer
    # modes are held objects (broker.queues.consumer_modes), so the switch is always to FeaturedQueue.
    queue.__class__ = FeaturedQueue
    assert isinstance(queue, FeaturedQueue)
    _adopt_plain_entries(queue)
    return queue


def _adopt_plain_entries(queue: FeaturedQueue) -> None:
    """The switched queue takes over its plain entries: positions, redelivered flags and
    acquired entries carry over; the available ones go into featured storage."""
    available = Queue.available_entries(queue)
    for entry in available:  # a plain queue draws ids at delivery; featured storage at enqueue
        if not entry.id:
            entry.id = new_entry_id()
    queue._fifo = FifoEntries(queue, QueueEntry)
    queue._init_storage(queue.settings)
    queue._order = ArrivalOrder(available + list(queue._acquired.values()))
    for entry in available:
        queue._count += 1
        queue._bytes += entry.message.body_size
        queue._insert(entry)
