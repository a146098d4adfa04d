"""x-delivery-limit: poison messages dead-lettered after too many returns (quorum queue rules)."""

from __future__ import annotations

from broker.messages.message import Message
from broker.topology.vhost import VirtualHost
from tests.broker.support import ME, message


def test_message_returned_more_than_the_limit_is_dropped(vhost: VirtualHost, dropped: list[Message]) -> None:
    """A message returned more times than x-delivery-limit is discarded instead of requeued."""
    q = vhost.declare_queue("q", owner=ME, arguments={"x-delivery-limit": 2})
    m = message()
    vhost.publish("", m)
    for _ in range(2):
        entry = q.get()
        assert entry is not None
        q.release(entry)
    entry = q.get()  # the third delivery
    assert entry is not None and q.message_count == 0
    q.release(entry)
    assert q.message_count == 0 and dropped == [m]


def test_poison_message_is_dead_lettered_with_reason_delivery_limit(vhost: VirtualHost) -> None:
    """Over the limit, the message is dead-lettered (reason delivery_limit) when the queue has a DLX."""
    dead = vhost.declare_queue("dead", owner=ME)
    q = vhost.declare_queue("q", owner=ME, arguments={
        "x-delivery-limit": 0, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead",
    })
    vhost.publish("", message())
    entry = q.get()
    assert entry is not None
    q.release(entry)
    vhost.drain()
    (copy,) = dead.available_entries()
    assert copy.message.headers["x-death"][0]["reason"] == "delivery_limit"  # type: ignore[index]


def test_delivery_count_header_counts_returns(vhost: VirtualHost) -> None:
    """x-delivery-count is added on redeliveries (and always on basic.get), counting returns."""
    q = vhost.declare_queue("q", owner=ME, arguments={"x-delivery-limit": 5})
    vhost.publish("", message(headers={"app": "x"}))
    entry = q.get()
    assert entry is not None
    assert q.delivery_headers(entry) is None
    assert q.delivery_headers(entry, basic_get=True) == {"app": "x", "x-delivery-count": 0}
    q.release(entry)
    q.release(q.get())  # type: ignore[arg-type]
    entry = q.get()
    assert entry is not None and q.delivery_count(entry) == 2
    assert q.delivery_headers(entry) == {"app": "x", "x-delivery-count": 2}


def test_returns_are_counted_per_message(vhost: VirtualHost, dropped: list[Message]) -> None:
    """Each message has its own count: returns of one never push another over the limit."""
    q = vhost.declare_queue("q", owner=ME, arguments={"x-delivery-limit": 1})
    first, second = message(), message()
    vhost.publish("", first)
    vhost.publish("", second)
    a, b = q.get(), q.get()
    assert a is not None and b is not None
    q.release(a)
    q.release(b)
    assert dropped == [] and q.message_count == 2
    again = q.get()
    assert again is not None and again.message is first
    q.release(again)
    assert dropped == [first] and q.delivery_count(b) == 1
