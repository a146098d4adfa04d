"""A slow consumer beside other publishers, with real clients (pika).

Credit flow holds back only the publishers feeding a queue whose consumer waits on the
supervisor; a consumer that acks one message every few milliseconds on a deep queue waits on
its client, not on us (its worker marks its pulls client-limited), so it holds back no
publisher, not even its own queue's. The tests assert what the supervisor did (its count of
grants held back per connection, read on the control socket), never a time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pika
import pika.exceptions
import pytest

from broker.runtime.credit_flow import FLOW_BACKLOG
from tests.integration.ctl_helpers import control
from tests.integration.harness import Broker, deadline
from tests.integration.rawclient import unique_name

CONFIRMED = 1000  # more than twice workers' PUBLISH_CREDIT: the publisher needs its credit back
ACK_EVERY_S = 0.02  # the slow consumer takes this long over each message (50 a second)


def withheld_from(broker: Broker, product: str) -> int:
    """Grants of publish credit the supervisor held back from the connection whose client
    calls itself ``product``."""
    rows = control(broker, command="list_connections")["connections"]
    (row,) = [row for row in rows if row["client"] == product]
    counts = {(w["worker"], w["conn"]): w["grants"] for w in control(broker, command="credit_flow")["withheld"]}
    return counts.get((row["worker"], row["conn"]), 0)


class SlowConsumer:
    """A pika consumer with its own connection on its own thread (pika is not thread-safe:
    the connection is made, used and closed there): prefetch 10, each message acked on its own
    ACK_EVERY_S after it arrived, so that its prefetch is full between acks (``global_qos``: the
    channel's prefetch, shared by its consumers, as celery sets it)."""

    def __init__(self, broker: Broker, queue: str, *, global_qos: bool = False) -> None:
        self.acked = 0
        self._global_qos = global_qos
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(broker.connection_parameters(), queue),
                                        daemon=True)
        self._thread.start()

    def _on_message(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        if self._stop.is_set():
            # Unacked, it goes back to the queue at close. An ack here would make room for the
            # next delivery, which pika dispatches within the same process_data_events call:
            # on a deep queue the loop would never see the stop.
            return
        time.sleep(ACK_EVERY_S)  # a slow application
        channel.basic_ack(method.delivery_tag)
        self.acked += 1

    def _run(self, parameters: pika.ConnectionParameters, queue: str) -> None:
        try:
            connection = pika.BlockingConnection(parameters)
            try:
                channel = connection.channel()
                channel.basic_qos(prefetch_count=10, global_qos=self._global_qos)
                channel.basic_consume(queue, self._on_message)
                while not self._stop.is_set():
                    connection.process_data_events(time_limit=0.1)
            finally:
                # not close_quietly: its deadline is a SIGALRM, for the main thread only; stop()
                # bounds this thread's close with its join
                with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                    if connection.is_open:
                        connection.close()
        except Exception as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert self.error is None, f"the slow consumer failed: {self.error!r}"


def deep_queue_with_a_slow_consumer(broker: Broker, setup: Any, queue: str, *,
                                    global_qos: bool = False) -> SlowConsumer:
    """``queue`` declared with a backlog (its consumer always has more to take), and a
    SlowConsumer on it (``global_qos``: its prefetch is its channel's)."""
    setup.queue_declare(queue)
    for _ in range(FLOW_BACKLOG * 3):
        setup.basic_publish("", queue, b"x" * 100)
    return SlowConsumer(broker, queue, global_qos=global_qos)


def confirming_once_under_way(publisher: pika.BlockingConnection, slow: SlowConsumer) -> Any:
    """A channel of ``publisher`` in confirm mode, once ``slow`` is under way (served at each
    ack, its prefetch full between acks)."""
    channel = publisher.channel()
    channel.confirm_delivery()
    while slow.acked < 5:
        publisher.process_data_events(time_limit=0.05)
    return channel


@pytest.mark.deadline(120)
def test_a_slow_consumer_does_not_hold_back_a_publisher_to_another_queue(broker: Broker) -> None:
    """A consumer acking 50 messages a second on a deep queue A, its prefetch full between
    acks: a publisher with confirms to queue B gets every confirm, and the supervisor never
    held back its credit (RabbitMQ lets A grow and every publisher keeps its rate)."""
    a, b = unique_name("slow-a"), unique_name("other-b")
    setup = broker.connect().channel()
    setup.queue_declare(b)
    slow = deep_queue_with_a_slow_consumer(broker, setup, a)
    publisher = broker.connect(client_properties={"product": "publisher to B"})
    try:
        channel = confirming_once_under_way(publisher, slow)
        for i in range(CONFIRMED):
            channel.basic_publish("", b, str(i).encode(), mandatory=True)  # raises unless confirmed
        assert setup.queue_declare(b, passive=True).method.message_count == CONFIRMED
        assert slow.acked > 5  # the slow consumer kept going meanwhile
        assert withheld_from(broker, "publisher to B") == 0
    finally:
        slow.stop()
    setup.queue_delete(a)
    setup.queue_delete(b)


def publish_to_the_slow_consumers_own_queue(broker: Broker, *, global_qos: bool = False) -> int:
    """A SlowConsumer on a deep queue A (``global_qos``: its prefetch its channel's), and a
    publisher with confirms to A once it is under way, publishing CONFIRMED messages (each
    confirmed, or basic_publish raises): the grants of publish credit held back from that
    publisher."""
    a = unique_name("slow-a")
    setup = broker.connect().channel()
    slow = deep_queue_with_a_slow_consumer(broker, setup, a, global_qos=global_qos)
    publisher = broker.connect(client_properties={"product": "publisher to A"})
    try:
        channel = confirming_once_under_way(publisher, slow)
        # Held back, the publisher would wait for its credit as long as A's backlog lasts.
        with deadline(60, "publishing to the slow consumer's queue"):
            for i in range(CONFIRMED):
                channel.basic_publish("", a, str(i).encode(), mandatory=True)
        assert slow.acked > 5
        withheld = withheld_from(broker, "publisher to A")
    finally:
        slow.stop()
    setup.queue_delete(a)
    return withheld


@pytest.mark.deadline(120)
def test_a_slow_consumer_does_not_hold_back_its_own_queues_publisher(broker: Broker) -> None:
    """The same consumer, acking every ACK_EVERY_S (more often than credit flow's FLOW_HOLD) on
    a deep queue, and a publisher with confirms to that very queue: its client limits the
    consumer, not the supervisor, so the publisher gets every confirm and its credit was never
    held back (RabbitMQ lets the queue grow and the publisher keeps its rate)."""
    assert publish_to_the_slow_consumers_own_queue(broker) == 0


@pytest.mark.deadline(120)
def test_a_slow_consumer_with_a_global_prefetch_does_not_hold_back_its_own_queues_publisher(
        broker: Broker) -> None:
    """As above, with the slow consumer's prefetch its channel's (basic.qos global=true, as
    celery sets it): its worker's shared pulls say its client limits it, so the publisher to
    its queue gets every confirm and its credit was never held back."""
    assert publish_to_the_slow_consumers_own_queue(broker, global_qos=True) == 0
