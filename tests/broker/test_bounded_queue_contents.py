"""Overload: no single supervisor operation does unbounded work ("the supervisor schedules fairly"):
what queues hold.

queue.purge and queue.delete answer at once with the message count, as RabbitMQ does, and the
queue is empty (or gone) at once; the bodies are let go of a slice per step, each exactly once.
A timer tick expires (or releases from hold) a bounded number of messages and says "now" for the
rest, so pulls and settles interleave; expired messages are still dead-lettered in order. The
slices here are made small so that a few dozen messages take several steps; nothing is timed.

The same for deliveries and publishes is in test_bounded_deliveries.py, for bindings in
test_bounded_bindings.py, for consumers and exclusive queues in test_bounded_teardown.py; what they
share is in bounded_steps.py.
"""

from __future__ import annotations

import itertools

import pytest

from broker.messages.message import Message
from broker.queues.queue import Queue
from broker.queues.queue_host import DEAD_LETTER_COST
from broker.runtime.dispatch import Dispatcher
from broker.topology.vhost import VirtualHost
from ipc import records as r
from tests.broker.bounded_steps import K, N, _exactly_once, _publish, _reap_all
from tests.broker.support import ME, attach, consumer, message

QUEUE_KINDS = {
    "plain": None,
    "featured": {"x-max-length": 10_000},
    "ttl-with-dlx": {"x-message-ttl": 60_000, "x-dead-letter-exchange": "dlx"},
}



@pytest.mark.parametrize("kind", QUEUE_KINDS)
def test_purge_answers_at_once_and_frees_bodies_in_slices(
    sliced: VirtualHost, dropped: list[Message], dlq: Queue, kind: str
) -> None:
    """queue.purge returns the count and the queue reports 0 at once; the bodies go K per step,
    each exactly once; nothing is dead-lettered (RabbitMQ does not dead-letter a purge)."""
    vhost = sliced
    q = vhost.declare_queue("q", owner=ME, arguments=QUEUE_KINDS[kind])
    messages = _publish(vhost, "q", N)
    assert vhost.purge_queue("q", owner=ME) == N
    assert q.message_count == 0 and q.available_entries() == []
    assert len(dropped) <= K
    assert vhost.next_deadline() == vhost.now, "the timer must come back at once"
    per_tick = _reap_all(vhost, dropped, now=vhost.now)
    assert len(per_tick) >= 2 and max(per_tick) <= K
    _exactly_once(dropped, messages)
    assert vhost.buried == 0
    assert (vhost.next_deadline() or float("inf")) > vhost.now, "nothing left to do now"
    assert dlq.message_count == 0


@pytest.mark.parametrize("kind", QUEUE_KINDS)
def test_deleted_queue_is_gone_at_once_and_a_redeclared_one_is_new(
    sliced: VirtualHost, dropped: list[Message], dlq: Queue, kind: str
) -> None:
    """queue.delete returns the count and the name is free at once: a queue declared again under
    it is a new, empty queue that works normally while the old bodies are still being freed."""
    vhost = sliced
    old = vhost.declare_queue("q", owner=ME, arguments=QUEUE_KINDS[kind])
    c = consumer("c")
    attach(old, c)
    messages = _publish(vhost, "q", N)
    old.get()  # one delivered, unsettled: it stays with its channel
    count, cancelled = vhost.delete_queue("q", owner=ME)
    assert count == N - 1 and cancelled == [c]
    assert "q" not in vhost.queues and len(dropped) <= K
    new = vhost.declare_queue("q", owner=ME, arguments=QUEUE_KINDS[kind])
    assert new is not old and new.message_count == 0
    fresh = message("q")
    vhost.publish("", fresh)
    assert new.message_count == 1
    per_tick = _reap_all(vhost, dropped, now=vhost.now)
    assert max(per_tick) <= K
    assert fresh not in dropped and new.get().message is fresh  # type: ignore[union-attr]
    _exactly_once(dropped, messages[1:])
    assert dlq.message_count == 0


def test_acquired_entries_outlive_a_purge_and_are_freed_once(sliced: VirtualHost, dropped: list[Message]) -> None:
    """A purged featured queue keeps its delivered entries: a browser sees only them, they
    requeue into the (now empty) queue, and each body is freed once when settled."""
    vhost = sliced
    q = vhost.declare_queue("q", owner=ME, arguments={"x-max-length": 10_000})
    messages = _publish(vhost, "q", N)
    first, second = q.get(), q.get()
    assert first is not None and second is not None
    assert vhost.purge_queue("q", owner=ME) == N - 2
    browser = consumer("b", acquiring=False)
    attach(q, browser)
    assert [e.message for e in q.pull(browser, 10)[0]] == [messages[0], messages[1]]
    q.release(second)
    assert q.message_count == 1
    _reap_all(vhost, dropped, now=vhost.now)
    q.settle(first)
    assert q.get().message is messages[1]  # type: ignore[union-attr]
    assert first.message in dropped and messages[1] not in dropped
    _exactly_once(dropped, messages[:1] + messages[2:])


