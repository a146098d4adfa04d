"""Message TTL (x-message-ttl, per-message expiration) and the timer, as RabbitMQ expires messages."""

from __future__ import annotations

from broker.messages.message import Message
from broker.queues.entry_state import ACQUIRED
from broker.queues.featured.featured_queue import FeaturedQueue
from broker.topology.vhost import VirtualHost
from tests.broker.support import ME, attach, consumer, message


def _ttl_queue(vhost: VirtualHost, ttl: int = 1000, **arguments: object) -> FeaturedQueue:
    q = vhost.declare_queue("q", owner=ME, arguments={"x-message-ttl": ttl, **arguments})
    assert isinstance(q, FeaturedQueue)
    return q


def test_message_is_delivered_before_its_ttl(vhost: VirtualHost) -> None:
    """A message consumed before x-message-ttl has passed is delivered normally."""
    q = _ttl_queue(vhost)
    m = message()
    vhost.publish("", m, now=0.0)
    entry = q.get(now=0.999)
    assert entry is not None and entry.message is m


def test_expired_messages_are_never_delivered(vhost: VirtualHost, dropped: list[Message]) -> None:
    """Once its TTL has passed a message is discarded, not delivered: pull and get return nothing."""
    q = _ttl_queue(vhost)
    c = consumer("c")
    attach(q, c)
    first, second = message(), message()
    vhost.publish("", first, now=0.0)
    vhost.publish("", second, now=0.5)
    assert q.pull(c, 10, now=1.2)[0][0].message is second
    assert q.get(now=1.6) is None
    assert dropped == [first] and q.message_count == 0


def test_per_message_expiration_upgrades_a_plain_queue(vhost: VirtualHost, dropped: list[Message]) -> None:
    """A per-message expiration works on any queue: a plain queue switches storage in place, once."""
    q = vhost.declare_queue("q", owner=ME)
    old = message()
    vhost.publish("", old, now=0.0)
    assert q.plain
    short = message(expiration="100")
    routed, _ = vhost.publish("", short, now=0.0)[:2]
    assert routed == 1 and isinstance(q, FeaturedQueue) and vhost.queues["q"] is q
    assert [e.message for e in q.available_entries()] == [old, short]
    assert q.get(now=0.05).message is old  # type: ignore[union-attr]
    assert q.get(now=0.2) is None and dropped == [short]


def test_upgrade_keeps_acquired_and_released_entries_in_place(vhost: VirtualHost) -> None:
    """Entries acquired before the switch settle and return to their original positions after it."""
    q = vhost.declare_queue("q", owner=ME)
    for _ in range(3):
        vhost.publish("", message())
    first, second = q.get(), q.get()
    assert first and second
    q.release(first)
    vhost.publish("", message(expiration="60000"), now=0.0)
    assert isinstance(q, FeaturedQueue) and second.state is ACQUIRED
    q.release(second)
    assert [e.position for e in q.available_entries()] == [1, 2, 3, 4]
    assert [q.get().position for _ in range(2)] == [1, 2]  # type: ignore[union-attr]
    assert q.message_count == 2


def test_effective_ttl_is_the_smaller_of_queue_and_message_ttl(vhost: VirtualHost, dropped: list[Message]) -> None:
    """With both x-message-ttl and expiration, the lower value applies."""
    q = _ttl_queue(vhost, ttl=1000)
    long, short = message(expiration="5000"), message(expiration="200")
    vhost.publish("", long, now=0.0)
    vhost.publish("", short, now=0.0)
    assert q.next_deadline() == 1.0
    vhost.tick(1.0)
    assert dropped == [long, short]


def test_per_message_ttl_expires_only_at_the_head(vhost: VirtualHost, dropped: list[Message]) -> None:
    """Expired per-message-TTL messages queue up behind unexpired ones until those are consumed."""
    q = vhost.declare_queue("q", owner=ME)
    long, short = message(expiration="10000"), message(expiration="1000")
    vhost.publish("", long, now=0.0)
    vhost.publish("", short, now=0.0)
    vhost.tick(5.0)
    assert q.message_count == 2 and dropped == []
    assert q.get(now=5.0).message is long  # type: ignore[union-attr]
    assert q.get(now=5.0) is None and dropped == [short]


