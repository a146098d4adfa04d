"""pika's asynchronous adapters against Shoal: SelectConnection and AsyncioConnection.

The blocking adapter is covered by test_delivery.py / test_publishing.py; here every call is
made the callback way, driven by `AsyncDriver` (async_driver.py), which runs the adapter's own
ioloop until a condition holds (bounded) and fails the test if a channel or the connection is
closed under it.

Covered: publish / consume / ack, basic.qos (prefetch honoured), publisher confirms, mandatory
returns, consumer cancel (client- and broker-initiated), and the reconnect pattern pika documents
for its async adapters (on_close_callback schedules a new connection): the worker the client is
connected to is SIGKILLed, the client reconnects, its unacked message comes back redelivered.
Also the issue-4 features pika users meet: exchange-to-exchange bindings, x-message-ttl with
dead-lettering (the x-death header), transactions, direct reply-to, connection.blocked.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from pika.adapters.asyncio_connection import AsyncioConnection

from tests.integration.async_driver import AsyncDriver
from tests.integration.harness import Broker, finish, start_broker
from tests.integration.rawclient import unique_name

ADAPTERS = ["select", "asyncio"]


@pytest.fixture(params=ADAPTERS)
def driver(request: pytest.FixtureRequest, shared_broker: Broker) -> Iterator[AsyncDriver]:
    instance = AsyncDriver(shared_broker, request.param)
    yield instance
    instance.close()


def _confirmed(acks: list[tuple[int, bool]]) -> set[int]:
    """Delivery tags confirmed by a list of (delivery_tag, multiple) acks."""
    tags: set[int] = set()
    for tag, multiple in acks:
        tags |= set(range(1, tag + 1)) if multiple else {tag}
    return tags


def test_publish_consume_ack_with_qos_confirms_returns_and_cancel(driver: AsyncDriver) -> None:
    connection = driver.connect()
    channel = driver.channel(connection)
    queue = unique_name("pika-async")

    acks: list[tuple[int, bool]] = []
    nacks: list[int] = []

    def on_confirm(frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Ack):
            acks.append((method.delivery_tag, method.multiple))
        else:
            nacks.append(method.delivery_tag)

    selected: list[Any] = []
    channel.confirm_delivery(ack_nack_callback=on_confirm, callback=selected.append)
    driver.run_until(lambda: selected, what="confirm.select-ok")
    returned: list[tuple[Any, bytes]] = []
    channel.add_on_return_callback(lambda ch, method, props, body: returned.append((method, body)))

    declare_ok = driver.call(channel.queue_declare, queue, auto_delete=False)
    assert declare_ok.method.queue == queue
    driver.call(channel.basic_qos, prefetch_count=2)

    # Confirms: five publishes, five acks (multiple or not), no nack.
    for i in range(5):
        channel.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(message_id=str(i)))
    driver.run_until(lambda: _confirmed(acks) >= {1, 2, 3, 4, 5}, what="five publisher acks")

    # Returns: mandatory and unroutable comes back 312 NO_ROUTE, and is still confirmed.
    channel.basic_publish("amq.direct", queue + ".nowhere", b"lost", mandatory=True)
    driver.run_until(lambda: returned and 6 in _confirmed(acks), what="basic.return and its ack")
    method, body = returned[0]
    assert (method.reply_code, method.reply_text, body) == (312, "NO_ROUTE", b"lost")
    assert nacks == []

    # Consume with prefetch 2: only two unacked at a time.
    received: list[tuple[Any, Any, bytes]] = []
    acked = [0]
    outstanding: list[int] = []  # unacked deliveries, seen at each delivery

    def on_message(ch: Any, method: Any, properties: Any, body: bytes) -> None:
        received.append((method, properties, body))
        outstanding.append(len(received) - acked[0])

    tag = driver.call(channel.basic_consume, queue, on_message).method.consumer_tag
    driver.run_until(lambda: len(received) >= 2, what="the first two deliveries")
    driver.pump(0.3)
    assert len(received) == 2, "basic.qos prefetch_count=2 was not honoured"
    while len(received) < 5:
        seen = acked[0] = len(received)
        channel.basic_ack(received[-1][0].delivery_tag, multiple=True)
        driver.run_until(lambda seen=seen: len(received) > seen, what="the next delivery after an ack")
    channel.basic_ack(received[-1][0].delivery_tag, multiple=True)
    assert max(outstanding) == 2, f"more than prefetch_count unacked at once: {outstanding}"
    assert [b for _, _, b in received] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert [p.message_id for _, p, _ in received] == ["0", "1", "2", "3", "4"]
    assert not any(m.redelivered for m, _, _ in received)

    # Client cancel: cancel-ok, then nothing more is delivered.
    cancel_ok = driver.call(channel.basic_cancel, tag)
    assert cancel_ok.method.consumer_tag == tag
    channel.basic_publish("", queue, b"after cancel")
    driver.run_until(lambda: 7 in _confirmed(acks), what="ack of the publish after cancel")
    driver.pump(0.2)
    assert len(received) == 5
    assert driver.call(channel.queue_declare, queue, passive=True).method.message_count == 1

    # Broker cancel: deleting the queue cancels its consumer (consumer_cancel_notify).
    cancelled: list[Any] = []
    channel.add_on_cancel_callback(cancelled.append)
    second = driver.call(channel.basic_consume, queue, lambda *a: None).method.consumer_tag
    admin = driver.channel(connection)
    driver.call(admin.queue_delete, queue)
    driver.run_until(lambda: cancelled, what="basic.cancel from the broker")
    assert cancelled[0].method.consumer_tag == second
    assert channel.is_open and connection.is_open


def test_basic_get_nack_requeue_and_reject(driver: AsyncDriver) -> None:
    connection = driver.connect()
    channel = driver.channel(connection)
    queue = driver.call(channel.queue_declare, "", exclusive=True).method.queue
    for body in (b"one", b"two"):
        channel.basic_publish("", queue, body)
    got: list[Any] = []
    channel.basic_get(queue, lambda ch, m, p, b: got.append((m, b)), auto_ack=False)
    driver.run_until(lambda: got, what="basic.get-ok")
    method, body = got.pop()
    assert (body, method.redelivered, method.message_count) == (b"one", False, 1)
    channel.basic_nack(method.delivery_tag, requeue=True)
    channel.basic_get(queue, lambda ch, m, p, b: got.append((m, b)), auto_ack=False)
    driver.run_until(lambda: got, what="basic.get-ok after nack")
    method, body = got.pop()
    assert (body, method.redelivered) == (b"one", True), "nack(requeue) must put it back at the head"
    channel.basic_reject(method.delivery_tag, requeue=False)
    channel.basic_get(queue, lambda ch, m, p, b: got.append((m, b)), auto_ack=True)
    driver.run_until(lambda: got, what="basic.get-ok for the second message")
    assert got.pop()[1] == b"two"
    assert driver.call(channel.queue_declare, queue, passive=True).method.message_count == 0


def test_channel_error_then_the_connection_carries_on(driver: AsyncDriver) -> None:
    """A soft error (404 on a passive declare) closes only that channel, as pika expects."""
    connection = driver.connect()
    doomed = driver.channel(connection, expect_close=True)
    closed: list[Exception] = []
    doomed.add_on_close_callback(lambda ch, reason: closed.append(reason))
    doomed.queue_declare(unique_name("absent"), passive=True)
    driver.run_until(lambda: closed, what="channel.close 404")
    assert isinstance(closed[0], pika.exceptions.ChannelClosedByBroker)
    assert closed[0].reply_code == 404
    healthy = driver.channel(connection)
    assert driver.call(healthy.queue_declare, "", exclusive=True).method.queue


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_reconnects_after_its_worker_is_killed(broker: Broker, adapter: str) -> None:
    """pika's async adapters have no automatic recovery; the pattern pika documents is to
    reconnect from on_close_callback. SIGKILL the worker the consumer is on: the client sees the
    connection drop, reconnects (landing on whichever worker accepts), consumes again, and the
    message it had not acked comes back with redelivered set."""
    driver = AsyncDriver(broker, adapter)
    queue = unique_name("pika-recover")
    state: dict[str, Any] = {"connection": None, "reconnects": 0, "stopping": False, "losses": []}
    received: list[tuple[bytes, bool, int]] = []  # body, redelivered, generation

    def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
        received.append((body, method.redelivered, state["reconnects"]))
        if body != b"held":
            channel.basic_ack(method.delivery_tag)

    def on_channel(channel: Any) -> None:
        state["channel"] = channel
        channel.basic_qos(prefetch_count=10)
        channel.queue_declare(queue, durable=False, auto_delete=False,
                              callback=lambda _: channel.basic_consume(queue, on_message))

    def on_open(connection: Any) -> None:
        state["connection"] = connection
        connection.channel(on_open_callback=on_channel)

    def on_close(connection: Any, reason: Exception) -> None:
        if state["stopping"]:
            return
        state["losses"].append(reason)
        driver.loop.call_later(0.2, reconnect)

    def on_open_error(connection: Any, error: Exception) -> None:
        driver.loop.call_later(0.2, reconnect)

    def reconnect() -> None:
        state["reconnects"] += 1
        connect()

    def connect() -> None:
        cls = pika.SelectConnection if adapter == "select" else AsyncioConnection
        driver.connections.append(cls(
            driver.parameters(), on_open_callback=on_open, on_open_error_callback=on_open_error,
            on_close_callback=on_close, custom_ioloop=driver.loop,
        ))

    admin = broker.connect()
    try:
        connect()
        driver.run_until(lambda: state.get("channel") is not None and state["channel"].consumer_tags,
                         what="the consumer to start")
        publisher = admin.channel()
        publisher.confirm_delivery()
        publisher.basic_publish("", queue, b"held")
        driver.run_until(lambda: received, what="the first delivery")
        assert received == [(b"held", False, 0)]

        index = int(state["connection"].server_properties["shoal_worker"])
        victim = broker.worker_pids[index]
        os.kill(victim, signal.SIGKILL)
        driver.run_until(lambda: state["losses"], what="the client to notice its worker died")
        assert isinstance(state["losses"][0], (pika.exceptions.StreamLostError, pika.exceptions.AMQPConnectionError))
        broker.wait_for_worker_replaced(index, victim)
        driver.run_until(lambda: len(received) >= 2, timeout=20, what="the held message to be redelivered")
        assert received[1][:2] == (b"held", True), received
        assert state["reconnects"] >= 1

        publisher = broker.connect().channel()  # the admin may have been on the killed worker
        publisher.confirm_delivery()
        publisher.basic_publish("", queue, b"after recovery")
        driver.run_until(lambda: any(b == b"after recovery" for b, _, _ in received),
                         what="a new message after recovery")
        state["channel"].basic_ack(0, multiple=True)
        driver.pump(0.2)
    finally:
        state["stopping"] = True
        driver.failures.clear()
        driver.close()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        broker.connect().channel().queue_declare(queue + ".absent", passive=True)
    check = broker.connect().channel()
    assert check.queue_declare(queue, passive=True).method.message_count == 0
    check.queue_delete(queue)


# --------------------------------------------------------------------------- issue-4 features


def _depth_within(driver: AsyncDriver, channel: Any, queue: str, wanted: int, seconds: float) -> int:
    """Poll the queue's depth until it is `wanted` or `seconds` pass; return the last depth."""
    limit = time.monotonic() + seconds
    while True:
        depth = driver.call(channel.queue_declare, queue, passive=True).method.message_count
        if depth == wanted or time.monotonic() >= limit:
            return depth
        driver.pump(0.05)


