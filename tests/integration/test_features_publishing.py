"""Publishing features through pika: transactions (tx.select / commit / rollback) and direct
reply-to (amq.rabbitmq.reply-to), with RabbitMQ 3.10's semantics and errors."""

from __future__ import annotations

from typing import Any

import pika
import pika.exceptions
import pytest

from tests.integration.harness import Broker, wait_until
from tests.integration.pika_helpers import Names, channel_close_code, pump, pump_until, ready_count

REPLY_TO = "amq.rabbitmq.reply-to"


def _close_reason(action) -> pika.exceptions.ChannelClosedByBroker:
    """The channel.close that a synchronous pika call provokes."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        action()
    return caught.value


def _closed_by(channel: Any) -> pika.exceptions.ChannelClosedByBroker:
    reason = channel._closing_reason  # BlockingChannel keeps the Channel.Close it got here
    assert isinstance(reason, pika.exceptions.ChannelClosedByBroker), f"channel closed by {reason!r}"
    return reason


# --------------------------------------------------------------------------- transactions


def test_tx_publishes_are_invisible_until_commit_and_rollback_discards(
    shared_broker: Broker, names: Names
) -> None:
    """Messages published in a transaction reach their queues only at tx.commit; tx.rollback
    discards them, and so does closing the channel."""
    connection = shared_broker.connect()
    observer = connection.channel()
    queue = names()
    observer.queue_declare(queue)
    tx = connection.channel()
    tx.tx_select()
    tx.basic_publish("", queue, b"one")
    tx.basic_publish("", queue, b"two")
    pump([connection], 0.2)
    assert ready_count(observer, queue) == 0, "uncommitted messages are visible"
    tx.tx_commit()
    assert ready_count(observer, queue) == 2

    tx.basic_publish("", queue, b"rolled back")
    tx.tx_rollback()
    tx.tx_commit()  # nothing left to commit
    assert ready_count(observer, queue) == 2

    tx.basic_publish("", queue, b"lost with the channel")
    tx.close()
    pump([connection], 0.2)
    assert [observer.basic_get(queue, auto_ack=True)[2] for _ in range(2)] == [
        b"one",
        b"two",
    ]
    assert ready_count(observer, queue) == 0


def test_tx_acks_take_effect_at_commit(shared_broker: Broker, names: Names) -> None:
    """An ack inside a transaction settles the message only at tx.commit: before it, or after a
    rollback, closing the channel requeues the message; after the commit it is gone."""
    connection = shared_broker.connect()
    observer = connection.channel()
    observer.confirm_delivery()
    queue = names()
    observer.queue_declare(queue)
    observer.basic_publish("", queue, b"m")

    for ending in ("close", "rollback"):
        tx = connection.channel()
        tx.tx_select()
        method, _, _ = tx.basic_get(queue)
        tx.basic_ack(method.delivery_tag)
        if ending == "rollback":
            tx.tx_rollback()
        pump([connection], 0.1)
        assert ready_count(observer, queue) == 0  # still unacked, not requeued
        tx.close()
        wait_until(
            lambda: ready_count(observer, queue) == 1,
            5,
            f"the message back after {ending}",
        )

    tx = connection.channel()
    tx.tx_select()
    method, _, _ = tx.basic_get(queue)
    assert method.redelivered
    tx.basic_ack(method.delivery_tag)
    tx.tx_commit()
    tx.close()
    pump([connection], 0.2)
    assert ready_count(observer, queue) == 0


def test_tx_reject_requeues_at_commit(shared_broker: Broker, names: Names) -> None:
    """basic.reject with requeue inside a transaction puts the message back only at tx.commit."""
    connection = shared_broker.connect()
    observer = connection.channel()
    observer.confirm_delivery()
    queue = names()
    observer.queue_declare(queue)
    observer.basic_publish("", queue, b"m")
    tx = connection.channel()
    tx.tx_select()
    method, _, _ = tx.basic_get(queue)
    tx.basic_reject(method.delivery_tag, requeue=True)
    pump([connection], 0.2)
    assert ready_count(observer, queue) == 0
    tx.tx_commit()
    assert ready_count(observer, queue) == 1


def test_tx_ack_is_undone_by_rollback_and_can_be_repeated(shared_broker: Broker, names: Names) -> None:
    """tx.rollback gives back the acks of the transaction: the message is unacked again, and an
    ack of the same tag in the next transaction settles it at commit."""
    connection = shared_broker.connect()
    observer = connection.channel()
    observer.confirm_delivery()
    queue = names()
    observer.queue_declare(queue)
    observer.basic_publish("", queue, b"m")
    tx = connection.channel()
    tx.tx_select()
    method, _, _ = tx.basic_get(queue)
    tx.basic_ack(method.delivery_tag)
    tx.tx_rollback()
    tx.basic_ack(method.delivery_tag)  # valid again after the rollback
    tx.tx_commit()
    tx.close()
    pump([connection], 0.2)
    assert ready_count(observer, queue) == 0


def test_tx_ack_of_an_unknown_or_repeated_tag_is_406_at_once(shared_broker: Broker, names: Names) -> None:
    """Inside a transaction an ack of an unknown delivery tag, or of one already acked in the
    same transaction, closes the channel with 406 PRECONDITION_FAILED without waiting for commit."""
    connection = shared_broker.connect()
    observer = connection.channel()
    observer.confirm_delivery()
    queue = names()
    observer.queue_declare(queue)
    observer.basic_publish("", queue, b"m")

    unknown = connection.channel()
    unknown.tx_select()
    assert channel_close_code(connection, unknown, lambda: unknown.basic_ack(999)) == 406

    repeated = connection.channel()
    repeated.tx_select()
    method, _, _ = repeated.basic_get(queue)
    repeated.basic_ack(method.delivery_tag)
    assert channel_close_code(connection, repeated, lambda: repeated.basic_ack(method.delivery_tag)) == 406
    # The closed channel's uncommitted ack was discarded: the message is back.
    wait_until(lambda: ready_count(observer, queue) == 1, 5, "the message to be requeued")


def test_tx_mandatory_return_and_dead_letter_happen_at_commit(shared_broker: Broker, names: Names) -> None:
    """In a transaction an unroutable mandatory publish is returned, and a nack without requeue
    dead-letters, only when the transaction commits."""
    connection = shared_broker.connect()
    observer = connection.channel()
    observer.confirm_delivery()
    source, dead = names("source"), names("dead")
    observer.queue_declare(dead)
    observer.queue_declare(
        source,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead},
    )
    observer.basic_publish("", source, b"doomed")
    returned: list[int] = []
    tx = connection.channel()
    tx.add_on_return_callback(lambda ch, method, properties, body: returned.append(method.reply_code))
    tx.tx_select()
    tx.basic_publish("amq.direct", names("nowhere"), b"unroutable", mandatory=True)
    method, _, _ = tx.basic_get(source)
    tx.basic_nack(method.delivery_tag, requeue=False)
    pump([connection], 0.3)
    assert returned == [] and ready_count(observer, dead) == 0
    tx.tx_commit()
    pump_until([connection], lambda: returned, 5, "basic.return after commit")
    assert returned == [312]
    wait_until(
        lambda: ready_count(observer, dead) == 1,
        5,
        "the dead-lettered message after commit",
    )


def test_tx_and_confirm_modes_exclude_each_other(shared_broker: Broker) -> None:
    """confirm.select on a transactional channel, tx.select on a confirm channel, and
    tx.commit / tx.rollback on a non-transactional channel are 406 PRECONDITION_FAILED."""
    connection = shared_broker.connect()
    tx = connection.channel()
    tx.tx_select()
    assert _close_reason(tx.confirm_delivery).reply_code == 406
    confirming = connection.channel()
    confirming.confirm_delivery()
    assert _close_reason(confirming.tx_select).reply_code == 406
    assert _close_reason(connection.channel().tx_commit).reply_code == 406
    assert _close_reason(connection.channel().tx_rollback).reply_code == 406
    assert connection.is_open


# --------------------------------------------------------------------------- direct reply-to


def test_direct_reply_to_round_trip_across_connections(shared_broker: Broker, names: Names) -> None:
    """A requester consuming amq.rabbitmq.reply-to (no-ack) publishes with that reply_to; the
    responder, on another connection, sees it rewritten to a unique amq.rabbitmq.reply-to.* name
    and its reply to that name reaches the requester."""
    requester, responder = shared_broker.connections_on_distinct_workers(2)
    requests = names("requests")
    server = responder.channel()
    server.queue_declare(requests)
    seen_reply_to: list[str] = []

    def serve(channel: Any, method: Any, properties: Any, body: bytes) -> None:
        seen_reply_to.append(properties.reply_to)
        reply = pika.BasicProperties(correlation_id=properties.correlation_id)
        channel.basic_publish("", properties.reply_to, b"pong:" + body, reply)

    server.basic_consume(requests, serve, auto_ack=True)
    client = requester.channel()
    replies: list[tuple[bytes, str | None]] = []
    client.basic_consume(
        REPLY_TO,
        lambda ch, m, p, body: replies.append((body, p.correlation_id)),
        auto_ack=True,
    )
    for index in range(3):
        properties = pika.BasicProperties(reply_to=REPLY_TO, correlation_id=str(index))
        client.basic_publish("", requests, f"ping{index}".encode(), properties)
    pump_until([requester, responder], lambda: len(replies) == 3, 10, "three direct replies")
    assert replies == [(f"pong:ping{index}".encode(), str(index)) for index in range(3)]
    assert len(set(seen_reply_to)) == 1
    assert seen_reply_to[0].startswith(REPLY_TO + ".") and len(seen_reply_to[0]) > len(REPLY_TO) + 1


def test_direct_reply_to_replies_reach_the_right_channel(shared_broker: Broker, names: Names) -> None:
    """Two channels of one connection each consuming amq.rabbitmq.reply-to get distinct reply
    names, and each reply reaches only the channel that sent the request."""
    connection = shared_broker.connect()
    requests = names("requests")
    server = connection.channel()
    server.queue_declare(requests)
    server.confirm_delivery()
    clients = [connection.channel(), connection.channel()]
    replies: list[list[bytes]] = [[], []]
    for index, client in enumerate(clients):
        client.basic_consume(
            REPLY_TO,
            lambda ch, m, p, body, index=index: replies[index].append(body),
            auto_ack=True,
        )
        client.basic_publish(
            "",
            requests,
            f"from {index}".encode(),
            pika.BasicProperties(reply_to=REPLY_TO),
        )
    wait_until(lambda: ready_count(server, requests) == 2, 5, "both requests")
    reply_names = []
    for _ in range(2):
        _, properties, body = server.basic_get(requests, auto_ack=True)
        reply_names.append(properties.reply_to)
        server.basic_publish("", properties.reply_to, b"re: " + body)
    assert len(set(reply_names)) == 2
    pump_until([connection], lambda: all(replies), 10, "both replies")
    pump([connection], 0.2)
    assert replies == [[b"re: from 0"], [b"re: from 1"]]


def test_direct_reply_to_misuse_is_406(shared_broker: Broker, names: Names) -> None:
    """Consuming amq.rabbitmq.reply-to with acks, and publishing with reply_to
    amq.rabbitmq.reply-to without a reply consumer on the channel, are 406 PRECONDITION_FAILED
    with RabbitMQ's texts; nothing is enqueued."""
    connection = shared_broker.connect()
    queue = names()
    connection.channel().queue_declare(queue)
    acking = connection.channel()
    refused = _close_reason(lambda: acking.basic_consume(REPLY_TO, lambda *args: None))
    assert (refused.reply_code, refused.reply_text) == (
        406,
        "PRECONDITION_FAILED - reply consumer cannot acknowledge",
    )

    orphan = connection.channel()
    properties = pika.BasicProperties(reply_to=REPLY_TO)
    assert (
        channel_close_code(
            connection,
            orphan,
            lambda: orphan.basic_publish("", queue, b"?", properties),
        )
        == 406
    )
    assert _closed_by(orphan).reply_text == "PRECONDITION_FAILED - fast reply consumer does not exist"
    assert connection.is_open
    assert ready_count(connection.channel(), queue) == 0


