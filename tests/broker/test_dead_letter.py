"""Dead-lettering: rejected, expired, overflowed messages republished with RabbitMQ's x-death header."""

from __future__ import annotations

import datetime

from broker.messages.deadletter import DeadLetter, dead_letter_copy, is_cycle
from broker.messages.message import Message, drop_reference
from broker.queues.queue import Queue
from broker.topology.vhost import VirtualHost
from tests.broker.support import EPOCH, ME, attach, consumer, message

DLX_ARGS = {"x-dead-letter-exchange": "dlx"}




def _dead(q: Queue) -> list[Message]:
    return [e.message for e in q.available_entries()]


def test_rejected_message_is_dead_lettered_with_x_death(vhost: VirtualHost, dlq: Queue) -> None:
    """basic.reject requeue=false: republished to the DLX with an x-death table and x-first-death-* headers."""
    q = vhost.declare_queue("q", owner=ME, arguments=DLX_ARGS)
    original = message("q", headers={"app": 1})
    vhost.advance(5.0)  # the runtime's clock, once per batch of requests
    vhost.publish("", original)
    entry = q.get()
    assert entry is not None
    q.discard(entry)
    vhost.drain()
    (copy,) = _dead(dlq)
    assert isinstance(copy, DeadLetter) and copy.reheadered
    assert (copy.exchange, copy.routing_key, copy.body_ref) == ("dlx", "q", original.body_ref)
    assert copy.headers == {
        "app": 1,
        "x-first-death-reason": "rejected",
        "x-first-death-queue": "q",
        "x-first-death-exchange": "",
        "x-death": [{
            "count": 1, "reason": "rejected", "queue": "q",
            "time": datetime.datetime.fromtimestamp(int(EPOCH + 5.0), datetime.UTC),
            "exchange": "", "routing-keys": ["q"],
        }],
    }
    assert original.headers == {"app": 1}  # the original's headers are not touched


