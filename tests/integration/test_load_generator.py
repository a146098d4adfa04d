"""perf's C load generator (perf/cgen/shoalgen.c) against a real broker, in the shape S9u uses:
one consumer, one channel, a basic.consume on each of several queues, their prefetch shared
(basic.qos global=true), each delivery acked on its own. Skipped where the generator cannot be
built (no compiler or no rabbitmq-c)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pika
import pytest

from perf import cgen
from perf.wire import MAGIC, PAYLOAD
from tests.integration.harness import Broker
from tests.integration.pika_helpers import Names

PER_QUEUE = 300


@pytest.fixture(scope="module")
def shoalgen() -> str:
    outcome = cgen.build()
    if outcome.binary is None:
        pytest.skip(f"C generator not available: {outcome.reason}")
    return str(outcome.binary)


@pytest.fixture
def channel(shared_broker: Broker) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    conn = shared_broker.connect()
    yield conn.channel()
    conn.close()


def _started(shoalgen: str, broker: Broker, channel: pika.adapters.blocking_connection.BlockingChannel,
             queues: list[str], prefetch: int) -> cgen.CProcess:  # fmt: skip
    """PER_QUEUE stamped messages in each of ``queues`` (publisher id = the queue's index), and
    a generator consumer on all of them, one channel, global prefetch ``prefetch``, set up."""
    for publisher, queue in enumerate(queues):
        channel.queue_declare(queue)
        for seq in range(PER_QUEUE):
            channel.basic_publish("", queue, PAYLOAD.pack(MAGIC, publisher, seq, time.monotonic_ns()) + b"x" * 40)
    argv = cgen.consumer_argv(
        shoalgen, broker.port, queue=",".join(queues), name="celeryish", prefetch=prefetch, ack_every=1,
        seconds=4, publishers=len(queues), capacity=PER_QUEUE, grace=5, global_qos=True,
    )  # fmt: skip
    consumer = cgen.CProcess("consumer", argv)
    assert consumer.ready.wait(20), consumer.stderr_tail
    return consumer


def _ready(channel: pika.adapters.blocking_connection.BlockingChannel, queues: list[str]) -> list[int]:
    return [channel.queue_declare(q, passive=True).method.message_count for q in queues]


def test_one_channel_consumes_every_queue_with_a_shared_prefetch(
    shoalgen: str, shared_broker: Broker, channel: pika.adapters.blocking_connection.BlockingChannel, names: Names
) -> None:
    queues = [names("a"), names("b"), names("c")]
    consumer = _started(shoalgen, shared_broker, channel, queues, prefetch=8)
    try:
        for queue in queues:  # a consumer on each queue, all on the generator's one connection
            assert channel.queue_declare(queue, passive=True).method.consumer_count == 1
        consumer.go()
        result = consumer.finish(30)
    finally:
        if consumer.alive():
            consumer.stop()
            consumer.finish(5)
    assert result.get("error") is None, result
    assert result["received"] == len(queues) * PER_QUEUE
    assert (result["duplicates"], result["reordered"], result["foreign"]) == (0, 0, 0)
    assert result["acks"] == len(queues) * PER_QUEUE  # one basic.ack (multiple=false) each
    assert result["by_publisher"] == [PER_QUEUE] * len(queues)
    assert _ready(channel, queues) == [0, 0, 0]  # and every one acked: nothing requeued at close
    for queue in queues:
        channel.queue_delete(queue)


def test_the_prefetch_is_the_channels_when_global(
    shoalgen: str, shared_broker: Broker, channel: pika.adapters.blocking_connection.BlockingChannel, names: Names
) -> None:
    """With global=1 the generator asks for basic.qos global=true: two queues, prefetch 5, a
    consumer that never gets "go" (so never acks) holds 5 deliveries in all, not 5 a queue."""
    queues = [names("a"), names("b")]
    consumer = _started(shoalgen, shared_broker, channel, queues, prefetch=5)
    try:
        deadline = time.monotonic() + 10
        while sum(_ready(channel, queues)) != 2 * PER_QUEUE - 5 and time.monotonic() < deadline:
            time.sleep(0.05)  # deliveries flow once basic.consume is ok; wait for them to stop at 5
        time.sleep(0.3)
        assert sum(_ready(channel, queues)) == 2 * PER_QUEUE - 5
    finally:
        consumer.stop()
        consumer.finish(10)
    for queue in queues:
        channel.queue_delete(queue)
