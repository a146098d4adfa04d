"""Delivery to consumers and basic.get, driven through real worker processes with pika."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import pika
import pika.spec
import pytest

from tests.integration.harness import Broker, wait_until, worker_of
from tests.integration.pika_helpers import Names, drain_with_get, pump, pump_until, ready_count

OnMessage = Callable[[object, pika.spec.Basic.Deliver, pika.spec.BasicProperties, bytes], None]


def _confirming_channel(connection: pika.BlockingConnection, queue: str):
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue)
    return channel


def _publish(channel, queue: str, bodies: list[bytes]) -> None:
    for body in bodies:
        channel.basic_publish("", queue, body)


def _bodies(count: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i:05d}".encode() for i in range(count)]


@pytest.mark.deadline(300)
def test_competing_consumers_share_10000_messages_exactly_once(shared_broker: Broker, names: Names) -> None:
    """Consumers on different worker processes competing for one queue receive each of 10,000 messages exactly once."""
    total = 10_000
    queue = names("work")
    consumer_connections = shared_broker.connections_on_distinct_workers(2)
    control = consumer_connections[0].channel()
    control.queue_declare(queue)

    received: dict[tuple[int, int], list[bytes]] = {}
    redelivered: list[bytes] = []

    def collector(bucket: list[bytes]) -> OnMessage:
        def on_message(channel, method, properties, body):
            bucket.append(body)
            if method.redelivered:
                redelivered.append(body)
            channel.basic_ack(method.delivery_tag)

        return on_message

    for connection in consumer_connections:
        for k in range(2):
            channel = connection.channel()
            channel.basic_qos(prefetch_count=50)
            bucket = received[(worker_of(connection), k)] = []
            channel.basic_consume(queue, on_message_callback=collector(bucket))

    expected = _bodies(total, "work-")
    publisher = shared_broker.connect().channel()
    for i, body in enumerate(expected):
        publisher.basic_publish("", queue, body)
        if i % 500 == 499:
            pump(consumer_connections, 0)

    def delivered() -> int:
        return sum(len(bucket) for bucket in received.values())

    pump_until(consumer_connections, lambda: delivered() >= total, 240, f"{total} deliveries")
    pump(consumer_connections, 0.5)  # a duplicate would arrive in this window

    everything = [body for bucket in received.values() for body in bucket]
    assert len(everything) == total, f"{len(everything)} deliveries for {total} messages"
    assert sorted(everything) == expected
    assert redelivered == []
    assert ready_count(control, queue) == 0
    for key, bucket in received.items():
        assert bucket == sorted(bucket), f"consumer {key} got messages out of queue order"
    per_worker: defaultdict[int, int] = defaultdict(int)
    for (worker, _), bucket in received.items():
        per_worker[worker] += len(bucket)
    assert len(per_worker) == 2 and all(per_worker.values()), f"deliveries per worker: {dict(per_worker)}"
    assert sum(1 for bucket in received.values() if bucket) >= 2


def test_prefetch_limits_unacked_messages(shared_broker: Broker, names: Names) -> None:
    """basic.qos prefetch-count 5: a consumer holds at most 5 unacknowledged messages; acking frees credit."""
    queue = names()
    connection = shared_broker.connect()
    _publish(_confirming_channel(connection, queue), queue, _bodies(20))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=5)
    deliveries: list[tuple[int, bytes]] = []
    acking = {"on": False}
    unacked = {"now": 0, "max": 0}

    def on_message(ch, method, properties, body):
        deliveries.append((method.delivery_tag, body))
        unacked["now"] += 1
        unacked["max"] = max(unacked["max"], unacked["now"])
        if acking["on"]:
            ch.basic_ack(method.delivery_tag)
            unacked["now"] -= 1

    channel.basic_consume(queue, on_message_callback=on_message)
    pump_until([connection], lambda: len(deliveries) >= 5, what="5 deliveries")
    pump([connection], 0.5)
    assert len(deliveries) == 5
    assert ready_count(connection.channel(), queue) == 15

    channel.basic_ack(deliveries[0][0])
    unacked["now"] -= 1
    pump_until([connection], lambda: len(deliveries) >= 6, what="a 6th delivery after one ack")
    pump([connection], 0.5)
    assert len(deliveries) == 6

    acking["on"] = True
    channel.basic_ack(deliveries[-1][0], multiple=True)
    unacked["now"] = 0
    pump_until([connection], lambda: len(deliveries) >= 20, what="all 20 deliveries")
    assert [body for _, body in deliveries] == _bodies(20)
    assert unacked["max"] <= 5
    assert ready_count(connection.channel(), queue) == 0


def test_global_qos_is_per_channel(shared_broker: Broker, names: Names) -> None:
    """basic.qos global=true limits the unacked messages of all consumers on that channel together, and no
    other channel; global=false limits each consumer."""
    queues = {label: names(label) for label in ("shared1", "shared2", "free", "each1", "each2")}
    connection = shared_broker.connect()
    for queue in queues.values():
        _publish(_confirming_channel(connection, queue), queue, _bodies(10))
    got: dict[str, list[int]] = defaultdict(list)

    def record(label: str) -> OnMessage:
        return lambda ch, method, properties, body: got[label].append(method.delivery_tag)

    shared = connection.channel()
    shared.basic_qos(prefetch_count=3, global_qos=True)
    shared.basic_consume(queues["shared1"], on_message_callback=record("shared1"))
    shared.basic_consume(queues["shared2"], on_message_callback=record("shared2"))
    free = connection.channel()
    free.basic_consume(queues["free"], on_message_callback=record("free"))
    each = connection.channel()
    each.basic_qos(prefetch_count=2, global_qos=False)
    each.basic_consume(queues["each1"], on_message_callback=record("each1"))
    each.basic_consume(queues["each2"], on_message_callback=record("each2"))

    def on_shared() -> int:
        return len(got["shared1"]) + len(got["shared2"])

    pump_until(
        [connection],
        lambda: (
            on_shared() >= 3 and len(got["free"]) >= 10 and len(got["each1"]) >= 2 and len(got["each2"]) >= 2
        ),
        what="every consumer to fill its credit",
    )
    pump([connection], 0.5)
    counts = {label: len(tags) for label, tags in got.items()}
    assert on_shared() == 3, counts
    assert (counts["free"], counts["each1"], counts["each2"]) == (10, 2, 2), counts

    first = (got["shared1"] or got["shared2"])[0]
    shared.basic_ack(first)
    pump_until([connection], lambda: on_shared() >= 4, what="one more delivery on the shared channel")
    pump([connection], 0.5)
    assert on_shared() == 4


def test_higher_priority_consumer_gets_messages_while_it_has_credit(
    shared_broker: Broker, names: Names
) -> None:
    """A consumer with a higher x-priority gets every message while it has credit; lower priorities get
    messages only when it has none."""
    queue = names()
    connection = shared_broker.connect()
    publisher = _confirming_channel(connection, queue)
    deliveries: list[tuple[str, int]] = []

    def record(label: str) -> OnMessage:
        return lambda ch, method, properties, body: deliveries.append((label, method.delivery_tag))

    low = connection.channel()
    low.basic_qos(prefetch_count=100)
    # "low" subscribes first, so subscription order cannot be what favours "high".
    low.basic_consume(queue, on_message_callback=record("low"))
    high = connection.channel()
    high.basic_qos(prefetch_count=3)
    high.basic_consume(queue, on_message_callback=record("high"), arguments={"x-priority": 10})

    def send_one() -> str:
        before = len(deliveries)
        publisher.basic_publish("", queue, f"m{before}".encode())
        pump_until([connection], lambda: len(deliveries) > before, what="the delivery")
        return deliveries[-1][0]

    recipients = [send_one() for _ in range(6)]
    assert recipients == ["high"] * 3 + ["low"] * 3

    high.basic_ack(deliveries[0][1])
    high.basic_qos(prefetch_count=3)  # a round trip on the same channel, after the ack
    assert send_one() == "high"
    pump([connection], 0.3)
    assert len(deliveries) == 7


def test_closing_connection_requeues_unacked_with_redelivered_set(
    shared_broker: Broker, names: Names
) -> None:
    """Closing a connection returns its unacknowledged messages to their original queue positions, marked
    redelivered."""
    queue = names()
    consumer_connection, other = shared_broker.connections_on_distinct_workers(2)
    control = _confirming_channel(other, queue)
    _publish(control, queue, _bodies(5))
    channel = consumer_connection.channel()
    channel.basic_qos(prefetch_count=3)
    held: list[bytes] = []
    channel.basic_consume(queue, on_message_callback=lambda ch, m, p, body: held.append(body))
    pump_until([consumer_connection], lambda: len(held) >= 3, what="3 deliveries")
    pump([consumer_connection], 0.3)
    assert held == _bodies(3)

    consumer_connection.close()
    wait_until(lambda: ready_count(control, queue) == 5, 10, "the 3 unacked messages to be requeued")
    expected = [(body, i < 3) for i, body in enumerate(_bodies(5))]
    assert drain_with_get(control, queue, 5) == expected


def test_basic_get_and_get_empty(shared_broker: Broker, names: Names) -> None:
    """basic.get returns the head message with its properties and the remaining count, and get-empty on an
    empty queue."""
    queue = names()
    channel = _confirming_channel(shared_broker.connect(), queue)
    assert channel.basic_get(queue) == (None, None, None)

    properties = pika.BasicProperties(
        content_type="text/plain", correlation_id="c-1", delivery_mode=2, headers={"k": "v", "n": 7}
    )
    channel.basic_publish("", queue, b"first", properties=properties)
    channel.basic_publish("", queue, b"second")

    method, got_properties, body = channel.basic_get(queue)
    assert (body, method.message_count, method.redelivered) == (b"first", 1, False)
    assert (got_properties.content_type, got_properties.correlation_id) == ("text/plain", "c-1")
    assert (got_properties.delivery_mode, got_properties.headers) == (2, {"k": "v", "n": 7})
    channel.basic_ack(method.delivery_tag)

    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert (body, method.message_count) == (b"second", 0)
    assert channel.basic_get(queue) == (None, None, None)
    assert ready_count(channel, queue) == 0


def test_nack_requeue_returns_message_to_front_redelivered(shared_broker: Broker, names: Names) -> None:
    """basic.nack with requeue puts the message back at its original (head) position with redelivered set."""
    queue = names()
    channel = _confirming_channel(shared_broker.connect(), queue)
    _publish(channel, queue, [b"a", b"b", b"c"])
    method, _, body = channel.basic_get(queue)
    assert body == b"a"
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert drain_with_get(channel, queue, 3) == [(b"a", True), (b"b", False), (b"c", False)]


def test_reject_without_requeue_drops(shared_broker: Broker, names: Names) -> None:
    """basic.reject with requeue=false discards the message."""
    queue = names()
    channel = _confirming_channel(shared_broker.connect(), queue)
    _publish(channel, queue, [b"a", b"b"])
    method, _, body = channel.basic_get(queue)
    assert body == b"a"
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert drain_with_get(channel, queue, 2) == [(b"b", False)]
    channel.close()
    assert ready_count(shared_broker.connect().channel(), queue) == 0


def test_recover_redelivers(shared_broker: Broker, names: Names) -> None:
    """basic.recover requeue=true redelivers every unacknowledged message of the channel, marked redelivered."""
    queue = names()
    connection = shared_broker.connect()
    _publish(_confirming_channel(connection, queue), queue, _bodies(3))
    channel = connection.channel()
    deliveries: list[tuple[bytes, bool, int]] = []
    channel.basic_consume(
        queue,
        on_message_callback=lambda ch, m, p, body: deliveries.append((body, m.redelivered, m.delivery_tag)),
    )
    pump_until([connection], lambda: len(deliveries) >= 3, what="3 deliveries")
    channel.basic_recover(requeue=True)
    pump_until([connection], lambda: len(deliveries) >= 6, what="3 redeliveries")
    assert [(body, redelivered) for body, redelivered, _ in deliveries[:3]] == [
        (b, False) for b in _bodies(3)
    ]
    assert sorted(body for body, _, _ in deliveries[3:]) == _bodies(3)
    assert all(redelivered for _, redelivered, _ in deliveries[3:])

    channel.basic_ack(deliveries[-1][2], multiple=True)
    pump([connection], 0.3)
    assert len(deliveries) == 6
    channel.close()
    assert ready_count(connection.channel(), queue) == 0


def test_consumer_cancel(shared_broker: Broker, names: Names) -> None:
    """After basic.cancel a consumer gets no more messages, and its unacked messages can still be acked."""
    queue = names()
    connection = shared_broker.connect()
    publisher = _confirming_channel(connection, queue)
    _publish(publisher, queue, [b"a", b"b"])
    channel = connection.channel()
    got: list[int] = []
    tag = channel.basic_consume(queue, on_message_callback=lambda ch, m, p, body: got.append(m.delivery_tag))
    pump_until([connection], lambda: len(got) >= 2, what="2 deliveries")

    channel.basic_cancel(tag)
    _publish(publisher, queue, [b"c", b"d", b"e"])
    pump([connection], 0.3)
    assert len(got) == 2
    assert ready_count(publisher, queue) == 3

    channel.basic_ack(got[-1], multiple=True)
    channel.basic_qos(prefetch_count=0)  # round trip: a 406 for the ack would have closed the channel
    assert channel.is_open
    channel.close()
    assert ready_count(publisher, queue) == 3
