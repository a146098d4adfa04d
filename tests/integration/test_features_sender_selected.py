"""Sender-selected distribution through pika: the CC and BCC headers add routing keys (BCC
never delivered, never returned), each queue gets a message once, on every exchange type, and
through dead-lettering, as RabbitMQ 3.10 does."""

from __future__ import annotations

from typing import Any

import pika
import pika.exceptions
import pytest

from tests.integration.harness import (
    Broker,
    Names,
    channel_close_code,
    pump_until,
    ready_count,
    wait_until,
)
from tests.integration.queue_helpers import _bodies, _queues

# --------------------------------------------------------------------------- sender-selected distribution


def test_cc_and_bcc_headers_add_routing_keys(shared_broker: Broker, names: Names) -> None:
    """RabbitMQ's sender-selected distribution: the CC and BCC headers (arrays of strings) are
    extra routing keys; CC stays on the delivered message, BCC is removed from it."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    exchange = names("x")
    channel.exchange_declare(exchange, "direct")
    main, copied, blind = _queues(channel, names, "main", "cc", "bcc")
    channel.queue_bind(main, exchange, routing_key="main")
    channel.queue_bind(copied, exchange, routing_key="copied")
    channel.queue_bind(blind, exchange, routing_key="blind")
    headers = {"CC": ["copied"], "BCC": ["blind"]}
    channel.basic_publish(exchange, "main", b"to three", pika.BasicProperties(headers=headers))
    for queue in (main, copied, blind):
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        assert body == b"to three", f"{queue} did not get the message"
        assert method.routing_key == "main"
        assert properties.headers == {"CC": ["copied"]}


def test_consumers_get_cc_but_never_bcc(shared_broker: Broker, names: Names) -> None:
    """A consumer (basic.deliver) sees the routing key of the publish, the CC header and every
    other header as published; BCC is gone."""
    connection = shared_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    main, blind = _queues(channel, names, "main", "blind")
    headers = {"CC": [main], "BCC": [blind], "n": 5, "s": "text", "t": {"a": 1}, "l": [1, "x"]}
    channel.basic_publish("", main, b"hello", pika.BasicProperties(headers=headers, priority=3))
    received: list[tuple[str, Any, bytes]] = []
    for queue in (main, blind):
        channel.basic_consume(
            queue,
            lambda ch, method, properties, body: received.append((method.routing_key, properties, body)),
            auto_ack=True,
        )
    pump_until([connection], lambda: len(received) == 2, what="both deliveries")
    for routing_key, properties, body in received:
        assert (routing_key, body, properties.priority) == (main, b"hello", 3)
        assert properties.headers == {"CC": [main], "n": 5, "s": "text", "t": {"a": 1}, "l": [1, "x"]}


def test_cc_and_bcc_keys_reach_each_queue_once(shared_broker: Broker, names: Names) -> None:
    """A queue matched by the routing key and by CC and BCC keys gets one copy; keys that match
    nothing add nothing; a message with only CC is delivered with its header untouched."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    exchange = names("x")
    channel.exchange_declare(exchange, "direct")
    both, other = _queues(channel, names, "both", "other")
    channel.queue_bind(both, exchange, routing_key="a")
    channel.queue_bind(both, exchange, routing_key="b")
    channel.queue_bind(other, exchange, routing_key="c")
    headers = {"CC": ["a", "b", "b", "nothing"], "BCC": ["a", "c"]}
    channel.basic_publish(exchange, "a", b"once", pika.BasicProperties(headers=headers))
    channel.basic_publish(exchange, "zzz", b"cc only", pika.BasicProperties(headers={"CC": ["c"]}))
    assert _bodies(channel, both) == [b"once"]
    assert ready_count(channel, other) == 2
    _, properties, _ = channel.basic_get(other, auto_ack=True)
    assert properties.headers == {"CC": ["a", "b", "b", "nothing"]}
    _, properties, _ = channel.basic_get(other, auto_ack=True)
    assert properties.headers == {"CC": ["c"]}


