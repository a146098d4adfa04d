"""Client library patterns that lean on RabbitMQ's exact behaviour.

aio-pika's RPC pattern (``aio_pika.patterns.RPC``) closes by cancelling its result consumer
(the auto-delete result queue goes, and the auto-delete ``rpc.dlx`` exchange with its last
binding) and then unbinding that queue from ``rpc.dlx``; RabbitMQ answers unbind-ok although
both are gone. The unbind / auto-delete table below is what rabbitmq-server 3.10.8 answered,
step by step, side by side with Shoal (perf.brokers.RabbitBroker). Then kombu with prefetch 1
acking from another thread, as celery's worker pool does."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
import pytest
from kombu import Connection, Consumer, Producer, Queue

from tests.integration.harness import Broker

SCENARIO_TIMEOUT = 30.0
NEXT_MESSAGE_GUARD = 5.0  # a hang guard per round, never a timing assertion

Step = Callable[[Any, str], None]


def _outcome(connection: pika.BlockingConnection, step: Step, tag: str) -> str:
    channel = connection.channel()
    try:
        step(channel, tag)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return str(exc.reply_code)
    channel.close()
    return "ok"


def _bound_then_unbound(ch: Any, t: str) -> None:
    ch.exchange_declare(f"ad-{t}", "headers", auto_delete=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    args = {"From": queue, "x-match": "any"}
    ch.queue_bind(queue, f"ad-{t}", "", arguments=args)
    ch.queue_unbind(queue, f"ad-{t}", "", arguments=args)


def _queue_goes_with_its_consumer(ch: Any, t: str) -> None:
    ch.exchange_declare(f"ad-{t}", "headers", auto_delete=True)
    queue = ch.queue_declare("", auto_delete=True).method.queue
    ch.queue_bind(queue, f"ad-{t}", "", arguments={"From": queue, "x-match": "any"})
    ch.basic_cancel(ch.basic_consume(queue, lambda *_: None))


def _queue_deleted(ch: Any, t: str) -> None:
    ch.exchange_declare(f"ad-{t}", "direct", auto_delete=True)
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(queue, f"ad-{t}", "k")
    ch.queue_delete(queue)


def _e2e_unbound(ch: Any, t: str) -> None:
    ch.exchange_declare(f"ad-{t}", "direct", auto_delete=True)
    ch.exchange_declare(f"dst-{t}", "fanout", auto_delete=False)
    ch.exchange_bind(f"dst-{t}", f"ad-{t}", "k")
    ch.exchange_unbind(f"dst-{t}", f"ad-{t}", "k")


def _e2e_destination_deleted(ch: Any, t: str) -> None:
    ch.exchange_declare(f"ad-{t}", "direct", auto_delete=True)
    ch.exchange_declare(f"dst-{t}", "fanout", auto_delete=False)
    ch.exchange_bind(f"dst-{t}", f"ad-{t}", "k")
    ch.exchange_delete(f"dst-{t}")


def _destination_only(ch: Any, t: str) -> None:
    ch.exchange_declare(f"ad-{t}", "fanout", auto_delete=True)
    ch.exchange_bind(f"ad-{t}", "amq.direct", f"k-{t}")
    ch.exchange_unbind(f"ad-{t}", "amq.direct", f"k-{t}")


def _never_bound(ch: Any, t: str) -> None:
    ch.exchange_declare(f"ad-{t}", "direct", auto_delete=True)


def _exclusive_queue(ch: Any) -> str:
    return str(ch.queue_declare("", exclusive=True).method.queue)


# (what, the steps, rabbitmq-server 3.10.8's answer, does auto-delete exchange ad-<tag> exist after)
AUTO_DELETE = [
    ("last queue binding unbound", _bound_then_unbound, "ok", False),
    ("auto-delete queue gone with its last consumer", _queue_goes_with_its_consumer, "ok", False),
    ("bound queue deleted", _queue_deleted, "ok", False),
    ("last exchange-to-exchange binding unbound", _e2e_unbound, "ok", False),
    ("destination exchange of its last binding deleted", _e2e_destination_deleted, "ok", False),
    ("bound as a destination only, then unbound", _destination_only, "ok", True),
    ("never bound", _never_bound, "ok", True),
]

UNBIND: list[tuple[str, Step, str]] = [
    ("queue.unbind, no such exchange", lambda ch, t: ch.queue_unbind(_exclusive_queue(ch), f"no-{t}", "k"), "ok"),
    ("queue.unbind, no such queue", lambda ch, t: ch.queue_unbind(f"no-{t}", "amq.direct", "k"), "ok"),
    ("queue.unbind, neither", lambda ch, t: ch.queue_unbind(f"no-{t}", f"no-{t}", "k"), "ok"),
    ("queue.unbind, no such binding", lambda ch, t: ch.queue_unbind(_exclusive_queue(ch), "amq.direct", t), "ok"),
    ("queue.unbind, the default exchange", lambda ch, t: ch.queue_unbind(_exclusive_queue(ch), "", "k"), "403"),
    ("exchange.unbind, no such source", lambda ch, t: ch.exchange_unbind("amq.fanout", f"no-{t}", "k"), "ok"),
    ("exchange.unbind, no such destination", lambda ch, t: ch.exchange_unbind(f"no-{t}", "amq.direct", "k"), "ok"),
    ("exchange.unbind, neither", lambda ch, t: ch.exchange_unbind(f"no-{t}", f"no-{t}", "k"), "ok"),
    ("exchange.unbind, no such binding", lambda ch, t: ch.exchange_unbind("amq.fanout", "amq.direct", t), "ok"),
    ("queue.bind, no such exchange", lambda ch, t: ch.queue_bind(_exclusive_queue(ch), f"no-{t}", "k"), "404"),
    ("queue.delete, no such queue", lambda ch, t: ch.queue_delete(f"no-{t}"), "ok"),
    ("exchange.delete, no such exchange", lambda ch, t: ch.exchange_delete(f"no-{t}"), "ok"),
]


@pytest.mark.parametrize(("what", "step", "answer", "remains"), AUTO_DELETE, ids=[a[0] for a in AUTO_DELETE])
def test_an_auto_delete_exchange_goes_with_its_last_binding_as_a_source(
        shared_broker: Broker, what: str, step: Step, answer: str, remains: bool) -> None:
    """An auto-delete exchange is deleted when its last binding *as a source* goes, however
    it goes (rabbit_binding: maybe_auto_delete), and not before it ever had one."""
    connection = shared_broker.connect()
    tag = uuid.uuid4().hex[:8]
    assert _outcome(connection, step, tag) == answer
    exists = _outcome(connection, lambda ch, t: ch.exchange_declare(f"ad-{t}", passive=True), tag)
    assert exists == ("ok" if remains else "404")
    if remains:
        connection.channel().exchange_delete(f"ad-{tag}")
    connection.channel().exchange_delete(f"dst-{tag}")


@pytest.mark.parametrize(("what", "step", "answer"), UNBIND, ids=[u[0] for u in UNBIND])
def test_unbind_and_delete_of_what_is_not_there_answer_as_rabbitmq(
        shared_broker: Broker, what: str, step: Step, answer: str) -> None:
    """Unbinding (queue or exchange) what is not bound, or naming a queue or an exchange that
    does not exist, is unbind-ok (rabbit_binding:remove); bind is still 404 and the default
    exchange 403."""
    connection = shared_broker.connect()
    assert _outcome(connection, step, uuid.uuid4().hex[:8]) == answer


def test_aio_pika_rpc_closes_and_a_new_one_on_the_same_channel_works(shared_broker: Broker) -> None:
    """aio_pika.patterns.RPC: call, close (no NOT_FOUND for rpc.dlx, the channel stays open),
    then a second RPC on the same channel declares rpc.dlx afresh and works too."""
    import aio_pika
    from aio_pika.patterns import RPC

    async def multiply(*, x: int, y: int) -> int:
        return x * y

    async def scenario() -> list[int]:
        connection = await aio_pika.connect(shared_broker.url)
        try:
            channel = await connection.channel()
            results = []
            for factor in (6, 7):
                rpc = await RPC.create(channel)
                await rpc.register("multiply", multiply, auto_delete=True)
                results.append(await rpc.proxy.multiply(x=factor, y=7))
                await rpc.close()
                assert not channel.is_closed
            return results
        finally:
            await connection.close()

    assert asyncio.run(asyncio.wait_for(scenario(), SCENARIO_TIMEOUT)) == [42, 49]


@pytest.mark.deadline(120)
@pytest.mark.parametrize("apply_global", [False, True], ids=["per-consumer", "global (celery)"])
def test_kombu_prefetch_one_acked_from_a_thread_gets_each_next_message_after_the_ack(
        shared_broker: Broker, apply_global: bool) -> None:
    """kombu with prefetch 1 (per consumer, or global as celery asks RabbitMQ for it) acking
    each message from another thread 0.1 s later: after every ack the next message arrives
    while the consumer only waits in drain_events -- never before the ack, and with no further
    client action (each round waits at most NEXT_MESSAGE_GUARD, a hang guard)."""
    url = f"amqp://guest:guest@127.0.0.1:{shared_broker.port}//"
    rounds = 30
    queue = Queue(f"kombu-p1-{uuid.uuid4().hex[:8]}", auto_delete=True)
    received: list[str] = []
    acked = threading.Event()
    early: list[str] = []
    threads: list[threading.Thread] = []

    def ack_later(message: Any) -> None:
        time.sleep(0.1)
        acked.set()
        message.ack()

    def on_message(body: str, message: Any) -> None:
        if received and not acked.is_set():
            early.append(body)
        acked.clear()
        received.append(body)
        thread = threading.Thread(target=ack_later, args=(message,))
        threads.append(thread)
        thread.start()

    with Connection(url) as consuming, Connection(url) as publishing:
        consumer = Consumer(consuming, [queue], callbacks=[on_message])
        consumer.qos(prefetch_count=1, apply_global=apply_global)
        producer = Producer(publishing)
        for i in range(rounds):
            producer.publish(f"m{i}", routing_key=queue.name, declare=[queue])
        consumer.consume()
        while len(received) < rounds:
            before = len(received)
            guard = time.monotonic() + NEXT_MESSAGE_GUARD
            while len(received) == before:
                left = guard - time.monotonic()
                assert left > 0, f"m{before} did not follow the ack of m{before - 1}"
                consuming.drain_events(timeout=left)  # socket.timeout: nothing came at all
        for thread in threads:
            thread.join(10)
        consumer.cancel()
    assert received == [f"m{i}" for i in range(rounds)]
    assert early == [], "prefetch 1: a message arrived before the previous one was acked"
