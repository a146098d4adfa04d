"""The same broker through aio-pika's own API (asyncio, run with asyncio.run inside sync tests:
the test session is in pytest-trio's trio_mode, and aio-pika needs an asyncio loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import aiormq
import pytest

from tests.integration.harness import Broker, worker_of
from tests.integration.pika_helpers import Names

T = TypeVar("T")
SCENARIO_TIMEOUT = 60.0


def _run(scenario: Callable[..., Awaitable[T]], *args: object) -> T:
    return asyncio.run(asyncio.wait_for(scenario(*args), SCENARIO_TIMEOUT))


async def _eventually(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    limit = loop.time() + timeout
    while not predicate():
        if loop.time() >= limit:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.02)


async def _ready_count(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True)
    count = declared.declaration_result.message_count
    assert count is not None
    return count


async def _connections_on_distinct_workers(
    url: str, rounds: int = 8, burst: int = 8
) -> list[aio_pika.abc.AbstractConnection]:
    """One connection on each of workers 0 and 1, opened `burst` at a time (see
    Broker.connections_on_workers for why concurrently)."""
    by_worker: dict[int, aio_pika.abc.AbstractConnection] = {}
    for _ in range(rounds):
        opened = await asyncio.gather(*(aio_pika.connect(url, timeout=10) for _ in range(burst)))
        for connection in opened:
            worker = worker_of(connection)
            if worker in by_worker:
                await connection.close()
            else:
                by_worker[worker] = connection
        if len(by_worker) >= 2:
            return list(by_worker.values())
    for leftover in by_worker.values():
        await leftover.close()
    raise AssertionError(
        f"after {rounds} x {burst} aio-pika connections only workers {sorted(by_worker)} answered"
    )


async def _round_trip(url: str, queue_name: str) -> None:
    publisher_connection, consumer_connection = await _connections_on_distinct_workers(url)
    try:
        consumer_channel = await consumer_connection.channel()
        queue = await consumer_channel.declare_queue(queue_name)
        publisher_channel = await publisher_connection.channel()
        message = aio_pika.Message(
            b"hello", content_type="text/plain", correlation_id="c-1", headers={"n": 1}
        )
        await publisher_channel.default_exchange.publish(message, routing_key=queue_name)

        async with queue.iterator() as messages:
            async for incoming in messages:
                async with incoming.process():  # acks on leaving the block
                    received = incoming
                break
        assert received.body == b"hello"
        assert (received.content_type, received.correlation_id) == ("text/plain", "c-1")
        assert received.headers == {"n": 1}
        assert not received.redelivered

        await consumer_channel.close()  # an unacked message would be requeued here
        for _ in range(10):
            assert await _ready_count(publisher_channel, queue_name) == 0
            await asyncio.sleep(0.05)
    finally:
        await publisher_connection.close()
        await consumer_connection.close()


def test_aio_pika_publish_consume_ack_round_trip(shared_broker: Broker, names: Names) -> None:
    """A message published on one worker's connection is consumed, with its properties, on another worker's
    and acked once."""
    _run(_round_trip, shared_broker.url, names())


async def _confirms(url: str, queue_name: str, unroutable_key: str) -> None:
    connection = await aio_pika.connect(url, timeout=10)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue_name)
        confirmations = await asyncio.gather(
            *(
                channel.default_exchange.publish(aio_pika.Message(f"m{i}".encode()), routing_key=queue_name)
                for i in range(100)
            )
        )
        assert all(isinstance(c, aiormq.spec.Basic.Ack) for c in confirmations), confirmations
        assert await _ready_count(channel, queue_name) == 100

        raising = await connection.channel(publisher_confirms=True, on_return_raises=True)
        direct = await raising.get_exchange("amq.direct")
        with pytest.raises(aio_pika.exceptions.PublishError):
            await direct.publish(aio_pika.Message(b"lost"), routing_key=unroutable_key, mandatory=True)
    finally:
        await connection.close()


def test_aio_pika_publisher_confirms(shared_broker: Broker, names: Names) -> None:
    """With publisher confirms each of 100 pipelined publishes is acked, and a mandatory unroutable one is returned."""
    _run(_confirms, shared_broker.url, names(), names("nowhere"))


async def _basic_get(url: str, queue_name: str) -> None:
    connection = await aio_pika.connect(url, timeout=10)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(queue_name)
        assert await queue.get(fail=False) is None
        for body in (b"a", b"b"):
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue_name)
        first = await queue.get(no_ack=False)
        assert first.body == b"a"
        await first.ack()
        second = await queue.get(no_ack=True)
        assert second.body == b"b"
        with pytest.raises(aio_pika.exceptions.QueueEmpty):
            await queue.get()
    finally:
        await connection.close()


def test_aio_pika_basic_get(shared_broker: Broker, names: Names) -> None:
    """Queue.get returns messages in order and None / QueueEmpty (get-empty) once the queue is drained."""
    _run(_basic_get, shared_broker.url, names())


async def _qos(url: str, queue_name: str) -> None:
    connection = await aio_pika.connect(url, timeout=10)
    try:
        publisher = await connection.channel(publisher_confirms=True)
        await publisher.declare_queue(queue_name)
        for i in range(10):
            await publisher.default_exchange.publish(
                aio_pika.Message(f"m{i}".encode()), routing_key=queue_name
            )

        channel = await connection.channel()
        await channel.set_qos(prefetch_count=3)
        queue = await channel.declare_queue(queue_name)
        held: list[aio_pika.abc.AbstractIncomingMessage] = []

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            held.append(message)

        await queue.consume(on_message)
        await _eventually(lambda: len(held) >= 3, 10, "3 deliveries")
        await asyncio.sleep(0.5)
        assert len(held) == 3
        assert await _ready_count(publisher, queue_name) == 7

        await held[0].ack()
        await _eventually(lambda: len(held) >= 4, 10, "a 4th delivery after one ack")
        await asyncio.sleep(0.5)
        assert len(held) == 4
        assert [m.body for m in held] == [f"m{i}".encode() for i in range(4)]
    finally:
        await connection.close()


def test_aio_pika_qos_prefetch(shared_broker: Broker, names: Names) -> None:
    """Channel.set_qos(prefetch_count=3) caps unacked deliveries at 3 until one is acked."""
    _run(_qos, shared_broker.url, names())
