"""Builders shared by the broker domain tests (plain objects, no processes)."""

from __future__ import annotations

import itertools
from typing import Any

from broker.messages.message import FullMessage, Message
from broker.queues.consumer_manager import QueueConsumer
from broker.queues.queue import Queue

# Unix time at monotonic 0 in these tests: x-death times and not-valid-before headers use it.
EPOCH = 1_700_000_000.0
# The owner (worker, connection) of what the tests declare.
ME = ("w0", 1)

_message_ids = itertools.count(1)


def message(
    routing_key: str = "q",
    headers: dict[str, Any] | None = None,
    exchange: str = "",
    *,
    expiration: str | None = None,
    priority: int | None = None,
    size: int = 10,
) -> Message:
    """A message whose body handle is just its id (the domain never looks inside)."""
    mid = next(_message_ids)
    return FullMessage(
        mid, exchange, routing_key, ("body", mid), size, headers,
        expiration=expiration, priority=priority,
    )


def consumer(name: str, priority: int = 0, *, acquiring: bool = True, exclusive: bool = False) -> QueueConsumer:
    """A consumer keyed by its name, which doubles as its tag."""
    return QueueConsumer(name, name, priority=priority, acquiring=acquiring, exclusive=exclusive)


def attach(queue: Queue, *consumers: QueueConsumer, interested: bool = True) -> None:
    """basic.consume for each consumer, then (by default) setNotifyWorkDesired(true)."""
    for c in consumers:
        queue.add_consumer(c)
        if interested:
            queue.set_notify_work_desired(c, True)


def fill(queue: Queue, n: int) -> list[Message]:
    """Enqueue ``n`` messages; returns them in order."""
    messages = [message(queue.name) for _ in range(n)]
    for m in messages:
        queue.enqueue(m)
    return messages


def keys(consumers: list[QueueConsumer]) -> list[str]:
    """The names of ``consumers``, in order -- readable assertions."""
    return [c.key for c in consumers]
