"""Queue arguments through pika: message TTL and per-message expiration, x-expires, length limits
with each x-overflow mode, priority queues, single active consumer and the delivery limit.

Dead-lettering itself (x-death and friends) is in test_features_deadletter.py; the helpers both
use are in queue_helpers.py."""

from __future__ import annotations

import time
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.integration.harness import Broker, wait_until
from tests.integration.pika_helpers import Names, pump, pump_until, queue_exists, ready_count
from tests.integration.queue_helpers import (
    _assert_death,
    _bodies,
    _dead_letter_queue,
    _get,
    _wait_for_messages,
)

# --------------------------------------------------------------------------- TTL and expiry


def test_message_ttl_expired_messages_are_never_delivered(shared_broker: Broker, names: Names) -> None:
    """Messages older than the queue's x-message-ttl are discarded, never delivered, while a
    message published after them is delivered."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    queue = names()
    channel.queue_declare(queue, arguments={"x-message-ttl": 100})
    for index in range(3):
        channel.basic_publish("", queue, f"stale {index}".encode())
    wait_until(
        lambda: ready_count(channel, queue) == 0,
        10,
        "the expired messages to be discarded",
    )
    method, _, _ = channel.basic_get(queue, auto_ack=True)
    assert method is None
    channel.basic_publish("", queue, b"fresh")
    assert _bodies(channel, queue) == [b"fresh"]


def test_per_message_expiration_skips_the_expired_message(shared_broker: Broker, names: Names) -> None:
    """A message whose `expiration` property has passed is not delivered to a consumer; the
    message behind it, without an expiration, is."""
    connection = shared_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    queue = names()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"short-lived", pika.BasicProperties(expiration="50"))
    channel.basic_publish("", queue, b"keeper")
    time.sleep(0.3)  # let the first one expire
    received: list[bytes] = []
    channel.basic_consume(queue, lambda ch, m, p, body: received.append(body), auto_ack=True)
    pump_until([connection], lambda: received, 10, "a delivery")
    pump([connection], 0.2)
    assert received == [b"keeper"]


def test_zero_ttl_message_goes_to_a_waiting_consumer(shared_broker: Broker, names: Names) -> None:
    """A TTL of 0 expires a message on arrival unless a consumer can take it at once (RabbitMQ's
    replacement for the immediate flag): a waiting consumer gets it, basic.get never does."""
    connection = shared_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    by_queue, by_message, unconsumed = names("queue-ttl"), names("message-ttl"), names("unconsumed")
    channel.queue_declare(by_queue, arguments={"x-message-ttl": 0})
    channel.queue_declare(by_message)
    channel.queue_declare(unconsumed, arguments={"x-message-ttl": 0})
    received: list[bytes] = []
    consumer = connection.channel()
    for queue in (by_queue, by_message):
        consumer.basic_consume(queue, lambda ch, m, p, body: received.append(body), auto_ack=True)
    channel.basic_publish("", by_queue, b"queue ttl 0")
    channel.basic_publish("", by_message, b"expiration 0", pika.BasicProperties(expiration="0"))
    channel.basic_publish("", unconsumed, b"nobody waiting")
    pump_until([connection], lambda: len(received) == 2, 3, "both zero-TTL messages at the consumer")
    assert sorted(received) == [b"expiration 0", b"queue ttl 0"]
    method, _, _ = channel.basic_get(unconsumed, auto_ack=True)
    assert method is None


def _zero_ttl_dead_lettered(channel: Any, dead: str, body: bytes, source: str) -> None:
    """`body` reached the dead-letter queue `dead`, expired from `source` (x-death reason expired)."""
    _wait_for_messages(channel, dead, 1, f"{body!r} to be dead-lettered")
    _, properties, got = _get(channel, dead)
    assert got == body
    death = properties.headers["x-death"][0]
    _assert_death(death, reason="expired", queue=source, exchange="", routing_keys=[source])
    assert properties.headers["x-first-death-reason"] == "expired"


def test_undeliverable_zero_ttl_message_is_dead_lettered_expired(shared_broker: Broker, names: Names) -> None:
    """With nobody consuming, a TTL-0 message (queue x-message-ttl 0, or expiration '0' on a queue
    without arguments) expires on arrival: dead-lettered at once with reason expired, never left
    for basic.get."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    by_queue, dead = _dead_letter_queue(channel, names, {"x-message-ttl": 0})
    channel.basic_publish("", by_queue, b"queue ttl 0")
    _zero_ttl_dead_lettered(channel, dead, b"queue ttl 0", by_queue)
    by_message, dead_too = names("by-message"), names("dead-too")
    channel.queue_declare(dead_too)
    channel.queue_declare(by_message, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead_too,
    })  # fmt: skip
    channel.basic_publish("", by_message, b"expiration 0", pika.BasicProperties(expiration="0"))
    _zero_ttl_dead_lettered(channel, dead_too, b"expiration 0", by_message)
    for queue in (by_queue, by_message):
        assert ready_count(channel, queue) == 0
        assert channel.basic_get(queue, auto_ack=True)[0] is None


