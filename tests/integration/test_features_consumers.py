"""Consumer-side features through pika: the seed's held messages and message groups (Qpid
Broker-J features RabbitMQ lacks), and consumer cancel notification when a queue is deleted."""

from __future__ import annotations

import time
from typing import Any

import pika
import pika.exceptions

from tests.integration.harness import Broker
from tests.integration.pika_helpers import Names, pump, pump_until, ready_count

# The seed's hold header (Qpid Broker-J): Unix time in milliseconds before which the message is
# not delivered, honoured by queues declared with holdOnPublishEnabled=true.
NOT_VALID_BEFORE = "x-qpid-not-valid-before"
# How far the broker's clock conversion may put a due time early (it maps Unix time onto its
# monotonic clock once); generous, and still far below the hold times used here.
CLOCK_SLACK = 0.1


class Recorder:
    """A consumer callback that records (body, delivery tag, headers, arrival time) and can ack."""

    def __init__(self, channel: Any, auto_ack: bool = False):
        self.channel = channel
        self.auto_ack = auto_ack
        self.received: list[tuple[bytes, int, dict[str, Any], float]] = []

    def __call__(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        self.received.append((body, method.delivery_tag, properties.headers or {}, time.time()))

    @property
    def bodies(self) -> list[bytes]:
        return [body for body, _, _, _ in self.received]

    def ack_all(self) -> None:
        if self.received:
            self.channel.basic_ack(self.received[-1][1], multiple=True)


def _unix_ms(offset_seconds: float) -> int:
    return int((time.time() + offset_seconds) * 1000)


# --------------------------------------------------------------------------- held messages


def test_held_message_is_delivered_only_after_its_not_valid_before_time(
    shared_broker: Broker, names: Names
) -> None:
    """In a holdOnPublishEnabled queue a message whose x-qpid-not-valid-before (Unix ms) is in the
    future is held back while later messages are delivered, and reaches the waiting consumer
    once that time has come; a past time or no header does not hold."""
    connection = shared_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    queue = names()
    channel.queue_declare(queue, arguments={"holdOnPublishEnabled": True})
    due = _unix_ms(2.0)
    channel.basic_publish("", queue, b"held", pika.BasicProperties(headers={NOT_VALID_BEFORE: due}))
    channel.basic_publish("", queue, b"past", pika.BasicProperties(headers={NOT_VALID_BEFORE: _unix_ms(-5)}))
    channel.basic_publish("", queue, b"plain")

    recorder = Recorder(channel)
    channel.basic_consume(queue, recorder, auto_ack=True)
    pump_until([connection], lambda: len(recorder.received) == 3, 10, "all three messages")
    # The held message comes last, although it was published first, and not before its time.
    assert recorder.bodies == [b"past", b"plain", b"held"]
    body, _, headers, arrived = recorder.received[2]
    assert body == b"held"
    assert headers[NOT_VALID_BEFORE] == due
    assert arrived >= due / 1000 - CLOCK_SLACK, f"delivered {due / 1000 - arrived:.3f} s before its time"


def test_held_message_is_invisible_to_basic_get_until_due(shared_broker: Broker, names: Names) -> None:
    """basic.get skips a held message until its not-valid-before time, then returns it."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    queue = names()
    channel.queue_declare(queue, arguments={"holdOnPublishEnabled": True})
    due = _unix_ms(1.5)
    channel.basic_publish("", queue, b"held", pika.BasicProperties(headers={NOT_VALID_BEFORE: due}))
    method, _, _ = channel.basic_get(queue, auto_ack=True)
    if time.time() < due / 1000 - CLOCK_SLACK:  # (a very slow client could be past it already)
        assert method is None, "a held message was handed out by basic.get before its time"
    limit = time.monotonic() + 10
    while method is None and time.monotonic() < limit:
        time.sleep(0.05)
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            assert time.time() >= due / 1000 - CLOCK_SLACK, "handed out before its time"
            assert body == b"held"
    assert method is not None, "the held message never became available"


def test_hold_header_is_ignored_without_hold_on_publish(shared_broker: Broker, names: Names) -> None:
    """A queue declared without holdOnPublishEnabled delivers a message with a future
    x-qpid-not-valid-before at once."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    queue = names()
    channel.queue_declare(queue)
    channel.basic_publish(
        "",
        queue,
        b"not held",
        pika.BasicProperties(headers={NOT_VALID_BEFORE: _unix_ms(60)}),
    )
    _, _, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"not held"


# --------------------------------------------------------------------------- message groups


def _grouped(group: str, body: str, header: str = "JMSXGroupID") -> tuple[bytes, pika.BasicProperties]:
    return body.encode(), pika.BasicProperties(headers={header: group})


def test_shared_message_group_goes_to_one_consumer_while_it_holds_unacked(
    shared_broker: Broker, names: Names
) -> None:
    """With qpid.shared_msg_group=1 a group (header JMSXGroupID) belongs to the consumer holding
    unacked messages of it: another consumer with credit gets other groups but not that one,
    until the owner acks; then the group is free again."""
    connection = shared_broker.connect()
    publisher = connection.channel()
    publisher.confirm_delivery()
    queue = names()
    publisher.queue_declare(queue, arguments={"qpid.shared_msg_group": 1})
    for group, body in (("A", "a1"), ("A", "a2"), ("B", "b1")):
        publisher.basic_publish("", queue, *_grouped(group, body))

    first_channel, second_channel = connection.channel(), connection.channel()
    first_channel.basic_qos(prefetch_count=1)
    second_channel.basic_qos(prefetch_count=1)
    first, second = Recorder(first_channel), Recorder(second_channel)
    first_channel.basic_consume(queue, first)
    pump_until([connection], lambda: first.received, 10, "the first consumer's delivery")
    second_channel.basic_consume(queue, second)
    pump_until([connection], lambda: second.received, 10, "the second consumer's delivery")
    pump([connection], 0.3)
    # The second consumer has credit, but a2 belongs to group A, which the first one holds.
    assert (first.bodies, second.bodies) == ([b"a1"], [b"b1"])

    second.ack_all()
    pump([connection], 0.3)
    assert second.bodies == [b"b1"], "group A went to a consumer while another held it"

    first.ack_all()  # group A is free: a2 goes to whichever consumer has credit
    pump_until([connection], lambda: len(first.received) + len(second.received) == 3, 10, "a2")
    assert sorted(first.bodies + second.bodies) == [b"a1", b"a2", b"b1"]
    assert ready_count(publisher, queue) == 0


def test_basic_get_skips_a_shared_group_held_by_a_consumer(shared_broker: Broker, names: Names) -> None:
    """basic.get on a shared-groups queue passes over messages of a group a consumer holds
    unacked and returns the next message of another group; after the ack it gets the group."""
    connection = shared_broker.connect()
    publisher = connection.channel()
    publisher.confirm_delivery()
    queue = names()
    publisher.queue_declare(queue, arguments={"qpid.shared_msg_group": 1})
    for group, body in (("A", "a1"), ("A", "a2"), ("B", "b1")):
        publisher.basic_publish("", queue, *_grouped(group, body))
    holder_channel = connection.channel()
    holder_channel.basic_qos(prefetch_count=1)
    holder = Recorder(holder_channel)
    holder_channel.basic_consume(queue, holder)
    pump_until([connection], lambda: holder.received, 10, "the consumer's delivery")
    assert holder.bodies == [b"a1"]
    getter = connection.channel()
    assert getter.basic_get(queue, auto_ack=True)[2] == b"b1"
    method, _, _ = getter.basic_get(queue, auto_ack=True)
    assert method is None, "basic.get took a message of a group a consumer holds"
    holder_channel.basic_cancel(holder_channel.consumer_tags[0])  # the unacked a1 stays with the channel
    holder.ack_all()
    pump([connection], 0.2)
    assert getter.basic_get(queue, auto_ack=True)[2] == b"a2"


def test_standard_message_group_sticks_to_its_consumer_until_it_goes(
    shared_broker: Broker, names: Names
) -> None:
    """With qpid.group_header_key (not shared) every message of a group goes to the consumer
    that took the group's first one, acked or not, until that consumer is cancelled."""
    connection = shared_broker.connect()
    publisher = connection.channel()
    publisher.confirm_delivery()
    queue = names()
    header = "grp"
    publisher.queue_declare(queue, arguments={"qpid.group_header_key": header})
    channels = [connection.channel(), connection.channel()]
    recorders = [Recorder(channel) for channel in channels]
    tags = [
        channel.basic_consume(queue, recorder, auto_ack=True)
        for channel, recorder in zip(channels, recorders, strict=True)
    ]

    def publish_round(label: str) -> None:
        for index in range(4):
            for group in ("A", "B", "C", "D"):
                publisher.basic_publish("", queue, *_grouped(group, f"{group}-{label}{index}", header))

    def owners() -> dict[str, set[int]]:
        found: dict[str, set[int]] = {}
        for number, recorder in enumerate(recorders):
            for body in recorder.bodies:
                found.setdefault(body.decode()[0], set()).add(number)
        return found

    publish_round("r")
    pump_until(
        [connection],
        lambda: sum(len(r.received) for r in recorders) == 16,
        10,
        "16 deliveries",
    )
    first_owners = owners()
    assert all(len(consumers) == 1 for consumers in first_owners.values()), (
        f"a group was split: {first_owners}"
    )

    publish_round("s")  # everything above was acked (auto-ack): the groups still stick
    pump_until(
        [connection],
        lambda: sum(len(r.received) for r in recorders) == 32,
        10,
        "32 deliveries",
    )
    assert owners() == first_owners

    # Cancel consumer 0: its groups move to consumer 1.
    channels[0].basic_cancel(tags[0])
    before = len(recorders[1].received)
    publish_round("t")
    pump_until(
        [connection],
        lambda: len(recorders[1].received) == before + 16,
        10,
        "the rest at consumer 1",
    )


# --------------------------------------------------------------------------- cancel notification


def test_queue_deletion_sends_basic_cancel_and_the_channel_stays_open(
    shared_broker: Broker, names: Names
) -> None:
    """consumer_cancel_notify: deleting a queue sends basic.cancel to its consumers (on any
    connection); their channels stay open and usable."""
    consumer_connection, deleter = shared_broker.connections_on_distinct_workers(2)
    queue = names()
    channel = consumer_connection.channel()
    channel.queue_declare(queue)
    cancelled: list[Any] = []
    channel.add_on_cancel_callback(cancelled.append)
    tag = channel.basic_consume(queue, lambda *args: None)
    deleter.channel().queue_delete(queue)
    pump_until([consumer_connection], lambda: cancelled, 10, "basic.cancel from the broker")
    assert cancelled[0].method.consumer_tag == tag
    assert channel.is_open and tag not in channel.consumer_tags
    assert channel.queue_declare("", exclusive=True).method.queue


def test_x_cancel_on_ha_failover_is_accepted_and_ignored(shared_broker: Broker, names: Names) -> None:
    """basic.consume with x-cancel-on-ha-failover (a mirrored-queue argument) is accepted and the
    consumer works as any other."""
    connection = shared_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    queue = names()
    channel.queue_declare(queue)
    recorder = Recorder(channel)
    channel.basic_consume(queue, recorder, auto_ack=True, arguments={"x-cancel-on-ha-failover": True})
    channel.basic_publish("", queue, b"delivered")
    pump_until([connection], lambda: recorder.received, 10, "the delivery")
    assert recorder.bodies == [b"delivered"]
