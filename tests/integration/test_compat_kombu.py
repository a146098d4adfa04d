"""kombu (over its default py-amqp transport) against Shoal.

Covered: a `SimpleQueue` round trip (and `SimpleBuffer`), Exchange / Queue / Producer / Consumer
with a topic binding, publish / consume / ack, basic.qos through `prefetch_count`, publisher
confirms (`transport_options={"confirm_publish": True}`), mandatory returns (`on_return`),
consumer cancel, and kombu's own connection recovery: `ensure_connection` / `Producer.publish(
retry=True)` after the publisher's worker is SIGKILLed, and a `ConsumerMixin` consumer that
reconnects by itself and gets its unacked message back.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.mixins import ConsumerMixin

from tests.integration.harness import Broker, wait_until
from tests.integration.rawclient import unique_name

RETRY_POLICY = {"max_retries": 20, "interval_start": 0.1, "interval_step": 0.2, "interval_max": 0.5}


@pytest.fixture
def connection_to(shared_broker: Broker) -> Iterator[Callable[..., Connection]]:
    opened: list[Connection] = []

    def factory(broker: Broker = shared_broker, **options: Any) -> Connection:
        options.setdefault("connect_timeout", 5)
        connection = Connection(broker.url, **options)
        connection.ensure_connection(max_retries=3)
        opened.append(connection)
        return connection

    yield factory
    for connection in opened:
        connection.release()


def _drain_until(connection: Connection, predicate: Callable[[], object], timeout: float = 10.0,
                 what: str = "") -> None:
    limit = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= limit:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        try:
            connection.drain_events(timeout=0.05)
        except TimeoutError:
            pass


def _worker_index(connection: Connection) -> int:
    return int(connection.connection.server_properties["shoal_worker"])


def test_simple_queue_round_trip(connection_to: Callable[..., Connection]) -> None:
    connection = connection_to()
    name = unique_name("kombu-simple")
    queue = connection.SimpleQueue(name)
    try:
        queue.put({"hello": "world", "n": 1}, serializer="json")
        queue.put("second", serializer="json", headers={"x-test": "yes"})
        assert queue.qsize() == 2
        first = queue.get(block=True, timeout=5)
        assert first.payload == {"hello": "world", "n": 1}
        assert first.content_type == "application/json"
        first.ack()
        second = queue.get(block=True, timeout=5)
        assert second.payload == "second" and second.headers["x-test"] == "yes"
        second.requeue()
        again = queue.get(block=True, timeout=5)
        assert again.payload == "second" and again.delivery_info["redelivered"] is True
        again.ack()
        with pytest.raises(queue.Empty):
            queue.get(block=True, timeout=0.3)
        assert queue.qsize() == 0
    finally:
        queue.close()  # cancels the consumer first: deleting its queue would cancel it from the broker
        queue.queue(connection.default_channel).delete()


def test_simple_buffer_is_no_ack(connection_to: Callable[..., Connection]) -> None:
    connection = connection_to()
    buffer = connection.SimpleBuffer(unique_name("kombu-buffer"))
    try:
        for i in range(3):
            buffer.put({"i": i})
        assert [buffer.get(timeout=5).payload["i"] for _ in range(3)] == [0, 1, 2]
    finally:
        buffer.close()


def test_producer_consumer_topic_with_qos_confirms_and_cancel(connection_to: Callable[..., Connection]) -> None:
    connection = connection_to(transport_options={"confirm_publish": True})
    exchange = Exchange(unique_name("kombu-topic"), type="topic", durable=False, auto_delete=True)
    queue = Queue(unique_name("kombu-q"), exchange=exchange, routing_key="orders.#", durable=False,
                  auto_delete=False)
    channel = connection.channel()
    queue(channel).declare()
    producer = Producer(channel, exchange=exchange, serializer="json")
    for i in range(6):  # confirm_publish: each publish returns once the broker acked it
        producer.publish({"order": i}, routing_key=f"orders.eu.{i}", retry=True, retry_policy=RETRY_POLICY)
    producer.publish({"order": "ignored"}, routing_key="invoices.eu")  # no binding matches
    assert queue(channel).queue_declare(passive=True).message_count == 6

    received: list[Any] = []
    consumer_channel = connection.channel()
    consumer = Consumer(consumer_channel, queues=[queue], prefetch_count=2, accept=["json"],
                        callbacks=[lambda body, message: received.append((body, message))])
    with consumer:
        _drain_until(connection, lambda: len(received) >= 2, what="two deliveries")
        limit = time.monotonic() + 0.3
        while time.monotonic() < limit:
            try:
                connection.drain_events(timeout=0.05)
            except TimeoutError:
                pass
        assert len(received) == 2, "prefetch_count=2 was not honoured"
        while len(received) < 6:
            seen = len(received)
            for _body, message in received:
                if not message.acknowledged:
                    message.ack()
            _drain_until(connection, lambda seen=seen: len(received) > seen, what="more deliveries")
        for _body, message in received:
            if not message.acknowledged:
                message.ack()
        assert [body["order"] for body, _ in received] == list(range(6))
        assert received[0][1].delivery_info["routing_key"] == "orders.eu.0"
    # Leaving the `with` cancelled the consumer: a new message stays on the queue.
    producer.publish({"order": "after cancel"}, routing_key="orders.late")
    assert queue(channel).queue_declare(passive=True).message_count == 1
    queue(channel).delete()


def test_mandatory_return_calls_on_return(connection_to: Callable[..., Connection]) -> None:
    connection = connection_to()
    returned: list[tuple[Any, str, str, Any]] = []
    channel = connection.channel()
    producer = Producer(channel, exchange=Exchange("amq.direct", type="direct", passive=True),
                        on_return=lambda exc, exchange, key, message: returned.append((exc, exchange, key, message)))
    key = unique_name("nowhere")
    producer.publish({"lost": True}, routing_key=key, mandatory=True, serializer="json", declare=[])
    _drain_until(connection, lambda: returned, what="basic.return")
    exc, exchange, routing_key, _message = returned[0]
    assert (exc.reply_code, exchange, routing_key) == (312, "amq.direct", key)


def test_publish_with_retry_survives_the_loss_of_its_worker(
    broker: Broker, connection_to: Callable[..., Connection]
) -> None:
    """kombu's recovery for producers: `ensure_connection` and `publish(retry=True)` reconnect
    after the worker behind the connection is SIGKILLed."""
    # With confirms, a publish into a connection whose worker just died fails (and is retried)
    # instead of vanishing into a half-closed socket.
    connection = connection_to(broker, transport_options={"confirm_publish": True})
    queue = Queue(unique_name("kombu-retry"), durable=False, auto_delete=False)
    producer = connection.Producer(serializer="json")
    producer.publish({"n": 1}, routing_key=queue.name, declare=[queue], retry=True, retry_policy=RETRY_POLICY)

    index = _worker_index(connection)
    victim = broker.worker_pids[index]
    os.kill(victim, signal.SIGKILL)
    broker.wait_for_worker_replaced(index, victim)
    publish = connection.ensure(producer, producer.publish, **RETRY_POLICY)
    publish({"n": 2}, routing_key=queue.name, declare=[queue])
    producer.publish({"n": 3}, routing_key=queue.name, declare=[queue], retry=True, retry_policy=RETRY_POLICY)

    simple = connection.SimpleQueue(queue)
    try:
        got = [simple.get(timeout=5) for _ in range(3)]
        assert sorted(m.payload["n"] for m in got) == [1, 2, 3]
        for message in got:
            message.ack()
    finally:
        simple.close()
        queue(connection.default_channel).delete()


class _Worker(ConsumerMixin):
    def __init__(self, connection: Connection, queue: Queue):
        self.connection = connection
        self.queue = queue
        self.received: list[tuple[Any, bool]] = []
        self.revived = 0
        self.errors: list[BaseException] = []
        self.active: Connection | None = None

    def get_consumers(self, consumer_cls: Any, channel: Any) -> list[Consumer]:
        return [consumer_cls(queues=[self.queue], callbacks=[self.on_message], prefetch_count=5,
                             accept=["json"])]

    def on_message(self, body: Any, message: Any) -> None:
        redelivered = bool(message.delivery_info["redelivered"])
        self.received.append((body, redelivered))
        if body != "held" or redelivered:
            message.ack()

    def on_consume_ready(self, connection: Connection, channel: Any, consumers: Any, **kwargs: Any) -> None:
        self.active = connection  # the mixin consumes on a clone of self.connection

    def on_connection_revived(self) -> None:
        self.revived += 1

    def on_connection_error(self, exc: BaseException, interval: float) -> None:
        self.errors.append(exc)


def test_consumer_mixin_reconnects_and_gets_its_unacked_message(
    broker: Broker, connection_to: Callable[..., Connection]
) -> None:
    """kombu's recovery for consumers: ConsumerMixin.run() catches the connection error,
    re-establishes the connection and consumes again; the message it held unacked when its
    worker was SIGKILLed is redelivered."""
    queue = Queue(unique_name("kombu-mixin"), durable=False, auto_delete=False)
    publisher = connection_to(broker)
    producer = publisher.Producer(serializer="json")
    producer.publish("held", routing_key=queue.name, declare=[queue], retry=True, retry_policy=RETRY_POLICY)

    consumer_connection = Connection(broker.url, connect_timeout=5)
    worker = _Worker(consumer_connection, queue)
    thread = threading.Thread(target=worker.run, kwargs={"_tokens": 1}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: worker.received, 10, "the first delivery")
        assert worker.received == [("held", False)]
        assert worker.active is not None
        index = _worker_index(worker.active)
        victim = broker.worker_pids[index]
        os.kill(victim, signal.SIGKILL)
        broker.wait_for_worker_replaced(index, victim)
        wait_until(lambda: len(worker.received) >= 2, 20, "the held message to come back")
        assert worker.received[1] == ("held", True)
        publisher = connection_to(broker)
        publisher.Producer(serializer="json").publish(
            "after recovery", routing_key=queue.name, retry=True, retry_policy=RETRY_POLICY)
        wait_until(lambda: ("after recovery", False) in worker.received, 10, "a message after recovery")
        assert worker.revived >= 2  # once at start, once after the loss
    finally:
        worker.should_stop = True
        thread.join(10)
        consumer_connection.release()
    assert not thread.is_alive(), "the ConsumerMixin thread did not stop"
    check = connection_to(broker).channel()
    assert queue(check).queue_declare(passive=True).message_count == 0
    queue(check).delete()


def test_prefetch_one_acked_from_another_thread_gets_the_next_message_at_once(
        connection_to: Callable[..., Connection]) -> None:
    """A kombu consumer with prefetch 1 that acks each message from a worker thread 0.1 s later
    (celery's threads do): after each ack the next message arrives while the consumer only waits
    in drain_events -- no further client action -- one message at a time, in order."""
    conn = connection_to()
    queue = Queue(unique_name("kombu-prefetch-1"), auto_delete=True)
    received: list[str] = []
    in_flight: list[int] = []  # unacked deliveries when each message arrived
    acks: list[threading.Thread] = []
    lock = threading.Lock()
    unacked = [0]

    def ack_later(message: Any) -> None:
        time.sleep(0.1)
        with lock:
            unacked[0] -= 1
        message.ack()

    def on_message(body: str, message: Any) -> None:
        with lock:
            in_flight.append(unacked[0])
            unacked[0] += 1
        received.append(body)
        thread = threading.Thread(target=ack_later, args=(message,))
        acks.append(thread)
        thread.start()

    count = 12
    with Consumer(conn, [queue], callbacks=[on_message], prefetch_count=1):
        producer = Producer(conn)
        for i in range(count):
            producer.publish(f"m{i}", routing_key=queue.name, declare=[queue])
        deadline = time.monotonic() + 30  # a hang guard, not a timing assertion
        while len(received) < count and time.monotonic() < deadline:
            conn.drain_events(timeout=5)
    for thread in acks:
        thread.join(10)
    assert received == [f"m{i}" for i in range(count)]
    assert in_flight == [0] * count, "prefetch 1: a message arrived before the previous ack"