def test_zero_ttl_message_skips_a_consumer_with_full_prefetch(shared_broker: Broker, names: Names) -> None:
    """A consumer whose prefetch is full cannot take a TTL-0 message at once: it is dead-lettered
    (expired), and the consumer does not get it once it acks and has credit again."""
    connection = shared_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    source, dead = _dead_letter_queue(channel, names, {"x-message-ttl": 0})
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=1)
    received: list[tuple[int, bytes]] = []
    consumer.basic_consume(source, lambda ch, m, p, body: received.append((m.delivery_tag, body)))
    channel.basic_publish("", source, b"first")  # delivered at once: the prefetch is now full
    pump_until([connection], lambda: received, 5, "the first message at the consumer")
    channel.basic_publish("", source, b"while full")
    _zero_ttl_dead_lettered(channel, dead, b"while full", source)
    consumer.basic_ack(received[0][0])
    pump([connection], 0.3)
    assert [body for _, body in received] == [b"first"]
    assert ready_count(channel, dead) == 0  # "first" was delivered, not dead-lettered


def test_zero_ttl_message_is_not_kept_for_a_later_consumer(shared_broker: Broker, names: Names) -> None:
    """A TTL-0 message published before anyone consumes is gone: a consumer that arrives later gets
    nothing (it is dead-lettered instead), while one published after it subscribed reaches it."""
    connection = shared_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    source, dead = _dead_letter_queue(channel, names, {})
    channel.basic_publish("", source, b"too early", pika.BasicProperties(expiration="0"))
    _zero_ttl_dead_lettered(channel, dead, b"too early", source)
    received: list[bytes] = []
    consumer = connection.channel()
    consumer.basic_consume(source, lambda ch, m, p, body: received.append(body), auto_ack=True)
    pump([connection], 0.3)
    assert received == []
    channel.basic_publish("", source, b"in time", pika.BasicProperties(expiration="0"))
    pump_until([connection], lambda: received, 5, "the message published after the consumer came")
    pump([connection], 0.2)
    assert received == [b"in time"] and ready_count(channel, dead) == 0


def test_invalid_expiration_is_406(shared_broker: Broker, names: Names) -> None:
    """A publish whose expiration property is not a non-negative integer string closes the
    channel with 406 PRECONDITION_FAILED ("invalid expiration ...")."""
    connection = shared_broker.connect()
    queue = names()
    connection.channel().queue_declare(queue)
    for expiration, term in (("abc", "no_integer"), ("-1", "{value_negative,-1}")):
        channel = connection.channel()
        channel.confirm_delivery()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as caught:
            channel.basic_publish("", queue, b"x", pika.BasicProperties(expiration=expiration))
        assert caught.value.reply_code == 406
        assert caught.value.reply_text == f"PRECONDITION_FAILED - invalid expiration '{expiration}': {term}"
    assert ready_count(connection.channel(), queue) == 0


