"""Held messages (Qpid holdOnPublishEnabled, x-qpid-not-valid-before): unavailable until their time."""

from __future__ import annotations

from broker.queues.entry_state import AVAILABLE, HELD
from broker.queues.featured.featured_queue import FeaturedQueue
from broker.topology.vhost import VirtualHost
from tests.broker.support import EPOCH, ME, attach, consumer, message

HOLD = {"holdOnPublishEnabled": True}


def _not_before(monotonic: float) -> dict[str, int]:
    return {"x-qpid-not-valid-before": int((EPOCH + monotonic) * 1000)}


def _held_queue(vhost: VirtualHost) -> FeaturedQueue:
    q = vhost.declare_queue("q", owner=ME, arguments=HOLD)
    assert isinstance(q, FeaturedQueue)
    return q


def test_held_message_is_not_delivered_before_its_time(vhost: VirtualHost) -> None:
    """A message with a future not-valid-before time is held: no consumer or basic.get receives it."""
    q = _held_queue(vhost)
    c = consumer("c")
    attach(q, c)
    m = message(headers=_not_before(10.0))
    assert vhost.publish("", m, now=0.0)[:2] == (1, [])
    assert q.pull(c, 5, now=9.0) == ([], False)
    assert q.get(now=9.0) is None
    assert q.message_count == 1 and [e.state for e in q.held_entries()] == [HELD]


def test_tick_makes_a_held_message_available_and_notifies(vhost: VirtualHost) -> None:
    """seed: "a previously unavailable (held) message becomes available" -- one interested consumer is notified."""
    q = _held_queue(vhost)
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    m = message(headers=_not_before(10.0))
    vhost.publish("", m, now=0.0)
    assert vhost.next_deadline() == 10.0
    assert vhost.tick(9.5).notify == []
    assert vhost.tick(10.0).notify == [a]
    entries, _ = q.pull(a, 5)
    assert [e.message for e in entries] == [m]


def test_past_not_valid_before_is_available_at_once(vhost: VirtualHost) -> None:
    """A not-valid-before time already passed does not hold the message."""
    q = _held_queue(vhost)
    m = message(headers=_not_before(-5.0))
    vhost.publish("", m, now=0.0)
    assert [e.state for e in q.available_entries()] == [AVAILABLE]
    assert vhost.next_deadline() is None


def test_held_message_keeps_its_place_in_the_queue(vhost: VirtualHost) -> None:
    """Once available, a held message is delivered in its original position, ahead of later messages."""
    q = _held_queue(vhost)
    held, later = message(headers=_not_before(1.0)), message()
    vhost.publish("", held, now=0.0)
    vhost.publish("", later, now=0.0)
    vhost.tick(1.0)
    assert [q.get().message for _ in range(2)] == [held, later]  # type: ignore[union-attr]


def test_browsers_do_not_see_held_messages(vhost: VirtualHost) -> None:
    """Held entries are neither delivered nor browsed; the browser is told when one becomes available."""
    q = _held_queue(vhost)
    browser = consumer("browser", acquiring=False)
    attach(q, browser)
    m = message(headers=_not_before(2.0))
    vhost.publish("", m, now=0.0)
    assert q.pull(browser, 5) == ([], False)
    assert vhost.tick(2.0).notify == [browser]
    assert [e.message for e in q.pull(browser, 5)[0]] == [m]


def test_not_valid_before_is_ignored_unless_the_queue_holds(vhost: VirtualHost) -> None:
    """Without holdOnPublishEnabled the header means nothing (Qpid: the queue opts in)."""
    q = vhost.declare_queue("q", owner=ME)
    vhost.publish("", message(headers=_not_before(100.0)), now=0.0)
    assert q.get() is not None


def test_held_messages_count_and_are_purged(vhost: VirtualHost) -> None:
    """Held messages are in the queue: counted by message_count, dropped by purge."""
    q = _held_queue(vhost)
    vhost.publish("", message(headers=_not_before(5.0)), now=0.0)
    vhost.publish("", message(), now=0.0)
    assert q.message_count == 2
    assert vhost.purge_queue("q", owner=ME) == 2
    assert q.held_entries() == [] and vhost.tick(5.0).notify == []