def test_exchange_to_exchange_binding(driver: AsyncDriver) -> None:
    connection = driver.connect()
    channel = driver.channel(connection)
    source, destination = unique_name("src"), unique_name("dst")
    driver.call(channel.exchange_declare, source, "fanout", auto_delete=True)
    driver.call(channel.exchange_declare, destination, "fanout", auto_delete=True)
    queue = driver.call(channel.queue_declare, "", exclusive=True).method.queue
    driver.call(channel.queue_bind, queue, destination)
    driver.call(channel.exchange_bind, destination, source)
    channel.basic_publish(source, "", b"via two exchanges")
    assert _depth_within(driver, channel, queue, 1, 2.0) == 1


def test_message_ttl_dead_letters(driver: AsyncDriver) -> None:
    connection = driver.connect()
    channel = driver.channel(connection)
    dead = driver.call(channel.queue_declare, "", exclusive=True).method.queue
    source = driver.call(channel.queue_declare, "", exclusive=True, arguments={
        "x-message-ttl": 50, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead,
    }).method.queue
    channel.basic_publish("", source, b"expires")
    assert _depth_within(driver, channel, dead, 1, 2.0) == 1
    assert driver.call(channel.queue_declare, source, passive=True).method.message_count == 0
    got: list[tuple[Any, bytes]] = []
    channel.basic_get(dead, lambda ch, m, p, b: got.append((p, b)), auto_ack=True)
    driver.run_until(lambda: got, what="basic.get-ok of the dead-lettered message")
    properties, body = got[0]
    assert body == b"expires"
    death = properties.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("expired", source, 1)