def test_unused_queue_expires(shared_broker: Broker, names: Names) -> None:
    """A queue with x-expires is deleted once it has had no consumers (and no use) for that long,
    but not while it has a consumer."""
    connection = shared_broker.connect()
    channel = connection.channel()
    idle, consumed = names("idle"), names("consumed")
    channel.queue_declare(idle, arguments={"x-expires": 300})
    channel.queue_declare(consumed, arguments={"x-expires": 300})
    tag = channel.basic_consume(consumed, lambda *args: None)
    # A passive declare counts as a use and restarts the timer (as in RabbitMQ): look less often.
    wait_until(
        lambda: not queue_exists(connection, idle),
        10,
        "the unused queue to expire",
        interval=0.6,
    )
    assert queue_exists(connection, consumed), "a queue with a consumer expired"
    channel.basic_cancel(tag)
    wait_until(
        lambda: not queue_exists(connection, consumed),
        10,
        "the queue to expire after its consumer left",
        interval=0.6,
    )


# --------------------------------------------------------------------------- length limits


def test_max_length_drop_head_drops_the_oldest(shared_broker: Broker, names: Names) -> None:
    """x-max-length (default overflow drop-head) keeps the newest messages; x-max-length-bytes
    counts body bytes the same way."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    by_count, by_bytes = names("count"), names("bytes")
    channel.queue_declare(by_count, arguments={"x-max-length": 2})
    channel.queue_declare(by_bytes, arguments={"x-max-length-bytes": 10, "x-overflow": "drop-head"})
    for body in (b"one", b"two", b"three"):
        channel.basic_publish("", by_count, body)
    for body in (b"aaaaa", b"bbbbb", b"ccccc"):
        channel.basic_publish("", by_bytes, body)
    assert _bodies(channel, by_count) == [b"two", b"three"]
    assert _bodies(channel, by_bytes) == [b"bbbbb", b"ccccc"]


def test_max_length_drop_head_dead_letters_with_reason_maxlen(shared_broker: Broker, names: Names) -> None:
    """With a dead-letter exchange, the message drop-head pushes out is dead-lettered with reason maxlen."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    source, dead = _dead_letter_queue(channel, names, {"x-max-length": 1})
    channel.basic_publish("", source, b"old")
    channel.basic_publish("", source, b"new")
    _wait_for_messages(channel, dead, 1)
    _, properties, body = _get(channel, dead)
    assert body == b"old"
    _assert_death(
        properties.headers["x-death"][0],
        reason="maxlen",
        queue=source,
        exchange="",
        routing_keys=[source],
    )
    assert _bodies(channel, source) == [b"new"]