def test_publish_expires_the_head_of_a_ttl_queue(vhost: VirtualHost, dropped: list[Message]) -> None:
    """Publishing to a queue whose head has expired discards it without waiting for the timer."""
    q = _ttl_queue(vhost)
    stale = message()
    vhost.publish("", stale, now=0.0)
    vhost.publish("", message(), now=2.0)
    assert q.message_count == 1 and dropped == [stale]


def test_requeued_message_keeps_its_original_expiry(vhost: VirtualHost, dropped: list[Message]) -> None:
    """A requeued message keeps the expiry it got when published, and is dropped if it has passed."""
    q = _ttl_queue(vhost)
    m = message()
    vhost.publish("", m, now=0.0)
    entry = q.get(now=0.5)
    assert entry is not None
    q.release(entry, now=1.5)
    assert q.message_count == 0 and dropped == [m]


def test_acquired_messages_do_not_expire(vhost: VirtualHost, dropped: list[Message]) -> None:
    """A delivered, unacknowledged message is not expired; acknowledging it settles it normally."""
    q = _ttl_queue(vhost)
    vhost.publish("", message(), now=0.0)
    entry = q.get(now=0.5)
    assert entry is not None
    vhost.tick(10.0)
    assert entry.state is ACQUIRED and dropped == []
    q.settle(entry)
    assert len(dropped) == 1


def test_timer_deadline_is_the_head_expiry(vhost: VirtualHost, dropped: list[Message]) -> None:
    """next_deadline is when the head expires; tick at that time discards it and moves the deadline."""
    q = _ttl_queue(vhost, ttl=1000)
    assert vhost.next_deadline() is None
    vhost.publish("", message(), now=0.0)
    vhost.publish("", message(), now=0.4)
    assert vhost.next_deadline() == 1.0
    assert vhost.tick(0.9).notify == [] and dropped == []
    vhost.tick(1.0)
    assert len(dropped) == 1 and vhost.next_deadline() == 1.4
    vhost.tick(1.4)
    assert q.message_count == 0 and vhost.next_deadline() is None


def test_ttl_zero_expires_on_arrival(vhost: VirtualHost, dropped: list[Message]) -> None:
    """x-message-ttl 0: a message not delivered the instant it arrives expires at once (RabbitMQ discards it)."""
    q = _ttl_queue(vhost, ttl=0)
    m = message()
    assert vhost.publish("", m, now=1.0)[0] == 1
    assert q.message_count == 0 and dropped == [m] and vhost.next_deadline() is None


def test_low_priorities_expire_behind_unexpired_high_priorities(vhost: VirtualHost, dropped: list[Message]) -> None:
    """Priority queues: even per-queue TTL only expires at the head, so low priorities can wait behind high ones."""
    q = vhost.declare_queue("q", owner=ME, arguments={"x-max-priority": 5})
    low, high = message(priority=0, expiration="100"), message(priority=5, expiration="10000")
    vhost.publish("", low, now=0.0)
    vhost.publish("", high, now=0.0)
    vhost.tick(1.0)
    assert q.message_count == 2 and dropped == []
    assert q.get(now=1.0).message is high  # type: ignore[union-attr]
    assert q.get(now=1.0) is None and dropped == [low]


def test_deleted_featured_queue_keeps_a_delivered_message_until_it_is_given_back(
    vhost: VirtualHost, dropped: list[Message]
) -> None:
    """As a plain queue: queue.delete drops ready messages only; a delivered one goes when its
    channel settles or releases it (its body may still be read), neither requeued nor
    dead-lettered."""
    q = _ttl_queue(vhost, 10_000, **{"x-dead-letter-exchange": "amq.fanout"})
    delivered, ready = message(), message()
    vhost.publish("", delivered, now=0.0)
    vhost.publish("", ready, now=0.0)
    entry = q.get(now=0.1)
    assert entry is not None and entry.message is delivered
    vhost.delete_queue("q", owner=ME)
    assert dropped == [ready]
    assert q.release(entry, now=0.2) == []
    assert dropped == [ready, delivered] and q.acquired_count == 0
    q.settle(entry)
    assert dropped == [ready, delivered]
