"""Protocol features through pika: server capabilities, the maximum message size, frame_max,
and connection.blocked / unblocked around the memory high watermark -- as RabbitMQ 3.10 does
them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from tests.integration.harness import Broker, finish, start_broker, wait_until
from tests.integration.pika_helpers import Names, channel_close_code, pump, pump_until, ready_count
from tests.integration.rawclient import RawClient, publish_frames

MAX_MESSAGE_SIZE = 1000
HIGH_WATERMARK = 150_000
BIG_BODY = 100_000


def _closed_by(channel: Any) -> pika.exceptions.ChannelClosedByBroker:
    reason = channel._closing_reason  # BlockingChannel keeps the Channel.Close it got here
    assert isinstance(reason, pika.exceptions.ChannelClosedByBroker), f"channel closed by {reason!r}"
    return reason


@pytest.fixture
def small_messages_broker(tmp_path: Path) -> Iterator[Broker]:
    """A broker started with --max-message-size MAX_MESSAGE_SIZE."""
    instance = start_broker(tmp_path / "broker", extra_args=["--max-message-size", str(MAX_MESSAGE_SIZE)])
    try:
        yield instance
    finally:
        finish(instance)


@pytest.fixture
def watermark_broker(tmp_path: Path) -> Iterator[Broker]:
    """A broker started with --memory-high-watermark HIGH_WATERMARK (bytes)."""
    # The alarm itself: no paging before it (broker.storage.paging).
    instance = start_broker(tmp_path / "broker", extra_args=[
        "--memory-high-watermark", str(HIGH_WATERMARK), "--memory-paging-ratio", "0"])
    try:
        yield instance
    finally:
        finish(instance)


# --------------------------------------------------------------------------- capabilities, limits


def test_server_advertises_rabbitmq_capabilities(shared_broker: Broker) -> None:
    """connection.start's server-properties carry the capabilities table RabbitMQ sends."""
    connection = shared_broker.connect()
    capabilities = connection._impl.server_properties["capabilities"]
    for name in (
        "publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify",
        "connection.blocked", "consumer_priorities", "authentication_failure_close", "per_consumer_qos",
        "direct_reply_to",
    ):  # fmt: skip
        assert capabilities.get(name) is True, f"capability {name!r} missing or not true: {capabilities!r}"


def test_message_over_max_size_is_406(small_messages_broker: Broker, names: Names) -> None:
    """A body larger than --max-message-size closes the channel with 406 PRECONDITION_FAILED
    ("message size N is larger than configured max size M"); a body of exactly the maximum is
    accepted and the connection stays usable."""
    connection = small_messages_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    queue = names()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"x" * MAX_MESSAGE_SIZE)
    assert ready_count(channel, queue) == 1

    for size in (MAX_MESSAGE_SIZE + 1, 300_000):  # just over, and many frames over
        too_big = connection.channel()
        body = b"y" * size
        code = channel_close_code(
            connection,
            too_big,
            lambda ch=too_big, b=body: ch.basic_publish("", queue, b),
        )
        assert code == 406
        assert _closed_by(too_big).reply_text == (
            f"PRECONDITION_FAILED - message size {size} is larger than configured max size {MAX_MESSAGE_SIZE}"
        )
    assert connection.is_open
    channel.basic_publish("", queue, b"still fine")
    assert ready_count(connection.channel(), queue) == 2


def test_small_frame_max_round_trips_a_large_body(shared_broker: Broker, names: Names) -> None:
    """A client that tunes frame_max down to 4096 can publish and receive a 100 KB body: both
    sides split it into frames of at most 4096 bytes and it arrives intact."""
    body = os.urandom(100_000)
    connection = shared_broker.connect(frame_max=4096)
    assert connection._impl.params.frame_max == 4096
    channel = connection.channel()
    channel.confirm_delivery()
    queue = names()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, body)
    _, _, got = channel.basic_get(queue, auto_ack=True)
    assert got == body


