"""Pika helpers that drive a broker in the integration tests: pumping connections' I/O, the
reply code a channel was closed with, passive declares, draining a queue with basic.get, and
unique entity names per test. The broker processes themselves are `harness.py`'s."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions


def pump(connections: Sequence[pika.BlockingConnection], seconds: float) -> None:
    """Process I/O and deliver callbacks on every connection for `seconds` (an observation window)."""
    limit = time.monotonic() + seconds
    while True:
        for connection in connections:
            connection.process_data_events(time_limit=0.02)
        if time.monotonic() >= limit:
            return


def pump_until(
    connections: Sequence[pika.BlockingConnection],
    predicate: Callable[[], object],
    timeout: float = 10.0,
    what: str = "",
) -> None:
    """Process I/O on every connection until `predicate()` holds, at most `timeout` s."""
    limit = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= limit:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        for connection in connections:
            connection.process_data_events(time_limit=0.02)


def channel_close_code(
    connection: pika.BlockingConnection,
    channel: pika.adapters.blocking_connection.BlockingChannel,
    action: Callable[[], object],
    timeout: float = 5.0,
) -> int:
    """Run `action` on `channel` and return the reply code of the channel.close it provokes.

    Synchronous methods raise ChannelClosedByBroker themselves; asynchronous ones (ack, publish)
    are answered later, so the connection is pumped until the channel is closed.
    """
    try:
        action()
        pump_until([connection], lambda: channel.is_closed, timeout, "the broker to close the channel")
    except pika.exceptions.ChannelClosedByBroker as exc:
        return exc.reply_code
    except pika.exceptions.ChannelWrongStateError:
        pass  # closed while `action` flushed its output; the reason is recorded below
    reason = channel._closing_reason  # BlockingChannel keeps the Channel.Close it got here
    assert isinstance(reason, pika.exceptions.ChannelClosedByBroker), f"channel closed by {reason!r}"
    return reason.reply_code


def ready_count(channel: Any, queue: str) -> int:
    """Messages ready for delivery in `queue` (queue.declare-ok's message-count)."""
    return channel.queue_declare(queue, passive=True).method.message_count


def passive_declare_code(connection: pika.BlockingConnection, queue: str) -> int | None:
    """None if a passive queue.declare succeeds, else the reply code that closed the channel."""
    channel = connection.channel()
    try:
        channel.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return exc.reply_code
    channel.close()
    return None


def queue_exists(connection: pika.BlockingConnection, queue: str) -> bool:
    """Passive queue.declare on a fresh channel: True if declared, False on 404 NOT_FOUND."""
    channel = connection.channel()
    try:
        channel.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404, f"passive declare of {queue!r} closed the channel with {exc!r}"
        return False
    channel.close()
    return True


def drain_with_get(channel: Any, queue: str, limit: int) -> list[tuple[bytes, bool]]:
    """basic.get with auto-ack until get-empty; (body, redelivered) pairs; at most `limit` + 1 gets."""
    got: list[tuple[bytes, bool]] = []
    for _ in range(limit + 1):
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((body, method.redelivered))
    raise AssertionError(f"{queue!r} still not empty after {limit} + 1 basic.get")


class Names:
    """Unique entity names for one test, so tests can share a broker."""

    def __init__(self, test_name: str):
        self.prefix = f"{test_name[:60]}.{uuid.uuid4().hex[:8]}"

    def __call__(self, label: str = "q") -> str:
        return f"{self.prefix}.{label}"