def test_reject_publish_nacks_the_new_message(shared_broker: Broker, names: Names) -> None:
    """x-overflow reject-publish refuses a message that would exceed the limit: a publisher in
    confirm mode gets basic.nack, the queue keeps the old messages, nothing is dead-lettered."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    source, dead = _dead_letter_queue(channel, names, {"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.basic_publish("", source, b"fits")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", source, b"refused")
    assert _bodies(channel, source) == [b"fits"]
    channel.basic_publish("", source, b"room again")  # acked now that the queue has room
    assert _bodies(channel, source) == [b"room again"]
    assert ready_count(channel, dead) == 0


def test_reject_publish_on_one_queue_nacks_but_others_keep_the_message(
    shared_broker: Broker, names: Names
) -> None:
    """A message routed to a full reject-publish queue and to another queue is nacked to the
    publisher, while the other queue still gets it."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    exchange, full, roomy = names("x"), names("full"), names("roomy")
    channel.exchange_declare(exchange, "fanout")
    channel.queue_declare(full, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    channel.queue_declare(roomy)
    channel.queue_bind(full, exchange)
    channel.queue_bind(roomy, exchange)
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish(exchange, "", b"half welcome")
    assert _bodies(channel, roomy) == [b"half welcome"]
    assert ready_count(channel, full) == 0


def test_reject_publish_dlx_nacks_and_dead_letters(shared_broker: Broker, names: Names) -> None:
    """x-overflow reject-publish-dlx nacks the refused message and dead-letters it (reason maxlen)."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    source, dead = _dead_letter_queue(channel, names, {"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    channel.basic_publish("", source, b"fits")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", source, b"refused")
    _wait_for_messages(channel, dead, 1)
    _, properties, body = _get(channel, dead)
    assert body == b"refused"
    _assert_death(
        properties.headers["x-death"][0],
        reason="maxlen",
        queue=source,
        exchange="",
        routing_keys=[source],
    )
    assert _bodies(channel, source) == [b"fits"]


# --------------------------------------------------------------------------- priorities


def test_priority_queue_delivers_higher_priority_first(shared_broker: Broker, names: Names) -> None:
    """In an x-max-priority queue higher priorities come first, FIFO within a priority; no
    priority counts as 0 and a priority above the maximum counts as the maximum."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    queue = names()
    channel.queue_declare(queue, arguments={"x-max-priority": 10})
    published = [
        ("low-a", 0),
        ("mid-a", 5),
        ("mid-b", 5),
        ("high", 9),
        ("none", None),
        ("over-max", 200),
        ("low-b", 0),
    ]
    for body, priority in published:
        channel.basic_publish("", queue, body.encode(), pika.BasicProperties(priority=priority))
    order = [body.decode() for body in _bodies(channel, queue)]
    assert order == ["over-max", "high", "mid-a", "mid-b", "low-a", "none", "low-b"]


def test_priority_queue_requeue_returns_to_its_priority_place(shared_broker: Broker, names: Names) -> None:
    """A message requeued in a priority queue goes back ahead of the rest of its priority, behind
    higher priorities published meanwhile."""
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    queue = names()
    channel.queue_declare(queue, arguments={"x-max-priority": 9})
    for body, priority in (("a", 5), ("b", 5), ("c", 1)):
        channel.basic_publish("", queue, body.encode(), pika.BasicProperties(priority=priority))
    method, _, body = channel.basic_get(queue)
    assert body == b"a"
    channel.basic_publish("", queue, b"d", pika.BasicProperties(priority=9))
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert [body.decode() for body in _bodies(channel, queue)] == ["d", "a", "b", "c"]


def test_priority_queue_consumer_gets_backlog_by_priority(shared_broker: Broker, names: Names) -> None:
    """A consumer with prefetch 1 on a priority queue receives a backlog highest priority first."""
    connection = shared_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    queue = names()
    channel.queue_declare(queue, arguments={"x-max-priority": 5})
    for index, priority in enumerate([1, 3, 5, 3, 1]):
        channel.basic_publish(
            "",
            queue,
            f"p{priority}-{index}".encode(),
            pika.BasicProperties(priority=priority),
        )
    received: list[str] = []

    def on_message(ch: Any, method: Any, properties: Any, body: bytes) -> None:
        received.append(body.decode())
        ch.basic_ack(method.delivery_tag)

    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(queue, on_message)
    pump_until([connection], lambda: len(received) == 5, 10, "five deliveries")
    assert received == ["p5-2", "p3-1", "p3-3", "p1-0", "p1-4"]


# --------------------------------------------------------------------------- single active consumer, delivery limit


def test_single_active_consumer_gets_everything_until_it_cancels(shared_broker: Broker, names: Names) -> None:
    """With x-single-active-consumer only the first consumer receives messages, however many
    others subscribe; when it cancels, the next one takes over."""
    connection = shared_broker.connect()
    publisher = connection.channel()
    publisher.confirm_delivery()
    queue = names()
    publisher.queue_declare(queue, arguments={"x-single-active-consumer": True})
    received: dict[str, list[bytes]] = {"first": [], "second": [], "third": []}
    channels, tags = {}, {}
    for label, bodies in received.items():
        channels[label] = connection.channel()
        tags[label] = channels[label].basic_consume(
            queue,
            lambda ch, m, p, body, bodies=bodies: bodies.append(body),
            auto_ack=True,
        )
    for index in range(10):
        publisher.basic_publish("", queue, f"a{index}".encode())
    pump_until(
        [connection],
        lambda: sum(map(len, received.values())) == 10,
        10,
        "ten deliveries",
    )
    pump([connection], 0.2)
    assert received == {
        "first": [f"a{i}".encode() for i in range(10)],
        "second": [],
        "third": [],
    }

    channels["first"].basic_cancel(tags["first"])
    for index in range(5):
        publisher.basic_publish("", queue, f"b{index}".encode())
    pump_until(
        [connection],
        lambda: sum(map(len, received.values())) == 15,
        10,
        "five more deliveries",
    )
    pump([connection], 0.2)
    assert received["second"] == [f"b{i}".encode() for i in range(5)]
    assert received["third"] == []


def test_single_active_consumer_handover_when_its_connection_closes(
    shared_broker: Broker, names: Names
) -> None:
    """When the single active consumer's connection goes, its unacked messages and all new ones
    go to the consumer that was waiting, on another connection."""
    active, waiting = shared_broker.connections_on_distinct_workers(2)
    queue = names()
    active_channel = active.channel()
    active_channel.queue_declare(queue, arguments={"x-single-active-consumer": True})
    active_got: list[bytes] = []
    waiting_got: list[tuple[bytes, bool]] = []
    active_channel.basic_consume(queue, lambda ch, m, p, body: active_got.append(body))
    waiting_channel = waiting.channel()
    waiting_channel.basic_consume(
        queue,
        lambda ch, m, p, body: (
            waiting_got.append((body, m.redelivered)),
            ch.basic_ack(m.delivery_tag),
        ),
    )
    publisher = waiting.channel()
    publisher.confirm_delivery()
    publisher.basic_publish("", queue, b"first")
    pump_until([active, waiting], lambda: active_got, 10, "the active consumer's delivery")
    pump([active, waiting], 0.2)
    assert active_got == [b"first"] and waiting_got == []

    active.close()
    publisher.basic_publish("", queue, b"second")
    pump_until(
        [waiting],
        lambda: len(waiting_got) == 2,
        10,
        "both messages at the waiting consumer",
    )
    assert waiting_got == [(b"first", True), (b"second", False)]


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_delivery_limit_dead_letters_poison_messages(shared_broker: Broker, queue_type: str) -> None:
    """A message returned more than x-delivery-limit times is dead-lettered (reason
    delivery_limit) instead of requeued; redeliveries carry x-delivery-count (RabbitMQ: quorum
    queues only; Shoal also on a classic queue)."""
    names = Names(f"test_delivery_limit_{queue_type}")  # the fixture's would contain "[...]"
    channel = shared_broker.connect().channel()
    channel.confirm_delivery()
    arguments: dict[str, Any] = {"x-delivery-limit": 2}
    if queue_type == "quorum":
        arguments["x-queue-type"] = "quorum"  # RabbitMQ: quorum queues must be durable
    source, dead = _dead_letter_queue(channel, names, arguments, durable=queue_type == "quorum")
    channel.basic_publish("", source, b"poison")
    seen = []
    for _ in range(3):
        method, properties, body = channel.basic_get(source)
        assert body == b"poison"
        seen.append((method.redelivered, (properties.headers or {}).get("x-delivery-count")))
        channel.basic_nack(method.delivery_tag, requeue=True)
    assert seen[0][0] is False
    assert seen[1:] == [(True, 1), (True, 2)]
    _wait_for_messages(channel, dead, 1, "the poison message to be dead-lettered")
    _, properties, body = _get(channel, dead)
    assert body == b"poison"
    _assert_death(
        properties.headers["x-death"][0],
        reason="delivery_limit",
        queue=source,
        exchange="",
        routing_keys=[source],
    )
    assert ready_count(channel, source) == 0
    method, _, _ = channel.basic_get(source)
    assert method is None
    channel.queue_delete(source)


def test_delivery_limit_counts_returns_by_a_closing_consumer(shared_broker: Broker, names: Names) -> None:
    """A message requeued because its consumer's connection closed counts as returned for
    x-delivery-limit too: with limit 1 the second such return dead-letters it."""
    observer = shared_broker.connect().channel()
    observer.confirm_delivery()
    source, dead = _dead_letter_queue(observer, names, {"x-delivery-limit": 1})
    observer.basic_publish("", source, b"poison")
    seen: list[tuple[bool, Any]] = []

    def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
        seen.append((method.redelivered, (properties.headers or {}).get("x-delivery-count")))

    for attempt in (1, 2):
        connection = shared_broker.connect()
        connection.channel().basic_consume(source, on_message)  # never acks
        pump_until([connection], lambda n=attempt: len(seen) == n, 10, f"delivery {attempt}")
        connection.close()
    assert seen == [(False, None), (True, 1)]
    _wait_for_messages(observer, dead, 1, "the message to be dead-lettered after its second return")
    assert ready_count(observer, source) == 0
