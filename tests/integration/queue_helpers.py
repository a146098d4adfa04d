"""Helpers of the queue-argument, dead-lettering and exchange tests through pika
(test_features_queues.py, test_features_deadletter.py, test_features_exchanges.py,
test_features_sender_selected.py): basic.get, declaring queues, waiting for messages, a queue
dead-lettering into another, and checking one x-death entry."""

from __future__ import annotations

import datetime
from typing import Any

from tests.integration.harness import Names, drain_with_get, ready_count, wait_until


def _bodies(channel: Any, queue: str) -> list[bytes]:
    """Every ready message's body in `queue`, taken with basic.get (auto-ack)."""
    return [body for body, _ in drain_with_get(channel, queue, 100)]


def _queues(channel: Any, names: Names, *labels: str) -> list[str]:
    """Declare a queue per label (its unique name from ``names``); their names."""
    queues = [names(label) for label in labels]
    for queue in queues:
        channel.queue_declare(queue)
    return queues


def _get(channel: Any, queue: str) -> tuple[Any, Any, bytes]:
    """One message from `queue` with basic.get (auto-ack); fails if there is none."""
    method, properties, body = channel.basic_get(queue, auto_ack=True)
    assert method is not None, f"{queue!r} is empty"
    return method, properties, body


def _wait_for_messages(channel: Any, queue: str, count: int, what: str = "") -> None:
    wait_until(
        lambda: ready_count(channel, queue) >= count,
        10,
        what or f"{count} message(s) in {queue}",
    )


def _dead_letter_queue(
    channel: Any, names: Names, source_arguments: dict[str, Any], durable: bool = False
) -> tuple[str, str]:
    """A source queue dead-lettering through the default exchange straight into a new queue."""
    source, dead = names("source"), names("dead")
    channel.queue_declare(dead)
    channel.queue_declare(source, durable=durable, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead, **source_arguments,
    })  # fmt: skip
    return source, dead


def _assert_death(
    death: dict[str, Any],
    *,
    reason: str,
    queue: str,
    exchange: str,
    routing_keys: list[str],
    count: int = 1,
) -> None:
    assert death["count"] == count, death
    assert death["reason"] == reason, death
    assert death["queue"] == queue, death
    assert death["exchange"] == exchange, death
    assert list(death["routing-keys"]) == routing_keys, death
    assert isinstance(death["time"], datetime.datetime), death
    now = datetime.datetime.now(datetime.UTC)
    stamp = death["time"] if death["time"].tzinfo else death["time"].replace(tzinfo=datetime.UTC)
    assert abs((now - stamp).total_seconds()) < 300, f"x-death time {stamp} is not about now ({now})"
