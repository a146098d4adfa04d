"""Publishing: routing through each exchange type, mandatory returns and publisher confirms."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aio_pika
import aiormq
import pika
import pika.exceptions
import pytest

from tests.integration.harness import Broker
from tests.integration.pika_helpers import Names, drain_with_get, pump_until, ready_count


def _declare_bound_queue(channel, queue: str, exchange: str, routing_key: str = "", arguments=None) -> str:
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange, routing_key=routing_key, arguments=arguments)
    return queue


def _bodies_in(channel, queue: str) -> list[bytes]:
    return [body for body, _ in drain_with_get(channel, queue, 100)]


def test_mandatory_unroutable_is_returned(shared_broker: Broker, names: Names) -> None:
    """A mandatory message that no queue takes comes back as basic.return 312 NO_ROUTE (and raises
    UnroutableError under confirms)."""
    routing_key = names("nowhere")
    connection = shared_broker.connect()
    channel = connection.channel()
    returned: list[tuple[Any, bytes]] = []
    channel.add_on_return_callback(lambda ch, method, properties, body: returned.append((method, body)))
    channel.basic_publish("amq.direct", routing_key, b"lost", mandatory=True)
    pump_until([connection], lambda: returned, what="basic.return")
    method, body = returned[0]
    assert (method.reply_code, method.routing_key, body) == (312, routing_key, b"lost")
    assert method.exchange == "amq.direct"

    confirming = connection.channel()
    confirming.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError) as caught:
        confirming.basic_publish("amq.direct", routing_key, b"lost too", mandatory=True)
    assert [message.body for message in caught.value.messages] == [b"lost too"]
    # Not mandatory: confirmed, and no basic.return.
    confirming.basic_publish("amq.direct", routing_key, b"dropped quietly")
    assert len(returned) == 1


async def _aio_publish_confirmed(url: str, queue: str, count: int) -> list[object]:
    connection = await aio_pika.connect(url, timeout=10)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue)
        return await asyncio.gather(
            *(
                channel.default_exchange.publish(aio_pika.Message(f"aio-{i}".encode()), routing_key=queue)
                for i in range(count)
            )
        )
    finally:
        await connection.close()


def test_publisher_confirms_ack_each_publish(shared_broker: Broker, names: Names) -> None:
    """In confirm mode every published message is acknowledged by the broker (pika one by one, aio-pika pipelined)."""
    queue = names("pika")
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    channel.queue_declare(queue)
    for i in range(200):
        channel.basic_publish("", queue, f"m{i}".encode())  # raises NackError on basic.nack
    assert ready_count(channel, queue) == 200

    aio_queue = names("aio")
    confirmations = asyncio.run(
        asyncio.wait_for(_aio_publish_confirmed(shared_broker.url, aio_queue, 50), 60)
    )
    assert len(confirmations) == 50
    assert all(isinstance(c, aiormq.spec.Basic.Ack) for c in confirmations), confirmations
    assert ready_count(channel, aio_queue) == 50


def test_exchange_types_route(shared_broker: Broker, names: Names) -> None:
    """direct routes on equal keys, fanout to every bound queue, topic with * (one word) and # (zero or
    more), headers with x-match all/any."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()

    def publish(exchange: str, routing_key: str, body: bytes, headers=None) -> None:
        channel.basic_publish(exchange, routing_key, body, properties=pika.BasicProperties(headers=headers))

    # direct: the built-in amq.direct and a declared one
    direct = names("direct")
    channel.exchange_declare(direct, "direct")
    key = names("key")
    q_builtin = _declare_bound_queue(channel, names("q-amq.direct"), "amq.direct", key)
    q_direct = _declare_bound_queue(channel, names("q-direct"), direct, "k1")
    publish("amq.direct", key, b"d1")
    publish("amq.direct", key + ".other", b"d2")
    publish(direct, "k1", b"d3")
    publish(direct, "k2", b"d4")
    assert _bodies_in(channel, q_builtin) == [b"d1"]
    assert _bodies_in(channel, q_direct) == [b"d3"]

    # fanout ignores the routing key
    fanout = names("fanout")
    channel.exchange_declare(fanout, "fanout")
    fan_queues = [_declare_bound_queue(channel, names(f"q-fan{i}"), fanout) for i in range(2)]
    publish(fanout, "anything", b"f1")
    assert [_bodies_in(channel, q) for q in fan_queues] == [[b"f1"], [b"f1"]]

    # topic: * is exactly one word, # is zero or more
    topic = names("topic")
    channel.exchange_declare(topic, "topic")
    star = _declare_bound_queue(channel, names("q-star"), topic, "a.*")
    hash_ = _declare_bound_queue(channel, names("q-hash"), topic, "a.#")
    middle = _declare_bound_queue(channel, names("q-middle"), topic, "*.b.#")
    for routing_key in ("a.b", "a.b.c", "a", "x.b", "b.a", "a.x.y"):
        publish(topic, routing_key, routing_key.encode())
    assert _bodies_in(channel, star) == [b"a.b"]
    assert _bodies_in(channel, hash_) == [b"a.b", b"a.b.c", b"a", b"a.x.y"]
    assert _bodies_in(channel, middle) == [b"a.b", b"a.b.c", b"x.b"]

    # headers: amq.match with x-match=all, amq.headers with x-match=any
    v1, v2 = f"v1-{uuid.uuid4().hex}", f"v2-{uuid.uuid4().hex}"
    match_all = _declare_bound_queue(
        channel, names("q-all"), "amq.match", arguments={"x-match": "all", "h1": v1, "h2": v2}
    )
    match_any = _declare_bound_queue(
        channel, names("q-any"), "amq.headers", arguments={"x-match": "any", "h1": v1, "h2": v2}
    )
    publish("amq.match", "", b"both", headers={"h1": v1, "h2": v2, "extra": 1})
    publish("amq.headers", "", b"both", headers={"h1": v1, "h2": v2})
    publish("amq.match", "", b"one", headers={"h1": v1})
    publish("amq.headers", "", b"one", headers={"h1": v1})
    publish("amq.match", "", b"wrong", headers={"h1": v1, "h2": "nope"})
    publish("amq.headers", "", b"wrong", headers={"h1": "nope", "h2": "nope"})
    publish("amq.headers", "", b"none")
    assert _bodies_in(channel, match_all) == [b"both"]
    assert _bodies_in(channel, match_any) == [b"both", b"one"]