def test_live_offsets_count_bodies_waiting_to_be_freed() -> None:
    """An arena sweep (a worker died) must not free a block the graveyard will free later."""
    freed: list[tuple[int, int]] = []
    d = Dispatcher(1, lambda region, offset: freed.append((region, offset)))
    d.vhost.reap_slice = K
    d.begin_batch(1.0)
    d.handle(0, r.QueueDeclare(1, 1, "q", False, False, False, False, {}, False))
    offsets = [256 * (i + 1) for i in range(N)]
    for offset in offsets:
        d.handle(0, r.Publish(1, 1, "", "q", False, False, offset, 16, 100, None))
    d.handle(0, r.QueuePurge(1, 1, "q", False))
    assert d.outbox[0][-1] == r.Reply(1, 1, "qpurge", message_count=N)
    assert len(freed) == K
    live = d.live_offsets(0)
    assert live == set(offsets) - {offset for _, offset in freed}
    steps = 0
    while (deadline := d.tick(1.0)) is not None and deadline <= 1.0:
        steps += 1
    assert sorted(offset for _, offset in freed) == offsets  # each once
    assert d.live_offsets(0) == set() and steps >= 2


def _burst(vhost: VirtualHost, queue: str, n: int, ttl: int = 1000) -> list[Message]:
    vhost.advance(10.0)
    return _publish(vhost, queue, n)


def test_ttl_burst_expires_in_bounded_ticks(vhost: VirtualHost, dropped: list[Message]) -> None:
    """N messages due at the same instant: each tick expires at most expire_slice of them and
    the next deadline is "now" until none is left."""
    vhost.expire_slice = 10
    vhost.declare_queue("q", owner=ME, arguments={"x-message-ttl": 1000})
    messages = _burst(vhost, "q", N)
    due = vhost.next_deadline()
    assert due == 11.0
    per_tick = []
    while (deadline := vhost.next_deadline()) is not None and deadline <= 11.0:
        before = len(dropped)
        vhost.tick(11.0)
        per_tick.append(len(dropped) - before)
    assert max(per_tick) <= 10 and len(per_tick) >= N // 10
    assert dropped == messages  # expired at the head, in order, each once
    assert vhost.queues["q"].message_count == 0


def test_ttl_burst_dead_letters_in_order_while_pulls_interleave(vhost: VirtualHost, dlq: Queue) -> None:
    """Expired messages of a queue with a dead-letter exchange go to it in publish order, a
    bounded number per tick; between ticks a consumer of another queue is served, and a
    consumer of the expiring queue never receives an expired message."""
    vhost.expire_slice = 4 * DEAD_LETTER_COST
    q = vhost.declare_queue("q", owner=ME, arguments={"x-message-ttl": 1000, "x-dead-letter-exchange": "dlx"})
    other = vhost.declare_queue("other", owner=ME)
    c, o = consumer("c"), consumer("o")
    attach(q, c)
    attach(other, o)
    messages = _burst(vhost, "q", N)
    live = message("q")
    vhost.publish("", live, now=10.5)  # expires later than the burst
    now = 11.0
    vhost.advance(now)
    ticks = 0
    while dlq.message_count < N:
        outcome = vhost.tick(now)
        assert outcome.dead_lettered <= 4
        ticks += 1
        assert vhost.next_deadline() <= now or dlq.message_count == N  # type: ignore[operator]
        vhost.publish("", message("other"))
        assert len(other.pull(o, 10, now=now)[0]) == 1  # another queue's consumer is served
        now += 1e-6  # the next batch of requests: a new step
        vhost.advance(now)
        entries, more = q.pull(c, 5, now=now)  # the expiring queue's consumer meanwhile
        assert all(e.message is live for e in entries)
        if entries:
            break
        assert more, "a consumer starved by expired messages is told to pull again"
    while dlq.message_count < N:
        vhost.tick(now)
        now += 1e-6
    assert ticks >= 2
    assert [e.message.origin for e in dlq.available_entries()] == messages
    assert [e.message.headers["x-death"][0]["reason"] for e in dlq.available_entries()] == ["expired"] * N


def _wide_dead_letter_exchange(vhost: VirtualHost) -> None:
    """Queue "q" (TTL 1 s) dead-letters to "wide", a fanout to d0..d19; a step offers dead-letter
    copies to 50 queues at most."""
    vhost.dead_letter_slice = 50
    vhost.declare_exchange("wide", "fanout")
    for i in range(20):
        vhost.declare_queue(f"d{i}", owner=ME)
        vhost.bind_queue(f"d{i}", "wide", "", owner=ME)
    vhost.declare_queue("q", owner=ME, arguments={"x-message-ttl": 1000,
                                                  "x-dead-letter-exchange": "wide"})


