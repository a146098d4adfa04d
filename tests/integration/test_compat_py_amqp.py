"""py-amqp (the `amqp` package, kombu's and celery's transport) against Shoal.

Covered: publish / consume / ack, basic.get with reject (requeue and drop), basic.qos, publisher confirms
(py-amqp's `confirm_publish`: basic_publish waits for the broker's ack), mandatory returns
(the `basic_return` event), client- and broker-initiated consumer cancel, PLAIN and AMQPLAIN
login, heartbeats, exchange-to-exchange bindings, transactions, connection.blocked / unblocked
(on_blocked / on_unblocked), and connection loss: py-amqp has no automatic recovery of its own; its
contract (which kombu builds on) is that a lost connection raises one of
`Connection.recoverable_connection_errors`, after which the client connects again. The worker
the client is on is SIGKILLed and the new connection gets the unacked message back.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import amqp
import pytest

from tests.integration.harness import HOST, Broker, finish, start_broker, wait_until
from tests.integration.rawclient import unique_name


def _connect(broker: Broker, **options: Any) -> amqp.Connection:
    connection = amqp.Connection(
        host=f"{HOST}:{broker.port}", userid="guest", password="guest", virtual_host="/",
        connect_timeout=5, read_timeout=5, write_timeout=5, **options,
    )
    connection.connect()
    return connection


@pytest.fixture
def connect(shared_broker: Broker) -> Iterator[Callable[..., amqp.Connection]]:
    opened: list[amqp.Connection] = []

    def factory(broker: Broker = shared_broker, **options: Any) -> amqp.Connection:
        connection = _connect(broker, **options)
        opened.append(connection)
        return connection

    yield factory
    for connection in opened:
        try:
            connection.close()
        except Exception:  # noqa: BLE001 — best effort; the broker may be gone
            connection.collect()


def _drain_until(connection: amqp.Connection, predicate: Callable[[], object], timeout: float = 10.0,
                 what: str = "") -> None:
    limit = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= limit:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        try:
            connection.drain_events(timeout=0.05)
        except TimeoutError:
            pass


def _drain_for(connection: amqp.Connection, seconds: float) -> None:
    limit = time.monotonic() + seconds
    while time.monotonic() < limit:
        try:
            connection.drain_events(timeout=0.05)
        except TimeoutError:
            pass


def test_publish_consume_ack_with_qos_confirms_and_cancel(connect: Callable[..., amqp.Connection]) -> None:
    connection = connect(confirm_publish=True)
    assert connection.server_properties["capabilities"]["publisher_confirms"] is True
    channel = connection.channel()
    queue = unique_name("py-amqp")
    declared = channel.queue_declare(queue, durable=False, auto_delete=False)
    assert (declared.queue, declared.message_count, declared.consumer_count) == (queue, 0, 0)

    for i in range(6):  # confirm_publish: each call returns only once the broker acked it
        channel.basic_publish(amqp.Message(f"m{i}", content_type="text/plain", message_id=str(i)),
                              exchange="", routing_key=queue)
    assert channel.queue_declare(queue, passive=True).message_count == 6

    channel.basic_qos(prefetch_size=0, prefetch_count=3, a_global=False)
    received: list[amqp.Message] = []
    tag = channel.basic_consume(queue, callback=received.append, no_ack=False)
    _drain_until(connection, lambda: len(received) >= 3, what="three deliveries")
    _drain_for(connection, 0.3)
    assert len(received) == 3, "basic.qos prefetch_count=3 was not honoured"
    channel.basic_ack(received[2].delivery_tag, multiple=True)
    _drain_until(connection, lambda: len(received) >= 6, what="the other three")
    for message in received[3:]:
        channel.basic_ack(message.delivery_tag)
    assert [m.body for m in received] == [f"m{i}" for i in range(6)]
    assert [m.properties["message_id"] for m in received] == [str(i) for i in range(6)]
    assert received[0].properties["content_type"] == "text/plain"
    assert received[0].delivery_info["routing_key"] == queue

    assert channel.basic_cancel(tag) == tag
    channel.basic_publish(amqp.Message("after cancel"), exchange="", routing_key=queue)
    _drain_for(connection, 0.2)
    assert len(received) == 6
    got = channel.basic_get(queue, no_ack=True)
    assert got is not None and got.body == "after cancel"


def test_mandatory_return_is_the_basic_return_event(connect: Callable[..., amqp.Connection]) -> None:
    connection = connect(confirm_publish=True)
    channel = connection.channel()
    returned: list[tuple[Any, str, str, amqp.Message]] = []
    channel.events["basic_return"].add(
        lambda exc, exchange, key, message: returned.append((exc, exchange, key, message)))
    key = unique_name("nowhere")
    channel.basic_publish(amqp.Message("lost"), exchange="amq.direct", routing_key=key, mandatory=True)
    _drain_until(connection, lambda: returned, what="basic.return")
    exc, exchange, routing_key, message = returned[0]
    assert (exc.reply_code, exchange, routing_key, message.body) == (312, "amq.direct", key, "lost")


def test_confirms_by_hand(connect: Callable[..., amqp.Connection]) -> None:
    """confirm_select without confirm_publish: the acks arrive as `basic_ack` events."""
    connection = connect()
    channel = connection.channel()
    acks: list[tuple[int, bool]] = []
    channel.events["basic_ack"].add(lambda tag, multiple: acks.append((tag, multiple)))
    channel.confirm_select()
    queue = channel.queue_declare("", exclusive=True).queue
    for i in range(10):
        channel.basic_publish(amqp.Message(f"c{i}"), exchange="", routing_key=queue)

    def confirmed() -> set[int]:
        tags: set[int] = set()
        for tag, multiple in acks:
            tags |= set(range(1, tag + 1)) if multiple else {tag}
        return tags

    _drain_until(connection, lambda: confirmed() >= set(range(1, 11)), what="ten publisher acks")


def test_get_and_reject(connect: Callable[..., amqp.Connection]) -> None:
    connection = connect()
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).queue
    for body in ("a", "b", "c"):
        channel.basic_publish(amqp.Message(body), exchange="", routing_key=queue)
    first = channel.basic_get(queue)
    assert first is not None and first.body == "a" and first.delivery_info["message_count"] == 2
    channel.basic_reject(first.delivery_tag, requeue=True)
    again = channel.basic_get(queue)
    assert again.body == "a" and again.delivery_info["redelivered"] is True
    channel.basic_reject(again.delivery_tag, requeue=False)  # py-amqp has no basic_nack
    rest = [channel.basic_get(queue, no_ack=True).body for _ in range(2)]
    assert rest == ["b", "c"]
    assert channel.basic_get(queue) is None


def test_broker_cancel_calls_on_cancel(connect: Callable[..., amqp.Connection]) -> None:
    connection = connect()
    assert connection.server_properties["capabilities"]["consumer_cancel_notify"] is True
    channel = connection.channel()
    queue = channel.queue_declare(unique_name("doomed"), auto_delete=False).queue
    cancelled: list[str] = []
    tag = channel.basic_consume(queue, callback=lambda m: None, on_cancel=cancelled.append)
    other = connect().channel()
    other.queue_delete(queue)
    _drain_until(connection, lambda: cancelled, what="basic.cancel from the broker")
    assert cancelled == [tag]


def test_amqplain_login_and_heartbeats(connect: Callable[..., amqp.Connection]) -> None:
    """py-amqp negotiates a 2 s heartbeat; with heartbeat_tick called, 5 s pass quietly."""
    connection = connect(login_method="AMQPLAIN", heartbeat=2)
    assert connection.heartbeat == 2
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).queue
    limit = time.monotonic() + 5
    while time.monotonic() < limit:
        connection.heartbeat_tick()
        _drain_for(connection, 0.25)
    channel.basic_publish(amqp.Message("still here"), exchange="", routing_key=queue)
    assert channel.basic_get(queue, no_ack=True).body == "still here"


def test_bad_login_is_access_refused(shared_broker: Broker) -> None:
    connection = amqp.Connection(host=f"{HOST}:{shared_broker.port}", userid="guest", password="nope",
                                 connect_timeout=5)
    with pytest.raises(amqp.exceptions.AccessRefused):
        connection.connect()
    connection.collect()


def test_lost_connection_is_recoverable_and_reconnect_gets_the_unacked_message(
    broker: Broker, connect: Callable[..., amqp.Connection]
) -> None:
    queue = unique_name("py-amqp-recover")
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(queue, auto_delete=False)
    channel.basic_publish(amqp.Message("held"), exchange="", routing_key=queue)
    received: list[amqp.Message] = []
    channel.basic_consume(queue, callback=received.append)
    _drain_until(connection, lambda: received, what="the first delivery")

    index = int(connection.server_properties["shoal_worker"])
    victim = broker.worker_pids[index]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(connection.recoverable_connection_errors):
        _drain_until(connection, lambda: False, timeout=10, what="the connection loss")
    connection.collect()
    broker.wait_for_worker_replaced(index, victim)

    again = connect(broker)
    channel = again.channel()
    message = channel.basic_get(queue)
    assert message is not None and message.body == "held"
    assert message.delivery_info["redelivered"] is True
    channel.basic_ack(message.delivery_tag)
    channel.queue_delete(queue)


def test_exchange_to_exchange_binding(connect: Callable[..., amqp.Connection]) -> None:
    channel = connect().channel()
    source, destination = unique_name("src"), unique_name("dst")
    channel.exchange_declare(source, "topic", auto_delete=False)  # auto-delete would go with the unbind
    channel.exchange_declare(destination, "direct", auto_delete=True)
    queue = channel.queue_declare("", exclusive=True).queue
    channel.queue_bind(queue, destination, routing_key="k")
    channel.exchange_bind(destination, source, routing_key="#")
    channel.basic_publish(amqp.Message("through"), exchange=source, routing_key="k")
    got = wait_until(lambda: channel.basic_get(queue, no_ack=True), 5, "the message through the binding")
    assert got.body == "through"
    channel.exchange_unbind(destination, source, routing_key="#")
    channel.basic_publish(amqp.Message("not any more"), exchange=source, routing_key="k")
    time.sleep(0.2)
    assert channel.basic_get(queue, no_ack=True) is None
    channel.exchange_delete(source)


def test_transactions(connect: Callable[..., amqp.Connection]) -> None:
    channel = connect().channel()
    queue = channel.queue_declare("", exclusive=True).queue
    channel.tx_select()
    channel.basic_publish(amqp.Message("rolled back"), exchange="", routing_key=queue)
    channel.tx_rollback()
    channel.basic_publish(amqp.Message("committed"), exchange="", routing_key=queue)
    channel.tx_commit()
    assert channel.basic_get(queue, no_ack=True).body == "committed"
    assert channel.basic_get(queue) is None


def test_connection_blocked_and_unblocked_callbacks(tmp_path: Path) -> None:
    """py-amqp (and so kombu and celery) takes connection.blocked / unblocked through the
    on_blocked / on_unblocked callbacks; Shoal sends them around --memory-high-watermark."""
    watermark = 64 * 1024
    # The alarm itself: no paging before it (broker.storage.paging).
    broker = start_broker(tmp_path / "broker", extra_args=[
        "--memory-high-watermark", str(watermark), "--memory-paging-ratio", "0"])
    events: list[str] = []
    connection = None
    try:
        connection = _connect(broker, on_blocked=lambda reason: events.append("blocked"),
                              on_unblocked=lambda: events.append("unblocked"))
        channel = connection.channel()
        queue = channel.queue_declare(unique_name("blocked"), auto_delete=False).queue
        # One message more than the watermark holds: the block comes with the last message
        # or the one before, so what is still in flight after the purge (at most one) cannot
        # cross the watermark again and block the connection for good.
        for _ in range(watermark // 8192 + 1):
            channel.basic_publish(amqp.Message(bytes(8192)), exchange="", routing_key=queue)
        _drain_until(connection, lambda: "blocked" in events, what="connection.blocked")
        other = _connect(broker)  # has not published: not blocked
        other.channel().queue_purge(queue)
        _drain_until(connection, lambda: "unblocked" in events, what="connection.unblocked")
        other.channel().queue_delete(queue)
        other.close()
        assert events == ["blocked", "unblocked"]
    finally:
        if connection is not None:
            connection.collect()
        finish(broker)
