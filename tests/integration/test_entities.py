"""Exchanges and queues: declaration rules, exclusivity, auto-delete, purge/delete; and protocol errors."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from tests.integration.harness import Broker, wait_until
from tests.integration.pika_helpers import (
    Names,
    channel_close_code,
    passive_declare_code,
    pump,
    queue_exists,
    ready_count,
)


def _close_code(action) -> int:
    """Reply code of the channel.close that a synchronous pika call provokes."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
        action()
    return caught.value.reply_code



def _ignore(*args) -> None:
    pass


def test_exchange_declare_passive_missing_is_404(shared_broker: Broker, names: Names) -> None:
    """A passive declare of a missing exchange or queue closes the channel with 404 NOT_FOUND; the
    connection stays usable."""
    connection = shared_broker.connect()
    assert _close_code(lambda: connection.channel().exchange_declare(names("missing-x"), passive=True)) == 404
    assert _close_code(lambda: connection.channel().queue_declare(names("missing-q"), passive=True)) == 404
    assert connection.is_open
    channel = connection.channel()
    channel.exchange_declare("amq.direct", passive=True)
    channel.queue_declare(names("present"))
    assert queue_exists(connection, names("present"))


def test_inequivalent_redeclare_is_406(shared_broker: Broker, names: Names) -> None:
    """Redeclaring an exchange or queue with different properties closes the channel with 406 PRECONDITION_FAILED."""
    connection = shared_broker.connect()
    exchange, queue = names("x"), names("q")
    channel = connection.channel()
    channel.exchange_declare(exchange, "direct")
    channel.queue_declare(queue, durable=False)
    assert _close_code(lambda: connection.channel().exchange_declare(exchange, "fanout")) == 406
    assert _close_code(lambda: connection.channel().exchange_declare(exchange, "direct", durable=True)) == 406
    assert _close_code(lambda: connection.channel().queue_declare(queue, durable=True)) == 406
    again = connection.channel()
    again.exchange_declare(exchange, "direct")  # an equivalent redeclare is fine
    again.queue_declare(queue, durable=False)
    assert connection.is_open


def test_exclusive_queue_from_other_connection_is_405(shared_broker: Broker, names: Names) -> None:
    """Another connection using an exclusive queue gets 405 RESOURCE_LOCKED, though it may still publish to it."""
    owner, other = shared_broker.connections_on_distinct_workers(2)
    queue = names()
    owner_channel = owner.channel()
    owner_channel.queue_declare(queue, exclusive=True)

    assert _close_code(lambda: other.channel().queue_declare(queue, passive=True)) == 405
    assert _close_code(lambda: other.channel().queue_declare(queue, exclusive=True)) == 405
    assert _close_code(lambda: other.channel().basic_consume(queue, on_message_callback=_ignore)) == 405
    assert _close_code(lambda: other.channel().basic_get(queue)) == 405

    publisher = other.channel()
    publisher.confirm_delivery()
    publisher.basic_publish("", queue, b"reply")  # RPC replies go to exclusive queues
    _, _, body = owner_channel.basic_get(queue, auto_ack=True)
    assert body == b"reply"


def test_exclusive_queue_deleted_with_connection(shared_broker: Broker, names: Names) -> None:
    """An exclusive queue is deleted when the connection that declared it closes."""
    owner, other = shared_broker.connections_on_distinct_workers(2)
    queue = names()
    owner.channel().queue_declare(queue, exclusive=True)
    assert queue_exists(owner, queue)
    owner.close()
    wait_until(lambda: passive_declare_code(other, queue) == 404, 10, "the exclusive queue to be deleted")
    other.channel().queue_declare(queue, exclusive=True)  # the name is free again


def test_auto_delete_queue_deleted_after_last_consumer(shared_broker: Broker, names: Names) -> None:
    """An auto-delete queue outlives having no consumers yet, and is deleted when its last consumer goes."""
    connection = shared_broker.connect()
    queue = names()
    first, second = connection.channel(), connection.channel()
    first.queue_declare(queue, auto_delete=True)
    assert queue_exists(connection, queue)
    tag1 = first.basic_consume(queue, on_message_callback=_ignore)
    tag2 = second.basic_consume(queue, on_message_callback=_ignore)
    first.basic_cancel(tag1)
    pump([connection], 0.3)
    assert queue_exists(connection, queue)
    second.basic_cancel(tag2)
    wait_until(lambda: passive_declare_code(connection, queue) == 404, 10, "the auto-delete queue to be deleted")


def test_queue_purge_and_delete_if_empty_if_unused(shared_broker: Broker, names: Names) -> None:
    """queue.purge removes ready messages and counts them; queue.delete if-empty/if-unused refuse with 406
    while the queue has messages/consumers."""
    connection = shared_broker.connect()
    queue = names()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue)
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", queue, body)
    assert channel.queue_purge(queue).method.message_count == 3
    assert ready_count(channel, queue) == 0

    channel.basic_publish("", queue, b"d")
    assert _close_code(lambda: connection.channel().queue_delete(queue, if_empty=True)) == 406
    assert ready_count(channel, queue) == 1
    channel.queue_purge(queue)

    consumer = connection.channel()
    tag = consumer.basic_consume(queue, on_message_callback=_ignore)
    assert _close_code(lambda: connection.channel().queue_delete(queue, if_unused=True)) == 406
    consumer.basic_cancel(tag)
    assert channel.queue_delete(queue, if_unused=True, if_empty=True).method.message_count == 0
    assert passive_declare_code(connection, queue) == 404

    counted = names("counted")
    channel.queue_declare(counted)
    channel.basic_publish("", counted, b"x")
    channel.basic_publish("", counted, b"y")
    assert channel.queue_delete(counted).method.message_count == 2


def test_server_named_queue(shared_broker: Broker) -> None:
    """queue.declare with an empty name creates a queue with a fresh server-generated amq.gen- name."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    first = channel.queue_declare("", exclusive=True).method.queue
    second = channel.queue_declare("", exclusive=True).method.queue
    assert first.startswith("amq.gen-") and len(first) > len("amq.gen-")
    assert second.startswith("amq.gen-") and second != first
    channel.basic_publish("", first, b"to the generated name")
    _, _, body = channel.basic_get(first, auto_ack=True)
    assert body == b"to the generated name"


def test_unknown_delivery_tag_is_406(shared_broker: Broker, names: Names) -> None:
    """Acking a delivery tag the channel never issued, or one already acked, closes the channel with 406
    PRECONDITION_FAILED."""
    connection = shared_broker.connect()
    channel = connection.channel()
    assert channel_close_code(connection, channel, lambda: channel.basic_ack(delivery_tag=999)) == 406

    queue = names()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"once")
    method, _, _ = channel.basic_get(queue)
    channel.basic_ack(method.delivery_tag)

    def ack_again() -> None:
        channel.basic_ack(method.delivery_tag)

    assert channel_close_code(connection, channel, ack_again) == 406
    assert connection.is_open
    assert ready_count(connection.channel(), queue) == 0


def test_bad_login_is_403(shared_broker: Broker) -> None:
    """Wrong credentials are refused with connection.close 403 ACCESS_REFUSED; other clients are unaffected."""
    for user, password in (("guest", "wrong"), ("nobody", "guest")):
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as caught:
            shared_broker.connect(credentials=pika.PlainCredentials(user, password))
        assert "403" in str(caught.value), caught.value
    channel = shared_broker.connect().channel()
    assert channel.queue_declare("", exclusive=True).method.queue