def test_cc_on_default_topic_and_fanout_exchanges(shared_broker: Broker, names: Names) -> None:
    """The default exchange takes each key as a queue name; a topic exchange matches each key
    against its patterns; a fanout exchange, which ignores keys, delivers one copy per queue."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    first, second, third = _queues(channel, names, "first", "second", "third")
    channel.basic_publish("", first, b"default", pika.BasicProperties(headers={"CC": [second], "BCC": [third]}))
    assert [_bodies(channel, queue) for queue in (first, second, third)] == [[b"default"]] * 3

    topic = names("topic")
    channel.exchange_declare(topic, "topic")
    channel.queue_bind(first, topic, routing_key="stock.#")
    channel.queue_bind(second, topic, routing_key="weather.*")
    channel.queue_bind(third, topic, routing_key="#")
    channel.basic_publish(topic, "stock.nyse", b"topic", pika.BasicProperties(headers={"CC": ["weather.ny"]}))
    assert [_bodies(channel, queue) for queue in (first, second, third)] == [[b"topic"]] * 3

    fanout = names("fanout")
    channel.exchange_declare(fanout, "fanout")
    channel.queue_bind(first, fanout)
    channel.queue_bind(second, fanout)
    channel.basic_publish(fanout, "k", b"fanout", pika.BasicProperties(headers={"CC": ["k2", "k3"], "BCC": ["k4"]}))
    assert [_bodies(channel, queue) for queue in (first, second, third)] == [[b"fanout"], [b"fanout"], []]


def test_mandatory_cc_publish_is_returned_only_when_no_key_routes(shared_broker: Broker, names: Names) -> None:
    """mandatory: a CC or BCC key reaching a queue is enough; with no key routing anywhere the
    message comes back 312 NO_ROUTE with the publish's routing key."""
    connection = shared_broker.connect()
    channel = connection.channel()
    (queue,) = _queues(channel, names, "q")
    nowhere = names("nowhere")
    returned: list[tuple[Any, bytes]] = []
    channel.add_on_return_callback(lambda ch, method, properties, body: returned.append((method, body)))
    channel.basic_publish("", nowhere, b"by bcc", pika.BasicProperties(headers={"BCC": [queue]}), mandatory=True)
    channel.basic_publish("", nowhere, b"lost", pika.BasicProperties(headers={"CC": [nowhere]}), mandatory=True)
    pump_until([connection], lambda: returned, what="basic.return")
    assert _bodies(channel, queue) == [b"by bcc"]
    assert [(method.reply_code, method.routing_key, body) for method, body in returned] == [(312, nowhere, b"lost")]


def test_returned_message_has_no_bcc(shared_broker: Broker, names: Names) -> None:
    """A mandatory publish that routes nowhere comes back by basic.return with BCC removed
    (rabbit_basic strips it before routing) and every other property as published."""
    connection = shared_broker.connect()
    channel = connection.channel()
    returned: list[Any] = []
    channel.add_on_return_callback(lambda ch, method, properties, body: returned.append(properties))
    nowhere = names("nowhere")
    headers = {"CC": [nowhere], "BCC": [nowhere]}
    properties = pika.BasicProperties(headers=headers, expiration="60000", correlation_id="c1")
    channel.basic_publish("", nowhere, b"lost", properties, mandatory=True)
    pump_until([connection], lambda: returned, what="basic.return")
    assert returned[0].headers == {"CC": [nowhere]}
    assert (returned[0].expiration, returned[0].correlation_id) == ("60000", "c1")


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"CC": "not-an-array"}, '{unacceptable_type_in_header,"CC",longstr}'),
        ({"CC": ["fine"], "BCC": {"k": "v"}}, '{unacceptable_type_in_header,"BCC",table}'),
    ],
)
def test_cc_or_bcc_that_is_not_an_array_is_406(
    shared_broker: Broker, names: Names, headers: dict[str, Any], reason: str
) -> None:
    """RabbitMQ (rabbit_basic:header_routes, rabbit_channel): a CC / BCC header that is not an
    array refuses the publish with 406 "invalid message: ..."; nothing is enqueued."""
    connection = shared_broker.connect()
    (queue,) = _queues(connection.channel(), names, "q")
    channel = connection.channel()
    code = channel_close_code(
        connection, channel,
        lambda: channel.basic_publish("", queue, b"refused", pika.BasicProperties(headers=headers)),
    )
    assert code == 406
    assert channel._closing_reason.reply_text == f"PRECONDITION_FAILED - invalid message: {reason}"
    assert ready_count(connection.channel(), queue) == 0


def test_dead_lettered_cc_bcc_message(shared_broker: Broker, names: Names) -> None:
    """Dead-lettering (no x-dead-letter-routing-key): the copy is routed through the DLX by the
    routing key, CC and BCC keys (RabbitMQ keeps the message's routing keys); x-death
    routing-keys lists the routing key and CC keys; BCC stays hidden."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    entry, dlx = names("in"), names("dlx")
    channel.exchange_declare(entry, "direct")
    channel.exchange_declare(dlx, "direct")
    source = names("src")
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": dlx})
    channel.queue_bind(source, entry, routing_key="k")
    by_cc, by_bcc = _queues(channel, names, "by-cc", "by-bcc")
    channel.queue_bind(by_cc, dlx, routing_key="cc-key")
    channel.queue_bind(by_bcc, dlx, routing_key="bcc-key")
    headers = {"CC": ["cc-key"], "BCC": ["bcc-key"]}
    channel.basic_publish(entry, "k", b"dies", pika.BasicProperties(headers=headers))
    method, properties, _ = channel.basic_get(source)
    assert properties.headers == {"CC": ["cc-key"]}
    channel.basic_reject(method.delivery_tag, requeue=False)
    wait_until(lambda: ready_count(channel, by_bcc) == 1, 5.0, "the dead-lettered copy")
    for queue in (by_cc, by_bcc):
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        assert (method.routing_key, body) == ("k", b"dies")
        assert "BCC" not in properties.headers and properties.headers["CC"] == ["cc-key"]
        assert list(properties.headers["x-death"][0]["routing-keys"]) == ["k", "cc-key"]
