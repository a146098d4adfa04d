"""Priority queues (x-max-priority): higher priority first, FIFO within a priority."""

from __future__ import annotations

from broker.topology.vhost import VirtualHost
from tests.broker.support import ME, attach, consumer, message


def _priority_queue(vhost: VirtualHost, maximum: int = 10):  # type: ignore[no-untyped-def]
    return vhost.declare_queue("q", owner=ME, arguments={"x-max-priority": maximum})


def test_higher_priority_messages_are_delivered_first(vhost: VirtualHost) -> None:
    """Messages with a higher priority are delivered before lower ones, FIFO within one priority."""
    q = _priority_queue(vhost)
    sent = [message(priority=p) for p in (1, 5, None, 5, 1, 9)]
    for m in sent:
        vhost.publish("", m)
    c = consumer("c")
    attach(q, c)
    entries, more = q.pull(c, 10)
    order = [sent.index(e.message) for e in entries]
    assert order == [5, 1, 3, 0, 4, 2] and not more


def test_priority_above_the_maximum_counts_as_the_maximum(vhost: VirtualHost) -> None:
    """A message priority above x-max-priority is treated as x-max-priority; no priority is 0."""
    q = _priority_queue(vhost, maximum=3)
    low, capped, top = message(priority=0), message(priority=200), message(priority=3)
    for m in (low, capped, top):
        vhost.publish("", m)
    assert [q.get().message for _ in range(3)] == [capped, top, low]  # type: ignore[union-attr]


def test_released_message_returns_to_its_place_within_its_priority(vhost: VirtualHost) -> None:
    """A released message goes back before later messages of its priority, after higher priorities."""
    q = _priority_queue(vhost)
    a, b, high = message(priority=2), message(priority=2), message(priority=7)
    vhost.publish("", a)
    vhost.publish("", b)
    first = q.get()
    assert first is not None and first.message is a
    vhost.publish("", high)
    q.release(first)
    assert [q.get().message for _ in range(3)] == [high, a, b]  # type: ignore[union-attr]
    assert first.redelivered


def test_new_message_notifies_one_consumer_in_a_priority_queue(vhost: VirtualHost) -> None:
    """A new message notifies exactly one interested acquiring consumer, as in any queue."""
    q = _priority_queue(vhost)
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    assert vhost.publish("", message(priority=4))[1] == [a]
    assert vhost.publish("", message(priority=1))[1] == [b]


def test_browsers_see_a_priority_queue_in_arrival_order(vhost: VirtualHost) -> None:
    """Browsers walk the queue by position and never rewind (seed 001), whatever the priorities."""
    q = _priority_queue(vhost)
    sent = [message(priority=p) for p in (1, 9, 5)]
    for m in sent:
        vhost.publish("", m)
    browser = consumer("browser", acquiring=False)
    attach(q, browser)
    seen, more = q.pull(browser, 2)
    assert [e.message for e in seen] == sent[:2] and more
    assert [e.message for e in q.pull(browser, 2)[0]] == sent[2:]
    assert q.message_count == 3
