"""x-max-length / x-max-length-bytes with x-overflow drop-head, reject-publish, reject-publish-dlx."""

from __future__ import annotations

from typing import Any

from broker.messages.message import Message
from broker.queues.featured.featured_queue import FeaturedQueue
from broker.queues.queue import Queue
from broker.topology.vhost import VirtualHost
from tests.broker.support import ME, attach, consumer, message


def _limited(vhost: VirtualHost, arguments: dict[str, Any], name: str = "q") -> Queue:
    return vhost.declare_queue(name, owner=ME, arguments=arguments)


def test_drop_head_discards_the_oldest_messages_over_max_length(vhost: VirtualHost, dropped: list[Message]) -> None:
    """x-max-length with drop-head (the default): the oldest messages are dropped to make room."""
    q = _limited(vhost, {"x-max-length": 2})
    messages = [message() for _ in range(4)]
    for m in messages:
        assert vhost.publish("", m)[0] == 1
    assert dropped == messages[:2]
    assert [e.message for e in q.available_entries()] == messages[2:]


def test_max_length_counts_only_ready_messages(vhost: VirtualHost, dropped: list[Message]) -> None:
    """Unacknowledged messages do not count towards the limit (RabbitMQ counts ready messages)."""
    q = _limited(vhost, {"x-max-length": 1})
    vhost.publish("", message())
    taken = q.get()
    vhost.publish("", message())
    assert taken is not None and q.message_count == 1 and dropped == []


def test_max_length_bytes_counts_body_sizes(vhost: VirtualHost, dropped: list[Message]) -> None:
    """x-max-length-bytes limits the total body size of ready messages; drop-head makes room."""
    q = _limited(vhost, {"x-max-length-bytes": 25})
    small, big = message(size=10), message(size=10)
    vhost.publish("", small)
    vhost.publish("", big)
    huge = message(size=20)
    vhost.publish("", huge)
    assert isinstance(q, FeaturedQueue)
    assert dropped == [small, big] and q.message_bytes == 20


def test_drop_head_applies_when_a_requeue_takes_the_queue_over(vhost: VirtualHost, dropped: list[Message]) -> None:
    """A requeued message that takes the queue over its limit causes the head to be dropped (requeue_and_run)."""
    q = _limited(vhost, {"x-max-length": 1})
    first = message()
    vhost.publish("", first)
    entry = q.get()
    vhost.publish("", message())
    assert entry is not None
    q.release(entry)
    assert dropped == [first] and q.message_count == 1


def test_reject_publish_refuses_new_messages_and_reports_it(vhost: VirtualHost, dropped: list[Message]) -> None:
    """reject-publish: a full queue refuses the newest message; publish's outcome names the queue (nack)."""
    q = _limited(vhost, {"x-max-length": 1, "x-overflow": "reject-publish"})
    kept, refused = message(), message()
    assert vhost.publish("", kept).rejected == ()
    outcome = vhost.publish("", refused)
    assert outcome.routed == 1 and outcome.rejected == ("q",) and outcome.notify == []
    assert [e.message for e in q.available_entries()] == [kept]
    assert dropped == [refused] and refused.refs == 0  # routed, so the domain freed it


def test_reject_publish_is_per_queue(vhost: VirtualHost, dropped: list[Message]) -> None:
    """A message refused by one queue is still delivered to the other queues it routes to."""
    full = _limited(vhost, {"x-max-length": 0, "x-overflow": "reject-publish"}, "full")
    other = _limited(vhost, {}, "other")
    for q in (full, other):
        vhost.bind_queue(q.name, "amq.fanout", "", owner=ME)
    c = consumer("c")
    attach(other, c)
    m = message()
    outcome = vhost.publish("amq.fanout", m)
    assert outcome.routed == 2 and outcome.rejected == ("full",) and outcome.notify == [c]
    assert m.refs == 1 and dropped == [] and other.message_count == 1


def test_reject_publish_dlx_dead_letters_the_refused_message(vhost: VirtualHost, dropped: list[Message]) -> None:
    """reject-publish-dlx: the refused message is nacked and dead-lettered (reason maxlen)."""
    vhost.declare_queue("dlq", owner=ME)
    q = _limited(vhost, {
        "x-max-length": 1, "x-overflow": "reject-publish-dlx",
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq",
    })
    vhost.publish("", message())
    refused = message()
    outcome = vhost.publish("", refused)
    assert outcome.rejected == ("q",) and outcome.dead_lettered == 1
    (dead,) = vhost.queues["dlq"].available_entries()
    assert dead.message.origin is refused and dead.message.headers["x-death"][0]["reason"] == "maxlen"  # type: ignore[index]
    assert q.message_count == 1 and dropped == []


def test_publish_reports_nothing_rejected_for_plain_queues(vhost: VirtualHost) -> None:
    """publish's outcome on the fast path: routed and notified, nothing rejected."""
    q = vhost.declare_queue("q", owner=ME)
    c = consumer("c")
    attach(q, c)
    assert tuple(vhost.publish("", message())) == (1, [c], (), 0, None)
    assert tuple(vhost.publish("", message("nowhere"))) == (0, [], (), 0, None)


def test_max_length_zero_with_drop_head_drops_everything(vhost: VirtualHost, dropped: list[Message]) -> None:
    """x-max-length 0 with drop-head: each message is dropped (dead-lettered) as it arrives; nobody is woken."""
    q = _limited(vhost, {"x-max-length": 0})
    c = consumer("c")
    attach(q, c)
    m = message()
    assert vhost.publish("", m)[:2] == (1, [])
    assert dropped == [m] and q.message_count == 0