def test_direct_reply_to_a_gone_requester_is_dropped(shared_broker: Broker, names: Names) -> None:
    """A reply to a requester whose channel has closed is confirmed and dropped (returned when
    mandatory); the responder's channel stays open."""
    requester, responder = shared_broker.connections_on_distinct_workers(2)
    requests = names("requests")
    client = requester.channel()
    client.queue_declare(requests)
    client.basic_consume(REPLY_TO, lambda *args: None, auto_ack=True)
    client.basic_publish("", requests, b"ping", pika.BasicProperties(reply_to=REPLY_TO))
    server = responder.channel()
    server.confirm_delivery()
    wait_until(lambda: ready_count(server, requests) == 1, 5, "the request")
    _, properties, _ = server.basic_get(requests, auto_ack=True)
    assert properties.reply_to.startswith(REPLY_TO + ".")
    client.close()
    pump([requester], 0.2)
    server.basic_publish("", properties.reply_to, b"too late")  # confirmed, not an error
    with pytest.raises(pika.exceptions.UnroutableError):
        server.basic_publish("", properties.reply_to, b"too late", mandatory=True)
    assert server.is_open


def test_direct_reply_to_passive_declare_succeeds(shared_broker: Broker) -> None:
    """A passive queue.declare of amq.rabbitmq.reply-to answers declare-ok (clients check that
    direct reply-to is available this way)."""
    channel = shared_broker.connect().channel()
    channel.basic_consume(REPLY_TO, lambda *args: None, auto_ack=True)
    assert channel.queue_declare(REPLY_TO, passive=True).method.queue == REPLY_TO
    assert shared_broker.connect().channel().queue_declare(REPLY_TO, passive=True).method.queue == REPLY_TO


