"""x-expires: a queue unused for its lease is deleted by the timer (RabbitMQ queue TTL)."""

from __future__ import annotations

from broker.messages.message import Message
from broker.topology.vhost import VirtualHost
from tests.broker.support import ME, attach, consumer, message

EXPIRES = {"x-expires": 1000}


def test_unused_queue_is_deleted_after_its_lease(vhost: VirtualHost, dropped: list[Message]) -> None:
    """A queue with no consumers, gets or redeclares for x-expires ms is deleted; its messages are dropped."""
    vhost.declare_exchange("dlx", "fanout")
    vhost.declare_queue("q", owner=ME, arguments={**EXPIRES, "x-dead-letter-exchange": "dlx"}, now=0.0)
    vhost.bind_queue("q", "amq.fanout", "", owner=ME)
    m = message()
    vhost.publish("", m, now=0.5)  # publishing does not count as use
    assert vhost.next_deadline() == 1.0
    assert vhost.tick(0.99).deleted_queues == []
    outcome = vhost.tick(1.0)
    assert outcome.deleted_queues == ["q"] and outcome.cancelled == []
    assert "q" not in vhost.queues and dropped == [m] and vhost.dead_lettered == 0
    assert not vhost.exchanges["amq.fanout"].has_bindings and vhost.next_deadline() is None


def test_consumers_keep_the_queue_and_the_lease_restarts_when_they_go(vhost: VirtualHost) -> None:
    """A queue with a consumer is in use; the lease starts again when the last consumer is removed."""
    q = vhost.declare_queue("q", owner=ME, arguments=EXPIRES, now=0.0)
    c = consumer("c")
    attach(q, c)
    assert vhost.tick(5.0).deleted_queues == []
    vhost.advance(6.0)
    vhost.remove_consumer(q, c)
    assert vhost.next_deadline() == 7.0
    assert vhost.tick(6.9).deleted_queues == []
    assert vhost.tick(7.0).deleted_queues == ["q"]


def test_basic_get_and_redeclare_renew_the_lease(vhost: VirtualHost) -> None:
    """basic.get and queue.declare (passive or not) restart the lease."""
    q = vhost.declare_queue("q", owner=ME, arguments=EXPIRES, now=0.0)
    q.get(now=0.8)
    assert vhost.tick(1.0).deleted_queues == []
    vhost.declare_queue("q", owner=ME, arguments=EXPIRES, now=1.5)
    assert vhost.tick(1.8).deleted_queues == []
    vhost.declare_queue("q", owner=ME, passive=True, now=2.4)
    assert vhost.tick(3.3).deleted_queues == []
    assert vhost.next_deadline() == 3.4
    assert vhost.tick(3.4).deleted_queues == ["q"]


def test_expiring_queue_with_a_message_ttl_keeps_both_timers(vhost: VirtualHost, dropped: list[Message]) -> None:
    """x-expires and x-message-ttl together: the earlier deadline fires first, then the other."""
    q = vhost.declare_queue("q", owner=ME, arguments={**EXPIRES, "x-message-ttl": 200}, now=0.0)
    vhost.publish("", message(), now=0.0)
    assert vhost.next_deadline() == 0.2
    vhost.tick(0.2)
    assert q.message_count == 0 and len(dropped) == 1
    assert vhost.next_deadline() == 1.0
    assert vhost.tick(1.0).deleted_queues == ["q"]