def test_dead_letters_to_a_wide_exchange_are_routed_a_slice_per_step(vhost: VirtualHost) -> None:
    """A dead-letter exchange bound to 20 queues: a tick routes dead letters until 50 queues
    have been offered one (the step's dead_letter_slice: 3 copies) and expires no more (5 a
    tick) while any wait; the timer comes back at once, and every queue gets every message, in
    publish order."""
    vhost.expire_slice = 5 * DEAD_LETTER_COST
    _wide_dead_letter_exchange(vhost)
    messages = _burst(vhost, "q", N)
    d0, q = vhost.queues["d0"], vhost.queues["q"]
    now = 11.0
    routed = [0]
    expired = [0]
    while (deadline := vhost.next_deadline()) is not None and deadline <= now:
        vhost.tick(now)
        routed.append(d0.message_count)
        expired.append(N - q.message_count)
        assert len(routed) < 1000, "the dead letters never go"
    assert all(b - a <= 3 for a, b in itertools.pairwise(routed)), \
        "more than 50 queues offered a copy in a tick"
    # 5 expire in a tick, 3 are routed: expiring on meanwhile would pile them up
    assert max(e - r for e, r in zip(expired, routed, strict=True)) <= 5, \
        "expired more while dead letters waited"
    for i in range(20):
        assert [e.message.origin for e in vhost.queues[f"d{i}"].available_entries()] == messages


def test_dead_letters_waiting_for_a_step_are_all_routed_when_the_runtime_stops(
        vhost: VirtualHost) -> None:
    """The supervisor stopping routes every dead letter still waiting (``drain(whole=True)``),
    so that none is left out of its queues (and the index) at a clean stop."""
    _wide_dead_letter_exchange(vhost)
    messages = _burst(vhost, "q", 10)
    vhost.tick(11.0)
    assert 0 < vhost.queues["d0"].message_count < 10, "some wait for the next step"
    vhost.drain(whole=True)
    for i in range(20):
        assert [e.message.origin for e in vhost.queues[f"d{i}"].available_entries()] == messages


def test_basic_get_behind_more_expired_messages_than_a_step_allows(vhost: VirtualHost, dropped: list[Message]) -> None:
    """basic.get drops at most a step's budget of expired messages: get-empty then, and the live
    message once the expired ones are gone (a later step, or the timer)."""
    vhost.expire_slice = 10
    q = vhost.declare_queue("q", owner=ME, arguments={"x-message-ttl": 1000})
    _burst(vhost, "q", N)
    live = message("q")
    vhost.publish("", live, now=10.5)
    vhost.advance(11.0)
    assert q.get() is None and len(dropped) == 10
    now = 11.0
    while (entry := q.get()) is None:
        now += 1e-6
        vhost.advance(now)
    assert entry.message is live and len(dropped) == N


def test_held_messages_are_released_in_bounded_ticks(vhost: VirtualHost) -> None:
    """Messages held until the same instant become available at most expire_slice per tick."""
    vhost.expire_slice = 10
    q = vhost.declare_queue("q", owner=ME, arguments={"holdOnPublishEnabled": True})
    due_ms = int((vhost.epoch_offset + 5.0) * 1000)
    for _ in range(N):
        vhost.publish("", message("q", {"x-qpid-not-valid-before": due_ms}), now=1.0)
    assert q.message_count == N and q.get(now=1.0) is None
    released = []
    while (deadline := vhost.next_deadline()) is not None and deadline <= 5.0:
        vhost.tick(5.0)
        released.append(len(q.available_entries()) - sum(released))
    assert max(released) <= 10 and sum(released) == N


def test_a_browser_sees_the_survivors_of_a_large_expiry_in_order(vhost: VirtualHost) -> None:
    """The featured queue's index is compacted a window at a time while most of it expires;
    a browser still sees exactly the messages left, in order."""
    vhost.expire_slice = 1000
    q = vhost.declare_queue("q", owner=ME, arguments={"x-max-length": 100_000})
    vhost.advance(1.0)
    doomed = [message("q", expiration="1000") for _ in range(4000)]
    for m in doomed:
        vhost.publish("", m)
    survivors = _publish(vhost, "q", 300)
    now = 2.0
    while (deadline := vhost.next_deadline()) is not None and deadline <= now:
        vhost.tick(now)
    assert q.message_count == 300
    browser = consumer("b", acquiring=False)
    attach(q, browser)
    seen = []
    while True:
        entries, more = q.pull(browser, 64)
        seen += [e.message for e in entries]
        if not more:
            break
    assert seen == survivors