def test_direct_reply_to_second_reply_consumer_is_406(shared_broker: Broker) -> None:
    """A second basic.consume on amq.rabbitmq.reply-to on the same channel is 406
    PRECONDITION_FAILED "reply consumer already set"."""
    channel = shared_broker.connect().channel()
    channel.basic_consume(REPLY_TO, lambda *args: None, auto_ack=True)
    refused = _close_reason(lambda: channel.basic_consume(REPLY_TO, lambda *args: None, auto_ack=True))
    assert (refused.reply_code, refused.reply_text) == (
        406,
        "PRECONDITION_FAILED - reply consumer already set",
    )


def test_direct_reply_to_cancelled_consumer_refuses_new_requests(shared_broker: Broker, names: Names) -> None:
    """After the reply consumer is cancelled, publishing with reply_to amq.rabbitmq.reply-to on
    that channel is 406 again."""
    connection = shared_broker.connect()
    queue = names()
    channel = connection.channel()
    channel.queue_declare(queue)
    tag = channel.basic_consume(REPLY_TO, lambda *args: None, auto_ack=True)
    channel.basic_publish("", queue, b"ok", pika.BasicProperties(reply_to=REPLY_TO))
    channel.basic_cancel(tag)
    properties = pika.BasicProperties(reply_to=REPLY_TO)

    def publish() -> None:
        channel.basic_publish("", queue, b"?", properties)

    assert channel_close_code(connection, channel, publish, timeout=3) == 406
    assert ready_count(connection.channel(), queue) == 1