def test_transactions(driver: AsyncDriver) -> None:
    """tx.select / rollback / commit: publishes (and acks) take effect only at commit."""
    connection = driver.connect()
    channel = driver.channel(connection)
    observer = driver.channel(connection)
    queue = driver.call(channel.queue_declare, "", exclusive=True).method.queue
    driver.call(channel.tx_select)
    channel.basic_publish("", queue, b"rolled back")
    driver.call(channel.tx_rollback)
    channel.basic_publish("", queue, b"committed")
    driver.pump(0.1)
    assert driver.call(observer.queue_declare, queue, passive=True).method.message_count == 0
    driver.call(channel.tx_commit)
    assert driver.call(observer.queue_declare, queue, passive=True).method.message_count == 1
    got: list[tuple[Any, bytes]] = []
    channel.basic_get(queue, lambda ch, m, p, b: got.append((m, b)), auto_ack=False)
    driver.run_until(lambda: got, what="basic.get-ok")
    method, body = got[0]
    assert body == b"committed"
    channel.basic_ack(method.delivery_tag)
    driver.call(channel.tx_rollback)  # the ack is undone: acking the tag again is no error (406)
    channel.basic_ack(method.delivery_tag)
    driver.call(channel.tx_commit)
    channel.close()  # an unacked message would be requeued now
    driver.run_until(lambda: channel.is_closed, what="channel.close-ok")
    assert driver.call(observer.queue_declare, queue, passive=True).method.message_count == 0