def test_dead_letter_routing_key_replaces_the_routing_key_and_drops_cc(vhost: VirtualHost) -> None:
    """x-dead-letter-routing-key replaces the routing key and removes CC; x-death keeps the original keys."""
    dead = vhost.declare_queue("dead", owner=ME)
    q = vhost.declare_queue("q", owner=ME,
                            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    vhost.publish("", message("q", headers={"CC": ["q2"]}))
    entry = q.get()
    assert entry is not None
    q.discard(entry)
    vhost.drain()
    (copy,) = _dead(dead)
    assert copy.routing_key == "dead" and "CC" not in copy.headers  # type: ignore[operator]
    assert copy.headers["x-death"][0]["routing-keys"] == ["q", "q2"]  # type: ignore[index]


def test_expired_message_is_dead_lettered_without_its_expiration(vhost: VirtualHost, dlq: Queue) -> None:
    """An expired message is dead-lettered (reason expired); its expiration moves to original-expiration."""
    vhost.declare_queue("q", owner=ME, arguments=DLX_ARGS)
    vhost.publish("", message("q", expiration="1000"), now=0.0)
    vhost.tick(1.0)
    (copy,) = _dead(dlq)
    death = copy.headers["x-death"][0]  # type: ignore[index]
    assert death["reason"] == "expired" and death["original-expiration"] == "1000"
    assert copy.expiration is None and dlq.next_deadline() is None


def test_overflowed_message_is_dead_lettered_as_maxlen(vhost: VirtualHost, dlq: Queue) -> None:
    """drop-head dead-letters the dropped head with reason maxlen."""
    vhost.declare_queue("q", owner=ME, arguments={**DLX_ARGS, "x-max-length": 1})
    first = message("q")
    vhost.publish("", first)
    vhost.publish("", message("q"))
    (copy,) = _dead(dlq)
    assert copy.origin is first and copy.headers["x-first-death-reason"] == "maxlen"  # type: ignore[index]


def test_x_death_count_increments_per_queue_and_reason(vhost: VirtualHost) -> None:
    """The same queue and reason again increments count and moves that table first, keeping its first time."""
    vhost.declare_exchange("dlx", "fanout")
    q = vhost.declare_queue("q", owner=ME, arguments=DLX_ARGS)
    vhost.bind_queue("q", "dlx", "", owner=ME)  # rejected messages come straight back
    other = {"count": 1, "reason": "expired", "queue": "elsewhere", "exchange": "x", "routing-keys": ["k"]}
    vhost.publish("", message("q", headers={"x-death": [other]}))
    for now in (2.0, 3.0):
        vhost.advance(now)
        entry = q.get()
        assert entry is not None
        q.discard(entry)
        vhost.drain()
    (copy,) = _dead(q)
    first, second = copy.headers["x-death"]  # type: ignore[index]
    assert first["count"] == 2 and first["reason"] == "rejected" and first["queue"] == "q"
    assert first["time"] == datetime.datetime.fromtimestamp(int(EPOCH + 2.0), datetime.UTC)
    assert list(first) == sorted(first)  # RabbitMQ sorts an updated table's keys
    assert second == other
    assert "x-first-death-queue" not in copy.headers  # type: ignore[operator]  # it had x-death already


def test_rejection_without_dead_letter_exchange_drops_the_message(vhost: VirtualHost, dropped: list[Message]) -> None:
    """Without x-dead-letter-exchange, reject requeue=false discards the message like an ack."""
    q = vhost.declare_queue("q", owner=ME)
    m = message()
    vhost.publish("", m)
    entry = q.get()
    assert entry is not None
    q.discard(entry)
    assert dropped == [m] and vhost.drain() == []


def test_missing_dead_letter_exchange_drops_the_message(vhost: VirtualHost, dropped: list[Message]) -> None:
    """A dead-letter exchange that does not exist: the message is dropped (RabbitMQ with_dlx)."""
    q = vhost.declare_queue("q", owner=ME, arguments={"x-dead-letter-exchange": "missing"})
    m = message()
    vhost.publish("", m)
    entry = q.get()
    assert entry is not None
    q.discard(entry)
    vhost.drain()
    assert dropped == [m] and vhost.dead_lettered == 0


def test_dead_letter_copy_routed_nowhere_frees_the_body_once(vhost: VirtualHost, dropped: list[Message]) -> None:
    """A copy the DLX routes to no queue is dropped, and the body is freed exactly once."""
    vhost.declare_exchange("dlx", "direct")
    q = vhost.declare_queue("q", owner=ME, arguments=DLX_ARGS)
    m = message()
    vhost.publish("", m)
    entry = q.get()
    assert entry is not None
    q.discard(entry)
    assert dropped == []  # the pending copy holds the body
    vhost.drain()
    assert dropped == [m] and m.refs == 0


def test_body_is_freed_once_when_copy_and_original_both_go(vhost: VirtualHost, dlq: Queue,
                                                           dropped: list[Message]) -> None:
    """A fanned-out message dead-lettered by one queue keeps its body until the copy and the other entry settle."""
    q = vhost.declare_queue("q", owner=ME, arguments=DLX_ARGS)
    other = vhost.declare_queue("other", owner=ME)
    for name in ("q", "other"):
        vhost.bind_queue(name, "amq.fanout", "", owner=ME)
    m = message()
    vhost.publish("amq.fanout", m)
    entry = q.get()
    assert entry is not None
    q.discard(entry)
    vhost.drain()
    kept, copy = other.get(), dlq.get()
    assert kept is not None and copy is not None
    other.settle(kept)
    assert dropped == []
    dlq.settle(copy)
    assert dropped == [m]


def test_runtime_pins_release_through_drop_reference(dropped: list[Message]) -> None:
    """Releasing the last reference on a copy releases its origin; on_drop gets the body's owner once."""
    m = message()
    m.refs = 1
    copy = dead_letter_copy(m, "rejected", "q", "dlx", None, EPOCH)
    copy.refs = 1
    drop_reference(m, dropped.append)
    assert dropped == []
    drop_reference(copy, dropped.append)
    assert dropped == [m]


def test_copy_of_a_copy_shares_the_original_body(vhost: VirtualHost, dropped: list[Message]) -> None:
    """Dead-lettering a dead-lettered message again references the original body, not the copy."""
    first = message()
    first.refs = 1
    copy = dead_letter_copy(first, "expired", "a", "dlx", None, EPOCH)
    again = dead_letter_copy(copy, "expired", "b", "dlx", None, EPOCH)
    assert again.origin is first and first.refs == 3
    assert [d["queue"] for d in again.headers["x-death"]] == ["b", "a"]  # type: ignore[index]


def test_automatic_dead_letter_cycle_is_dropped(vhost: VirtualHost, dropped: list[Message]) -> None:
    """A message expiring back into a queue it already died in is dropped (no rejection in the cycle)."""
    vhost.declare_exchange("dlx", "fanout")
    a = vhost.declare_queue("a", owner=ME, arguments={**DLX_ARGS, "x-message-ttl": 100})
    b = vhost.declare_queue("b", owner=ME, arguments={**DLX_ARGS, "x-message-ttl": 100})
    vhost.bind_queue("b", "dlx", "", owner=ME)
    vhost.bind_queue("a", "dlx", "", owner=ME)
    m = message("a")
    vhost.publish("", m, now=0.0)
    vhost.tick(0.1)  # a → b (and a's copy to a itself is a cycle)
    assert a.message_count == 0 and b.message_count == 1
    vhost.tick(0.2)  # b → a would be a cycle through a: dropped
    assert a.message_count == 0 and b.message_count == 0 and dropped == [m]


def test_rejected_messages_may_cycle(vhost: VirtualHost) -> None:
    """A rejection in the cycle means a client decided: the message comes back (detect_cycles)."""
    vhost.declare_exchange("dlx", "fanout")
    q = vhost.declare_queue("q", owner=ME, arguments=DLX_ARGS)
    vhost.bind_queue("q", "dlx", "", owner=ME)
    vhost.publish("", message())
    for _ in range(3):
        entry = q.get()
        assert entry is not None
        q.discard(entry)
        vhost.drain()
    (copy,) = _dead(q)
    assert copy.headers["x-death"][0]["count"] == 3  # type: ignore[index]


def test_is_cycle_follows_rabbitmq() -> None:
    """A cycle is a queue seen in x-death with no rejected death since; odd entries break it."""
    deaths = [{"queue": "b", "reason": "expired"}, {"queue": "a", "reason": "maxlen"}]
    assert is_cycle("a", {"x-death": deaths}) and is_cycle("b", {"x-death": deaths})
    assert not is_cycle("c", {"x-death": deaths})
    assert not is_cycle("a", {"x-death": [{"queue": "b", "reason": "rejected"}, *deaths[1:]]})
    assert not is_cycle("a", {"x-death": ["junk", *deaths]})
    assert not is_cycle("a", None)


def test_dead_lettered_copy_notifies_its_queue_consumers(vhost: VirtualHost, dlq: Queue) -> None:
    """A copy arriving in the dead-letter queue wakes one of its consumers (returned by drain)."""
    q = vhost.declare_queue("q", owner=ME, arguments=DLX_ARGS)
    c = consumer("c")
    attach(dlq, c)
    vhost.publish("", message())
    entry = q.get()
    assert entry is not None
    q.discard(entry)
    assert dlq.message_count == 0  # routed when the runtime drains
    assert vhost.drain() == [c] and dlq.message_count == 1


def test_delivery_headers_of_a_dead_lettered_copy(vhost: VirtualHost, dlq: Queue) -> None:
    """The runtime re-encodes a copy's content header: delivery_headers gives the new headers."""
    q = vhost.declare_queue("q", owner=ME, arguments=DLX_ARGS)
    vhost.publish("", message(priority=3))
    entry = q.get()
    assert entry is not None and q.delivery_headers(entry) is None
    q.discard(entry)
    vhost.drain()
    copy = dlq.get()
    assert copy is not None and copy.message.priority == 3
    assert dlq.delivery_headers(copy) is copy.message.headers


def test_invalid_x_death_header_is_reset(vhost: VirtualHost) -> None:
    """An x-death header that is not an array is replaced by a fresh one (no first-death headers)."""
    copy = dead_letter_copy(message(headers={"x-death": "junk"}), "expired", "q", "dlx", None, EPOCH)
    assert [d["count"] for d in copy.headers["x-death"]] == [1]  # type: ignore[index]
    assert "x-first-death-reason" not in copy.headers  # type: ignore[operator]


def test_tick_wakes_consumers_of_the_dead_letter_queue(vhost: VirtualHost, dlq: Queue) -> None:
    """Messages expired by the timer and dead-lettered wake a dead-letter queue consumer (tick's notify)."""
    vhost.declare_queue("q", owner=ME, arguments={**DLX_ARGS, "x-message-ttl": 100})
    c = consumer("c")
    attach(dlq, c)
    vhost.publish("", message("q"), now=0.0)
    outcome = vhost.tick(0.1)
    assert outcome.notify == [c] and outcome.dead_lettered == 1
    assert dlq.message_count == 1


def test_publish_outcome_counts_dead_letters_from_drop_head(vhost: VirtualHost, dlq: Queue) -> None:
    """A publish that pushes the head out of a full queue reports the dead-lettered copy."""
    vhost.declare_queue("q", owner=ME, arguments={**DLX_ARGS, "x-max-length": 1})
    assert vhost.publish("", message("q")).dead_lettered == 0
    outcome = vhost.publish("", message("q"))
    assert outcome.dead_lettered == 1 and outcome.rejected == () and dlq.message_count == 1
