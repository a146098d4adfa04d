"""x-single-active-consumer as RabbitMQ 3.10's classic queues do it."""

from __future__ import annotations

import pytest

from broker.errors import AccessRefused
from broker.queues.consumer_manager import NOT_INTERESTED
from broker.queues.consumer_modes import SingleActiveConsumer
from broker.queues.queue import Queue
from broker.topology.vhost import VirtualHost
from tests.broker.support import ME, attach, consumer, fill, keys, message

SAC = {"x-single-active-consumer": True}


def _sac_queue(vhost: VirtualHost, **arguments: object) -> Queue:
    q = vhost.declare_queue("q", owner=ME, arguments={**SAC, **arguments})
    assert isinstance(q.single_active, SingleActiveConsumer)
    return q


def test_only_the_first_consumer_gets_messages(vhost: VirtualHost) -> None:
    """One consumer at a time is active: the first registered; the others get nothing."""
    q = _sac_queue(vhost)
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    assert q.active_consumer is a and q.consumer_count == 2
    for _ in range(3):
        assert vhost.publish("", message())[1] in ([a], [])
    assert b.state is NOT_INTERESTED
    assert q.pull(b, 10) == ([], False)
    assert len(q.pull(a, 10)[0]) == 3


def test_next_consumer_takes_over_when_the_active_one_cancels(vhost: VirtualHost) -> None:
    """When the active consumer goes, the next in line becomes active and is notified of waiting work."""
    q = _sac_queue(vhost)
    a, b, c = consumer("a"), consumer("b"), consumer("c")
    attach(q, a, b, c)
    fill(q, 2)
    assert keys(vhost.remove_consumer(q, a)) == ["b"]
    assert q.active_consumer is b
    assert len(q.pull(b, 10)[0]) == 2
    assert vhost.remove_consumer(q, c) == [] and q.active_consumer is b


def test_priority_picks_the_successor_but_does_not_preempt(vhost: VirtualHost) -> None:
    """RabbitMQ 3.10: a higher-priority consumer does not take over, but is next when the active one goes."""
    q = _sac_queue(vhost)
    first, low, high = consumer("first", 0), consumer("low", 1), consumer("high", 5)
    attach(q, first, low, high)
    assert q.active_consumer is first
    vhost.remove_consumer(q, first)
    assert q.active_consumer is high
    vhost.remove_consumer(q, high)
    assert q.active_consumer is low


def test_waiting_consumer_interest_is_kept_for_takeover(vhost: VirtualHost) -> None:
    """A waiting consumer that is not interested when it takes over is not notified until it is."""
    q = _sac_queue(vhost)
    a, b = consumer("a"), consumer("b")
    attach(q, a)
    attach(q, b, interested=False)
    fill(q, 1)
    assert vhost.remove_consumer(q, a) == []
    assert q.active_consumer is b and b.state is NOT_INTERESTED
    assert keys(q.set_notify_work_desired(b, True)) == ["b"]


def test_exclusive_consume_on_a_single_active_consumer_queue_is_refused(vhost: VirtualHost) -> None:
    """basic.consume exclusive on such a queue: 403 "queue 'q' in vhost '/' in exclusive use"."""
    q = _sac_queue(vhost)
    with pytest.raises(AccessRefused, match=r"^queue 'q' in vhost '/' in exclusive use$"):
        q.add_consumer(consumer("x", exclusive=True))


def test_single_active_consumer_works_with_featured_storage(vhost: VirtualHost) -> None:
    """Single active consumer combines with priorities: only the active consumer pulls, highest first."""
    q = _sac_queue(vhost, **{"x-max-priority": 5})
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    low, high = message(priority=1), message(priority=5)
    vhost.publish("", low)
    vhost.publish("", high)
    assert q.pull(b, 10) == ([], False)
    assert [e.message for e in q.pull(a, 10)[0]] == [high, low]
