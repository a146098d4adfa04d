"""Dead-lettering through pika, as RabbitMQ 3.10 does it: what is dead-lettered (rejected,
nacked, expired, requeued after expiry), where it goes (x-dead-letter-exchange /
-routing-key), the x-death / x-first-death-* headers it gets, and cycles."""

from __future__ import annotations

import time
from typing import Any

import pika
import pika.exceptions

from tests.integration.harness import Broker, wait_until
from tests.integration.pika_helpers import Names, pump, pump_until, ready_count
from tests.integration.queue_helpers import (
    _assert_death,
    _bodies,
    _dead_letter_queue,
    _get,
    _wait_for_messages,
)

# --------------------------------------------------------------------------- expiry


def test_expired_message_is_dead_lettered_with_x_death(shared_broker: Broker, names: Names) -> None:
    """With a dead-letter exchange, an expired message is republished there with an x-death entry
    (count 1, reason expired, queue, exchange, routing-keys, time), x-first-death-* headers and
    its expiration moved to original-expiration."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    exchange = names("x")
    channel.exchange_declare(exchange, "direct")
    source, dead = _dead_letter_queue(channel, names, {"x-message-ttl": 60_000})
    channel.queue_bind(source, exchange, routing_key="rk")
    channel.basic_publish(exchange, "rk", b"by queue ttl?", pika.BasicProperties(expiration="50"))
    _wait_for_messages(channel, dead, 1, "the expired message to be dead-lettered")

    _, properties, body = _get(channel, dead)
    assert body == b"by queue ttl?"
    assert properties.expiration is None
    headers = properties.headers
    assert len(headers["x-death"]) == 1
    death = headers["x-death"][0]
    _assert_death(death, reason="expired", queue=source, exchange=exchange, routing_keys=["rk"])
    assert death["original-expiration"] == "50"
    assert headers["x-first-death-reason"] == "expired"
    assert headers["x-first-death-queue"] == source
    assert headers["x-first-death-exchange"] == exchange
    assert ready_count(channel, source) == 0


def test_queue_ttl_dead_letters_in_order(shared_broker: Broker, names: Names) -> None:
    """x-message-ttl with a dead-letter exchange dead-letters every expired message, oldest first."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    source, dead = _dead_letter_queue(channel, names, {"x-message-ttl": 50})
    for index in range(5):
        channel.basic_publish("", source, f"m{index}".encode())
    _wait_for_messages(channel, dead, 5, "five expired messages to be dead-lettered")
    assert _bodies(channel, dead) == [f"m{index}".encode() for index in range(5)]


