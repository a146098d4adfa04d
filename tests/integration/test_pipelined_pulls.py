"""A consumer acking each message of a backlog with a small prefetch: its worker sends the next
pull before the last is answered (``workers.channel_consumers``). What a client sees must not
change: never more unacknowledged deliveries than the prefetch, every message once and in queue
order, and a consumer cancelled with pulls in flight gives back what they brought."""

from __future__ import annotations

import time

import pika
import pytest

from tests.integration.harness import Broker
from tests.integration.pika_helpers import Names, pump, ready_count

TOTAL = 3000
PREFETCH = 10


def _backlog(broker: Broker, queue: str) -> list[bytes]:
    channel = broker.connect().channel()
    channel.confirm_delivery()
    channel.queue_declare(queue)
    bodies = [f"p{i:05d}".encode() for i in range(TOTAL)]
    for body in bodies:
        channel.basic_publish("", queue, body)
    return bodies


class AckingEach:
    """A pika consumer that acks each delivery on its own (multiple=false) once the test's loop
    has seen it, counting how many it held unacknowledged at once."""

    def __init__(self, connection: pika.BlockingConnection, queue: str, tag: str) -> None:
        self.connection = connection
        self.channel = connection.channel()
        self.channel.basic_qos(prefetch_count=PREFETCH)
        self.bodies: list[bytes] = []
        self.unacked: list[int] = []
        self.most_unacked = 0
        self.tag = self.channel.basic_consume(queue, self._on_message, consumer_tag=tag)

    def _on_message(self, channel, method, properties, body) -> None:
        self.bodies.append(body)
        self.unacked.append(method.delivery_tag)
        self.most_unacked = max(self.most_unacked, len(self.unacked))

    def turn(self) -> None:
        """Read what came, then ack it one message at a time."""
        self.connection.process_data_events(time_limit=0)
        tags, self.unacked = self.unacked, []
        for tag in tags:
            self.channel.basic_ack(tag)


@pytest.mark.deadline(240)
def test_acking_each_message_of_a_backlog_stays_within_the_prefetch(shared_broker: Broker,
                                                                     names: Names) -> None:
    queue = names("pipelined")
    expected = _backlog(shared_broker, queue)
    consumer = AckingEach(shared_broker.connect(), queue, "each")
    deadline = time.monotonic() + 180
    while len(consumer.bodies) < TOTAL and time.monotonic() < deadline:
        consumer.turn()
    pump([consumer.connection], 0.5)  # a duplicate would arrive in this window
    consumer.turn()
    assert consumer.bodies == expected
    assert consumer.most_unacked <= PREFETCH
    assert consumer.most_unacked > 1  # the prefetch was used, not one message at a time
    assert ready_count(consumer.connection.channel(), queue) == 0


@pytest.mark.deadline(240)
def test_a_consumer_cancelled_while_pulling_gives_back_what_its_pulls_brought(
        shared_broker: Broker, names: Names) -> None:
    """Two consumers on two workers share a backlog; one is cancelled midway while acks and
    pulls are in flight. The other gets the rest: every message exactly once between them."""
    queue = names("pipelined-cancel")
    expected = _backlog(shared_broker, queue)
    first_conn, second_conn = shared_broker.connections_on_distinct_workers(2)
    first = AckingEach(first_conn, queue, "first")
    second = AckingEach(second_conn, queue, "second")
    deadline = time.monotonic() + 180
    while len(second.bodies) < TOTAL // 4 and time.monotonic() < deadline:
        first.turn()
        second.turn()
    second.channel.basic_cancel(second.tag)
    second.turn()
    while len(first.bodies) + len(second.bodies) < TOTAL and time.monotonic() < deadline:
        first.turn()
    pump([first_conn, second_conn], 0.5)
    first.turn()
    everything = first.bodies + second.bodies
    assert len(everything) == TOTAL, f"{len(everything)} deliveries for {TOTAL} messages"
    assert sorted(everything) == expected
    assert first.most_unacked <= PREFETCH and second.most_unacked <= PREFETCH
    assert ready_count(first.channel, queue) == 0