def test_deliveries_respect_the_negotiated_frame_max(shared_broker: Broker, names: Names) -> None:
    """Every body frame the broker sends to a client that tuned frame_max 4096 fits in 4096
    bytes (7-byte header + payload + frame-end), and together they carry the whole body."""
    body = os.urandom(50_000)
    queue = names()
    with RawClient.opened(shared_broker.port, frame_max=4096) as client:
        client.send_method(1, commands.Queue.Declare(queue=queue, auto_delete=True))
        client.read_until(commands.Queue.DeclareOk)
        client.send_method(1, commands.Confirm.Select())
        client.read_until(commands.Confirm.SelectOk)
        client.send(*publish_frames(1, "", queue, body, frame_max=4096))
        client.read_until(commands.Basic.Ack)
        client.send_method(1, commands.Basic.Get(queue=queue, no_ack=True))
        client.read_until(commands.Basic.GetOk)
        header = client.read_until(ContentHeader)
        assert header.body_size == len(body)
        parts: list[bytes] = []
        while sum(map(len, parts)) < len(body):
            part = client.read_until(ContentBody)
            assert 0 < len(part.value) <= 4096 - 8, f"a body frame of {len(part.value) + 8} bytes"
            parts.append(part.value)
        assert b"".join(parts) == body


# --------------------------------------------------------------------------- connection.blocked


def test_publisher_is_blocked_above_the_memory_watermark(watermark_broker: Broker, names: Names) -> None:
    """When held message bytes cross --memory-high-watermark a publishing connection gets
    connection.blocked and its publishes stop being taken in; once consumers bring memory back
    below, it gets connection.unblocked and what it sent meanwhile arrives."""
    publisher = watermark_broker.connect()
    consumer = watermark_broker.connect()
    events: list[str] = []
    publisher.add_on_connection_blocked_callback(lambda connection, frame: events.append("blocked"))
    publisher.add_on_connection_unblocked_callback(lambda connection, frame: events.append("unblocked"))
    big, small = names("big"), names("small")
    setup = consumer.channel()
    setup.queue_declare(big)
    setup.queue_declare(small)

    channel = publisher.channel()
    for _ in range(2):  # 2 x BIG_BODY crosses the watermark with the second message
        channel.basic_publish("", big, b"b" * BIG_BODY)
    pump_until([publisher], lambda: events, 10, "connection.blocked")
    assert events == ["blocked"]

    for index in range(5):
        channel.basic_publish("", small, f"while blocked {index}".encode())
    pump([publisher], 0.5)
    # RabbitMQ takes in at most the publish that finds the connection blocked.
    assert ready_count(setup, small) <= 1, "publishes were taken in while the connection was blocked"

    wait_until(lambda: ready_count(setup, big) == 2, 5, "both big messages queued")
    setup.queue_purge(big)  # memory drops below the watermark
    pump_until([publisher], lambda: len(events) == 2, 10, "connection.unblocked")
    assert events == ["blocked", "unblocked"]
    wait_until(lambda: ready_count(setup, small) == 5, 10, "the publishes sent while blocked")
    channel.confirm_delivery()
    channel.basic_publish("", small, b"after")
    assert ready_count(setup, small) == 6


def test_only_publishing_connections_are_blocked(watermark_broker: Broker, names: Names) -> None:
    """RabbitMQ sends connection.blocked only to a connection that publishes while the alarm is
    on; a connection that only consumes is neither told nor held up, and drains the queue."""
    publisher = watermark_broker.connect()
    consumer = watermark_broker.connect()
    events: list[tuple[str, str]] = []
    for label, connection in (("publisher", publisher), ("consumer", consumer)):
        connection.add_on_connection_blocked_callback(
            lambda c, f, label=label: events.append((label, "blocked"))
        )
        connection.add_on_connection_unblocked_callback(
            lambda c, f, label=label: events.append((label, "unblocked"))
        )
    queue = names()
    draining = consumer.channel()
    draining.queue_declare(queue)
    channel = publisher.channel()
    for _ in range(2):
        channel.basic_publish("", queue, b"b" * BIG_BODY)
    pump_until(
        [publisher, consumer],
        lambda: ("publisher", "blocked") in events,
        10,
        "connection.blocked",
    )
    received: list[bytes] = []
    draining.basic_consume(queue, lambda ch, m, p, body: received.append(body), auto_ack=True)
    pump_until(
        [publisher, consumer],
        lambda: ("publisher", "unblocked") in events,
        10,
        "connection.unblocked",
    )
    pump_until([consumer], lambda: len(received) == 2, 10, "both messages at the consumer")
    assert [event for event in events if event[0] == "consumer"] == []