def test_direct_reply_to(driver: AsyncDriver) -> None:
    """RPC over amq.rabbitmq.reply-to: the reply comes back without a reply queue."""
    connection = driver.connect()
    client = driver.channel(connection)
    server_connection = driver.connect()
    server = driver.channel(server_connection)
    requests = driver.call(server.queue_declare, "", exclusive=True).method.queue
    replies: list[tuple[Any, bytes]] = []
    driver.call(client.basic_consume, "amq.rabbitmq.reply-to", lambda ch, m, p, b: replies.append((p, b)),
                auto_ack=True)
    seen_reply_to: list[str] = []

    def serve(ch: Any, method: Any, properties: Any, body: bytes) -> None:
        seen_reply_to.append(properties.reply_to)
        ch.basic_publish("", properties.reply_to, b"pong:" + body,
                         pika.BasicProperties(correlation_id=properties.correlation_id))

    driver.call(server.basic_consume, requests, serve, auto_ack=True)
    client.basic_publish("", requests, b"ping",
                         pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id="c1"))
    driver.run_until(lambda: replies, 5.0, "the direct reply")
    properties, body = replies[0]
    assert (body, properties.correlation_id) == (b"pong:ping", "c1")
    assert seen_reply_to[0].startswith("amq.rabbitmq.reply-to.")


def test_connection_blocked_and_unblocked(tmp_path: Path) -> None:
    """Past --memory-high-watermark (bytes of messages held) a publishing connection gets
    connection.blocked; when the queue is purged it gets connection.unblocked and publishing
    goes on. pika only registers for these when the broker advertises the capability."""
    watermark = 64 * 1024
    # The alarm itself: no paging before it (broker.storage.paging).
    broker = start_broker(tmp_path / "broker", extra_args=[
        "--memory-high-watermark", str(watermark), "--memory-paging-ratio", "0"])
    driver = AsyncDriver(broker, "select")
    try:
        connection = driver.connect()
        assert connection.server_properties["capabilities"]["connection.blocked"] is True
        events: list[str] = []
        connection.add_on_connection_blocked_callback(lambda conn, frame: events.append("blocked"))
        connection.add_on_connection_unblocked_callback(lambda conn, frame: events.append("unblocked"))
        channel = driver.channel(connection)
        queue = unique_name("blocked")
        driver.call(channel.queue_declare, queue, auto_delete=False)
        # One message more than the watermark holds: the block comes with the last message
        # or the one before, so what is still in flight after the purge (at most one) cannot
        # cross the watermark again and block the connection for good.
        for _ in range(watermark // 8192 + 1):
            channel.basic_publish("", queue, bytes(8192))
        driver.run_until(lambda: "blocked" in events, 10, "connection.blocked")
        admin = broker.connect().channel()  # never published: not blocked
        admin.queue_purge(queue)
        driver.run_until(lambda: "unblocked" in events, 10, "connection.unblocked")
        acks: list[Any] = []
        driver.call(channel.confirm_delivery, ack_nack_callback=acks.append)
        channel.basic_publish("", queue, b"after unblock")
        driver.run_until(lambda: acks, 10, "a confirm after unblocking")
        assert events == ["blocked", "unblocked"]
        admin.queue_delete(queue)
    finally:
        driver.failures.clear()
        driver.close()
        finish(broker)