def test_requeued_message_keeps_its_expiry(shared_broker: Broker, names: Names) -> None:
    """A message requeued after its TTL ran out while it was unacked is not delivered again; it is
    dead-lettered with reason expired (RabbitMQ keeps the original expiry on requeue)."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    source, dead = _dead_letter_queue(channel, names, {"x-message-ttl": 200})
    channel.basic_publish("", source, b"held too long")
    method, _, _ = channel.basic_get(source)
    assert method is not None
    time.sleep(0.4)  # the TTL runs out while the message is unacked
    channel.basic_nack(method.delivery_tag, requeue=True)
    _wait_for_messages(channel, dead, 1, "the requeued, expired message to be dead-lettered")
    _, properties, _ = _get(channel, dead)
    assert properties.headers["x-death"][0]["reason"] == "expired"
    method, _, _ = channel.basic_get(source, auto_ack=True)
    assert method is None


def test_dead_letter_cycle_of_expiries_is_dropped(shared_broker: Broker, names: Names) -> None:
    """A queue that dead-letters expired messages back to itself drops a message the second
    time round (RabbitMQ's cycle detection) instead of looping forever."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    queue = names()
    channel.queue_declare(queue, arguments={
        "x-message-ttl": 50, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue,
    })  # fmt: skip
    channel.basic_publish("", queue, b"round trip")
    wait_until(
        lambda: ready_count(channel, queue) == 0,
        10,
        "the cycling message to be dropped",
    )
    time.sleep(0.3)  # several TTLs: a looping message would be back by now
    assert ready_count(channel, queue) == 0
    method, _, _ = channel.basic_get(queue, auto_ack=True)
    assert method is None


# --------------------------------------------------------------------------- rejection


def test_reject_and_nack_without_requeue_dead_letter(shared_broker: Broker, names: Names) -> None:
    """basic.reject and basic.nack with requeue=false dead-letter (reason rejected, original
    exchange and routing key); with requeue=true they do not."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    source, dead = _dead_letter_queue(channel, names, {})
    for body in (b"rejected", b"nacked", b"requeued"):
        channel.basic_publish("", source, body)
    rejected, _, _ = channel.basic_get(source)
    channel.basic_reject(rejected.delivery_tag, requeue=False)
    nacked, _, _ = channel.basic_get(source)
    channel.basic_nack(nacked.delivery_tag, requeue=False)
    requeued, _, _ = channel.basic_get(source)
    channel.basic_nack(requeued.delivery_tag, requeue=True)

    _wait_for_messages(channel, dead, 2)
    got = []
    for _ in range(2):
        _, properties, body = _get(channel, dead)
        got.append(body)
        _assert_death(
            properties.headers["x-death"][0],
            reason="rejected",
            queue=source,
            exchange="",
            routing_keys=[source],
        )
        assert properties.headers["x-first-death-reason"] == "rejected"
    assert got == [b"rejected", b"nacked"]
    assert _bodies(channel, source) == [b"requeued"]


def test_dead_letter_routing_key_replaces_the_routing_key(shared_broker: Broker, names: Names) -> None:
    """x-dead-letter-routing-key routes the dead-lettered copy by that key; without it the
    original routing key is used."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    exchange, dlx = names("x"), names("dlx")
    channel.exchange_declare(exchange, "direct")
    channel.exchange_declare(dlx, "direct")
    by_original, by_replacement = names("by-original"), names("by-replacement")
    channel.queue_declare(by_original)
    channel.queue_declare(by_replacement)
    channel.queue_bind(by_original, dlx, routing_key="orig")
    channel.queue_bind(by_replacement, dlx, routing_key="replaced")
    keeps, replaces = names("keeps"), names("replaces")
    channel.queue_declare(keeps, arguments={"x-dead-letter-exchange": dlx})
    channel.queue_declare(
        replaces,
        arguments={
            "x-dead-letter-exchange": dlx,
            "x-dead-letter-routing-key": "replaced",
        },
    )
    channel.queue_bind(keeps, exchange, routing_key="orig")
    channel.queue_bind(replaces, exchange, routing_key="orig")
    channel.basic_publish(exchange, "orig", b"to both")
    for queue in (keeps, replaces):
        method, _, _ = channel.basic_get(queue)
        channel.basic_reject(method.delivery_tag, requeue=False)
    _wait_for_messages(channel, by_original, 1)
    _wait_for_messages(channel, by_replacement, 1)
    _, kept, _ = _get(channel, by_original)
    _, replaced, _ = _get(channel, by_replacement)
    assert kept.headers["x-death"][0]["queue"] == keeps
    assert replaced.headers["x-death"][0]["queue"] == replaces
    assert list(replaced.headers["x-death"][0]["routing-keys"]) == ["orig"]
    assert ready_count(channel, by_original) == 0 and ready_count(channel, by_replacement) == 0


def test_dead_letter_routing_keys_include_cc_and_dlrk_drops_cc(shared_broker: Broker, names: Names) -> None:
    """x-death routing-keys lists the publish routing key and the CC header's keys; with
    x-dead-letter-routing-key the dead-lettered copy loses its CC header."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    exchange = names("x")
    channel.exchange_declare(exchange, "direct")
    source, dead = _dead_letter_queue(channel, names, {})
    channel.queue_bind(source, exchange, routing_key="rk")
    channel.basic_publish(exchange, "rk", b"copied", pika.BasicProperties(headers={"CC": ["elsewhere"]}))
    method, _, _ = channel.basic_get(source)
    channel.basic_reject(method.delivery_tag, requeue=False)
    _wait_for_messages(channel, dead, 1)
    method, properties, _ = _get(channel, dead)
    assert method.routing_key == dead
    assert "CC" not in properties.headers
    _assert_death(
        properties.headers["x-death"][0],
        reason="rejected",
        queue=source,
        exchange=exchange,
        routing_keys=["rk", "elsewhere"],
    )


def test_repeated_dead_lettering_counts_in_x_death(shared_broker: Broker, names: Names) -> None:
    """Each (queue, reason) has one x-death entry, most recent first; dying again in the same
    queue for the same reason increments its count and moves it to the front."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    ping, pong = names("ping"), names("pong")
    channel.queue_declare(
        ping,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": pong},
    )
    channel.queue_declare(
        pong,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": ping},
    )
    channel.basic_publish("", ping, b"ball")
    for queue in (ping, pong, ping):
        _wait_for_messages(channel, queue, 1)
        method, _, _ = channel.basic_get(queue)
        channel.basic_reject(method.delivery_tag, requeue=False)
    _wait_for_messages(channel, pong, 1)
    _, properties, body = _get(channel, pong)
    assert body == b"ball"
    deaths = properties.headers["x-death"]
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [
        (ping, "rejected", 2),
        (pong, "rejected", 1),
    ]
    assert list(deaths[0]["routing-keys"]) == [ping]  # the first death's, kept
    assert properties.headers["x-first-death-queue"] == ping


def test_dead_letter_exchange_that_does_not_exist_drops_quietly(shared_broker: Broker, names: Names) -> None:
    """A queue whose dead-letter exchange does not exist drops a rejected message without error."""
    connection = shared_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    queue = names()
    channel.queue_declare(queue, arguments={"x-dead-letter-exchange": names("missing-dlx")})
    channel.basic_publish("", queue, b"nowhere to go")
    method, _, _ = channel.basic_get(queue)
    channel.basic_reject(method.delivery_tag, requeue=False)
    pump([connection], 0.2)
    assert channel.is_open
    assert ready_count(channel, queue) == 0


def test_dead_lettered_large_body_survives_its_publisher_across_workers(
    shared_broker: Broker, names: Names
) -> None:
    """A multi-frame message that expires after its publisher's connection closed is
    dead-lettered intact to a consumer on another worker."""
    publisher, consumer = shared_broker.connections_on_distinct_workers(2)
    body = bytes(range(256)) * 1200  # 300 KiB: several frames at the default frame_max
    channel = publisher.channel()
    channel.confirm_delivery()
    source, dead = _dead_letter_queue(channel, names, {"x-message-ttl": 200})
    channel.basic_publish("", source, body, pika.BasicProperties(headers={"kept": "yes"}))
    publisher.close()
    received: list[tuple[bytes, dict[str, Any]]] = []
    consuming = consumer.channel()
    consuming.basic_consume(dead, lambda ch, m, p, b: received.append((b, p.headers)), auto_ack=True)
    pump_until([consumer], lambda: received, 10, "the dead-lettered message")
    got, headers = received[0]
    assert got == body
    assert headers["kept"] == "yes"
    assert headers["x-death"][0]["reason"] == "expired"
