"""Overload: no single supervisor operation does unbounded work ("the supervisor schedules fairly").

queue.purge and queue.delete answer at once with the message count, as RabbitMQ does, and the
queue is empty (or gone) at once; the bodies are let go of a slice per step, each exactly once.
A timer tick expires (or releases from hold) a bounded number of messages and says "now" for the
rest, so pulls and settles interleave; expired messages are still dead-lettered in order. The
slices here are made small so that a few dozen messages take several steps; nothing is timed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from broker.consumer_manager import QueueConsumer
from broker.dispatch import Dispatcher
from broker.errors import NotFound, ResourceLocked
from broker.exchange import ExchangeDestination
from broker.message import Message
from broker.queue import DEAD_LETTER_COST, Queue
from broker.vhost import VirtualHost
from ipc import records as r
from tests.broker.support import ME, attach, consumer, message

K = 7  # entries let go of per step
OTHER = ("w1", 2)  # another connection
N = 50  # messages per queue: several steps' worth


def _publish(vhost: VirtualHost, queue: str, n: int, **kw: object) -> list[Message]:
    messages = [message(queue, **kw) for _ in range(n)]  # type: ignore[arg-type]
    for m in messages:
        vhost.publish("", m)
    return messages


def _reap_all(vhost: VirtualHost, dropped: list[Message], now: float = 0.0) -> list[int]:
    """Tick while the virtual host says there is work now; how many bodies each tick freed."""
    per_tick = []
    while (deadline := vhost.next_deadline()) is not None and deadline <= now:
        before = len(dropped)
        vhost.tick(now)
        per_tick.append(len(dropped) - before)
        assert len(per_tick) < 1000, "the graveyard never empties"
    return per_tick


def _exactly_once(dropped: list[Message], messages: list[Message]) -> None:
    assert len({id(m) for m in dropped}) == len(dropped), "a body freed twice"
    assert {id(m) for m in dropped} == {id(m) for m in messages}, "a body never freed"


QUEUE_KINDS = {
    "plain": None,
    "featured": {"x-max-length": 10_000},
    "ttl-with-dlx": {"x-message-ttl": 60_000, "x-dead-letter-exchange": "dlx"},
}


@pytest.fixture
def sliced(vhost: VirtualHost) -> VirtualHost:
    vhost.reap_slice = K
    vhost.advance(1.0)  # a new step: its budget is the smaller slice
    return vhost


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


class _Returns:
    """A dispatcher with worker 0 publishing N messages to ``q`` and a consumer on worker 1
    (connection 7, channel 1, no prefetch) holding all of them unacknowledged."""

    def __init__(self, *, exclusive: bool = False, browse: bool = False) -> None:
        self.freed: list[tuple[int, int]] = []
        self.d = Dispatcher(2, lambda region, offset: self.freed.append((region, offset)))
        self.d.return_slice = K
        self.now = 1.0
        self.d.begin_batch(self.now)
        owner_worker, owner_conn = (1, 7) if exclusive else (0, 1)
        self.d.handle(owner_worker, r.QueueDeclare(owner_conn, 1, "q", False, False, exclusive,
                                                   False, {}, False))
        self.offsets = [256 * (i + 1) for i in range(N)]
        for offset in self.offsets:
            self.d.handle(0, r.Publish(1, 1, "", "q", False, False, offset, 16, 100, None))
        self.queue = self.d.vhost.queues["q"]
        self.consume(7, 1, cid=1, browse=browse)
        held = self.pull(1, N)
        assert [d.offset for d in held] == self.offsets
        self.clear()

    def clear(self) -> None:
        for box in (*self.d.outbox, *self.d.notify):
            box.clear()

    def consume(self, conn: int, ch: int, cid: int, *, browse: bool = False) -> None:
        self.d.handle(1, r.Consume(conn, ch, cid, cid, "q", f"c{cid}", False, False, 0, browse,
                                   True, False))

    def pull(self, cid: int, n: int) -> list[r.Delivery]:
        self.d.handle(1, r.Pull(cid, n))
        pulled = [e for e in self.d.outbox[1] if isinstance(e, r.Pulled)]
        self.d.outbox[1].clear()
        return [d for p in pulled for d in p.deliveries]

    def step(self) -> None:
        """The next batch of requests: a new step, with a fresh budget."""
        self.now += 1e-6
        self.d.begin_batch(self.now)

    def tick_all(self) -> list[int]:
        """The timer, while the dispatcher says there is work now; ready messages after each."""
        ready = []
        while (deadline := self.d.tick(self.now)) is not None and deadline <= self.now:
            ready.append(self.queue.message_count)
            assert len(ready) < 1000, "the returns never end"
        ready.append(self.queue.message_count)
        return ready


def test_a_closed_channels_unacked_deliveries_go_back_a_slice_per_step() -> None:
    """A channel without prefetch holding N deliveries closes: K go back to the queue at once,
    the rest a slice per timer tick (the timer comes back at once), each to its original
    position and redelivered; no body is freed and nothing is lost or doubled."""
    t = _Returns()
    t.step()
    t.d.handle(1, r.ChanClose(7, 1))
    assert t.d.outbox[1] == [r.Reply(7, 1, "chclose")]
    assert t.queue.message_count == K
    assert t.d.next_deadline() == t.d.vhost.now, "the timer must come back at once"
    ready = t.tick_all()
    assert ready[-1] == N and all(b - a <= K for a, b in itertools.pairwise([K, *ready]))
    assert len(ready) >= N // K
    assert (t.d.next_deadline() or float("inf")) > t.now, "nothing left to do now"
    t.consume(8, 1, cid=2)
    again = t.pull(2, N)
    assert [d.offset for d in again] == t.offsets and all(d.redelivered for d in again)
    assert t.freed == []


def test_a_consumer_pulling_between_the_steps_gets_the_head_first() -> None:
    """What goes back first is what was delivered first: a consumer pulling while the rest
    are still on their way gets the queue's head, in order."""
    t = _Returns()
    t.step()
    t.d.handle(1, r.ChanClose(7, 1))
    assert t.queue.message_count == K
    t.consume(8, 1, cid=2)
    first = t.pull(2, K)
    assert [d.offset for d in first] == t.offsets[:K] and all(d.redelivered for d in first)
    t.tick_all()
    rest = t.pull(2, N)
    assert [d.offset for d in rest] == t.offsets[K:]


def test_live_offsets_count_deliveries_of_closed_channels_not_yet_returned() -> None:
    """An arena sweep (a worker died) must not free the block of a delivery still on its way
    back to the queue."""
    t = _Returns()
    t.step()
    t.d.handle(1, r.ChanClose(7, 1))
    assert t.queue.message_count < N
    assert t.d.live_offsets(0) == set(t.offsets)
    t.tick_all()
    assert t.d.live_offsets(0) == set(t.offsets)


def test_a_dead_workers_unacked_deliveries_go_back_in_slices() -> None:
    """worker_died closes each of its connections: the same bounded returns."""
    t = _Returns()
    t.step()
    t.d.worker_died(1)
    assert t.queue.message_count == K
    assert t.tick_all()[-1] == N and t.freed == []


def test_an_exclusive_queue_going_with_its_connection_frees_each_unacked_body_once() -> None:
    """The connection that owns the queue and holds its deliveries closes: the queue is gone
    at once, and each delivery still on its way back frees its body, exactly once."""
    t = _Returns(exclusive=True)
    t.step()
    t.d.handle(1, r.ConnClose(7))
    assert "q" not in t.d.vhost.queues and len(t.freed) <= K
    while (deadline := t.d.tick(t.now)) is not None and deadline <= t.now:
        pass
    assert sorted(offset for _, offset in t.freed) == t.offsets
    assert t.d.live_offsets(0) == set()


def test_a_browsers_pins_are_let_go_in_slices_and_free_nothing() -> None:
    """A browser's deliveries hold their messages (pins): closing its channel lets go of them
    a slice per step; the messages stay queued."""
    t = _Returns(browse=True)
    assert t.queue.message_count == N
    t.step()
    t.d.handle(1, r.ChanClose(7, 1))
    assert t.d.next_deadline() == t.d.vhost.now
    t.tick_all()
    assert t.queue.message_count == N and t.freed == []
    assert (t.d.next_deadline() or float("inf")) > t.now


def _wide_fanout(queues: int) -> Dispatcher:
    d = Dispatcher(1, lambda region, offset: None)
    d.begin_batch(1.0)
    d.handle(0, r.ExchangeDeclare(1, 1, "fx", "fanout", False, False, False, False, {}, False))
    for i in range(queues):
        d.handle(0, r.QueueDeclare(1, 1, f"q{i}", False, False, False, False, {}, False))
        d.handle(0, r.QueueBind(1, 1, f"q{i}", "fx", "", {}, False))
    d.outbox[0].clear()
    return d


def test_a_run_of_publishes_to_a_wide_fanout_stops_at_the_steps_limit() -> None:
    """Each message of a run to a fanout of Q queues is Q copies: a step stops the run once
    its work limit is reached (at least one message a step); the rest goes on in the worker's
    next steps, in order, and its publish credit is counted once."""
    queues, n = 20, 10
    d = _wide_fanout(queues)
    bodies = [x for i in range(n) for x in (256 * (i + 1), 16, 100)]
    d.work, d.work_limit = 0, 50
    d.handle(0, r.PublishRun(1, 1, "fx", "", False, False, bodies))
    assert d.run_pending(0)
    counts = [d.vhost.queues["q0"].message_count]
    while d.run_pending(0):
        d.work = 0
        d.resume_run(0)
        counts.append(d.vhost.queues["q0"].message_count)
    assert counts[0] < n and counts[-1] == n and len(counts) >= 3
    assert all(b - a <= 3 for a, b in itertools.pairwise([0, *counts]))
    for i in range(queues):
        q = d.vhost.queues[f"q{i}"]
        assert [e.message.body_ref for e in q.available_entries()] == \
            [e.message.body_ref for e in d.vhost.queues["q0"].available_entries()]
    d.flow_tick(all_credit=True)
    assert [e for e in d.outbox[0] if isinstance(e, r.Credit)] == [r.Credit([1], [n])]


def test_without_a_limit_a_run_goes_through_at_once() -> None:
    """The work limit is the runtime's: with none (a dead worker's last records, a stop), a run
    to the same fanout is applied whole."""
    d = _wide_fanout(20)
    bodies = [x for i in range(10) for x in (256 * (i + 1), 16, 100)]
    d.handle(0, r.PublishRun(1, 1, "fx", "", False, False, bodies))
    assert not d.run_pending(0) and d.vhost.queues["q19"].message_count == 10


def test_a_run_through_many_exchanges_stops_at_the_steps_limit() -> None:
    """A message routed to one queue through 20 exchanges (exchange-to-exchange bindings) is
    one routed copy but 21 exchanges walked, which count as the step's work: a run of them
    stops at the limit and goes on in the next steps, in order; a single Publish counts them
    too (the runtime's step ends after it)."""
    d = Dispatcher(1, lambda region, offset: None)
    d.begin_batch(1.0)
    d.handle(0, r.ExchangeDeclare(1, 1, "x", "fanout", False, False, False, False, {}, False))
    d.handle(0, r.QueueDeclare(1, 1, "q", False, False, False, False, {}, False))
    for i in range(20):
        d.handle(0, r.ExchangeDeclare(1, 1, f"x{i}", "fanout", False, False, False, False, {},
                                      False))
        d.handle(0, r.ExchangeBind(1, 1, f"x{i}", "x", "", {}, False))
        d.handle(0, r.QueueBind(1, 1, "q", f"x{i}", "", {}, False))
    bodies = [x for i in range(10) for x in (256 * (i + 1), 16, 100)]
    d.work, d.work_limit = 0, 50
    d.handle(0, r.PublishRun(1, 1, "x", "", False, False, bodies))
    q = d.vhost.queues["q"]
    assert d.run_pending(0) and q.message_count == 3
    while d.run_pending(0):
        d.work = 0
        d.resume_run(0)
    refs = [e.message.body_ref for e in q.available_entries()]
    assert len(refs) == 10 and refs == sorted(refs), "in publish order (offsets ascending)"
    d.work = 0
    d.handle(0, r.Publish(1, 1, "x", "", False, False, 256 * 11, 16, 100, None))
    assert d.work == 1 + 21


class _Split:
    """A fanout of Q queues and a step that may offer a message to S of them (a work limit of
    2 S: a split publish's copy counts twice): one publish is offered in slices."""

    Q, S = 23, 5

    def __init__(self, *, confirm: bool = False, arguments: dict | None = None) -> None:
        self.freed: list[int] = []
        self.d = d = Dispatcher(2, lambda region, offset: self.freed.append(offset))
        d.route_slice_min = 1
        d.begin_batch(1.0)
        d.handle(0, r.ExchangeDeclare(1, 1, "fx", "fanout", False, False, False, False, {}, False))
        for i in range(self.Q):
            d.handle(0, r.QueueDeclare(1, 1, f"q{i}", False, False, False, False,
                                       arguments or {}, False))
            d.handle(0, r.QueueBind(1, 1, f"q{i}", "fx", "", {}, False))
        self.confirm = confirm
        self.clear()

    def clear(self) -> None:
        for box in (*self.d.outbox, *self.d.notify):
            box.clear()

    def step(self, rec: r.Request | None = None) -> list[int]:
        """One step with a fresh budget: ``rec``, or what was left; the queues' counts after."""
        self.d.begin_batch(1.0)
        self.d.work, self.d.work_limit = 0, 2 * self.S
        if rec is None:
            self.d.resume_run(0)
        else:
            self.d.handle(0, rec)
        assert self.d.work <= 2 * self.S
        self.d.work_limit = None
        self.d.end_batch()
        return self.counts()

    def counts(self) -> list[int]:
        return [self.d.vhost.queues[f"q{i}"].message_count if f"q{i}" in self.d.vhost.queues
                else -1 for i in range(self.Q)]

    def publish(self, offset: int, *, mandatory: bool = False) -> r.Publish:
        return r.Publish(1, 1, "fx", "", mandatory, self.confirm, offset, 16, 100, None)

    def until_done(self) -> list[list[int]]:
        steps = []
        while self.d.run_pending(0):
            steps.append(self.step())
            assert len(steps) < 100, "the publish never ends"
        return steps


def test_a_publish_to_a_fanout_wider_than_a_step_is_offered_in_slices() -> None:
    """One message to Q queues, a step with room for S: S queues have it after the first step,
    S more after each next, all Q at the end; the worker's later requests wait for it
    (run_pending), its confirm comes once, at the end, and its credit is counted once."""
    t = _Split(confirm=True)
    first = t.step(t.publish(256))
    assert sorted(first) == [0] * (t.Q - t.S) + [1] * t.S
    assert t.d.run_pending(0)
    assert not [e for e in t.d.outbox[0] if isinstance(e, r.Confirm)], "confirmed too early"
    steps = t.until_done()
    assert [sum(c) for c in steps] == [min(t.Q, t.S * k) for k in range(2, len(steps) + 2)]
    assert steps[-1] == [1] * t.Q
    assert [e for e in t.d.outbox[0] if isinstance(e, r.Confirm)] == [r.Confirm(1, 1, True)]
    t.d.flow_tick(all_credit=True)
    assert [e for e in t.d.outbox[0] if isinstance(e, r.Credit)] == [r.Credit([1], [1])]
    assert t.freed == []


def test_consumers_are_woken_slice_by_slice() -> None:
    """The consumers of the queues a slice reached are notified in that step, not at the end."""
    t = _Split()
    for i in range(t.Q):  # consumer i + 1 of queue i, notify slot 100 + i
        t.d.handle(1, r.Consume(7, 1, i + 1, 100 + i, f"q{i}", f"c{i}", False, False, 0, False,
                                True, False))
    t.clear()
    first = t.step(t.publish(256))
    assert sorted(t.d.notify[1]) == [100 + i for i in range(t.Q) if first[i]]
    t.until_done()
    assert sorted(t.d.notify[1]) == [100 + i for i in range(t.Q)]


def test_an_early_queues_ack_does_not_free_the_body_under_the_rest() -> None:
    """A consumer acks the message on a queue of the first slice before the others are offered
    it: the body stays until the last queue lets go of it, then is freed once."""
    t = _Split()
    for i in range(t.Q):
        t.d.handle(1, r.Consume(7, 1, i + 1, 100 + i, f"q{i}", f"c{i}", False, False, 0, False,
                                True, False))
    t.clear()
    first = t.step(t.publish(256))
    reached = first.index(1)
    t.d.handle(1, r.Pull(reached + 1, 10))
    (pulled,) = [e for e in t.d.outbox[1] if isinstance(e, r.Pulled)]
    (delivery,) = pulled.deliveries
    t.d.handle(1, r.Settle(7, 1, [delivery.entry], r.ACK))
    assert t.freed == []
    t.until_done()
    assert t.freed == [] and t.counts() == [int(i != reached) for i in range(t.Q)]
    for i in range(t.Q):
        t.d.handle(0, r.QueuePurge(1, 1, f"q{i}", False))
    while (deadline := t.d.tick(1.0)) is not None and deadline <= 1.0:
        pass
    assert t.freed == [256]


def test_queues_deleted_between_the_slices_get_nothing() -> None:
    """Queues deleted while a publish is on its way to them are skipped (also when declared
    again under their names: the new queues are not bound); when every queue went,
    the body is freed once, after the last slice (not under it), and a mandatory message is
    not returned: it was routed."""
    t = _Split()
    first = t.step(t.publish(256))
    for i in range(t.Q):
        if not first[i]:
            t.d.handle(0, r.QueueDelete(1, 1, f"q{i}", False, False, False))
    t.until_done()
    assert t.counts() == [1 if n else -1 for n in first] and t.freed == []

    t = _Split()  # deleted and declared again under the name: a new queue, not bound
    first = t.step(t.publish(256))
    for i in range(t.Q):
        if not first[i]:
            t.d.handle(0, r.QueueDelete(1, 1, f"q{i}", False, False, False))
            t.d.handle(0, r.QueueDeclare(1, 1, f"q{i}", False, False, False, False, {}, False))
    t.until_done()
    assert t.counts() == first

    t = _Split()
    t.clear()
    t.step(t.publish(512, mandatory=True))
    for i in range(t.Q):
        t.d.handle(0, r.QueueDelete(1, 1, f"q{i}", False, False, False))
    t.until_done()
    while (deadline := t.d.tick(1.0)) is not None and deadline <= 1.0:
        pass
    assert t.freed == [512]
    assert not [e for e in t.d.outbox[0] if isinstance(e, r.Returned)]


def test_a_split_publish_in_a_run_is_followed_by_the_rest_of_the_run_in_order() -> None:
    """A PublishRun whose first message is split: the run's next messages reach each queue
    after it, in order."""
    t = _Split()
    bodies = [x for i in range(3) for x in (256 * (i + 1), 16, 100)]
    t.step(r.PublishRun(1, 1, "fx", "", False, False, bodies))
    t.until_done()
    for i in range(t.Q):
        q = t.d.vhost.queues[f"q{i}"]
        assert [e.message.body_ref for e in q.available_entries()] == \
            [e.message.body_ref for e in t.d.vhost.queues["q0"].available_entries()]
        assert q.message_count == 3


def test_a_queue_refusing_a_split_publish_nacks_its_confirm() -> None:
    """Queues with x-overflow reject-publish, full: the confirm at the end is a nack, as for
    a publish offered to all of them at once."""
    t = _Split(confirm=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    t.step(t.publish(256))
    t.until_done()
    assert [e for e in t.d.outbox[0] if isinstance(e, r.Confirm)] == [r.Confirm(1, 1, True)]
    t.clear()
    t.step(t.publish(512))
    t.until_done()
    assert [e for e in t.d.outbox[0] if isinstance(e, r.Confirm)] == [r.Confirm(1, 1, False)]
    assert t.counts() == [1] * t.Q


def test_a_dead_workers_split_publish_reaches_the_rest_of_its_queues() -> None:
    """The publishing worker dies while its publish is on its way: the publish was taken, so
    the rest of its queues are offered it at once (no step is waiting for that worker), and
    its confirm goes nowhere (the worker's next incarnation has other connections)."""
    t = _Split(confirm=True)
    t.step(t.publish(256))
    t.d.worker_died(0)
    assert not t.d.run_pending(0) and t.counts() == [1] * t.Q and t.freed == []
    assert t.d.outbox[0] == []


def test_a_publish_narrower_than_the_minimum_slice_is_never_split() -> None:
    """With the runtime's minimum slice (256 queues), a fanout of Q is offered whole even when
    the step has no room left."""
    t = _Split()
    t.d.route_slice_min = 256
    t.d.begin_batch(1.0)
    t.d.work, t.d.work_limit = 100, 10
    t.d.handle(0, t.publish(256))
    assert not t.d.run_pending(0) and t.counts() == [1] * t.Q


def _bound_exchange(vhost: VirtualHost, name: str, queues: int, kind: str = "direct",
                    **kw: object) -> None:
    vhost.declare_exchange(name, kind, **kw)  # type: ignore[arg-type]
    for i in range(queues):
        if f"q{i}" not in vhost.queues:
            vhost.declare_queue(f"q{i}", owner=ME)
        vhost.bind_queue(f"q{i}", name, f"k{i}", owner=ME)


def _sources(vhost: VirtualHost, queue: str) -> set[str]:
    """The exchanges the reverse binding index names as bound to ``queue``."""
    return set(vhost._bindings._to_queue.get(queue, {}))


def test_a_deleted_exchanges_bindings_go_a_slice_per_step(sliced: VirtualHost) -> None:
    """exchange.delete of an exchange bound N times: the exchange is gone at once (a publish to
    it is 404), its bindings go K per step, and at the end the reverse index names it for no
    queue."""
    vhost = sliced
    _bound_exchange(vhost, "x", N)
    old = vhost.exchanges["x"]
    vhost.delete_exchange("x")
    assert "x" not in vhost.exchanges
    with pytest.raises(NotFound):
        vhost.publish("x", message("k1"))
    assert len(old.bindings()) == N - K
    assert vhost.next_deadline() == vhost.now, "the timer must come back at once"
    ticks = 0
    while (deadline := vhost.next_deadline()) is not None and deadline <= vhost.now:
        before = len(old.bindings())
        vhost.tick(vhost.now)
        assert before - len(old.bindings()) <= K
        ticks += 1
    assert ticks >= N // K - 1 and not old.has_bindings
    assert all(_sources(vhost, f"q{i}") == {""} for i in range(N))  # the default exchange's


def test_an_exchange_declared_again_meanwhile_keeps_its_own_bindings(sliced: VirtualHost) -> None:
    """The exchange is declared again under its name and bound to some of the same queues while
    the old one's bindings are still going: the new bindings stay indexed and route; deleting a
    queue the old one was bound to does not auto-delete the new (auto-delete) exchange, which has
    no binding to it; deleting one the new one is bound to does."""
    vhost = sliced
    _bound_exchange(vhost, "x", N)
    vhost.delete_exchange("x")
    vhost.declare_exchange("x", "direct", auto_delete=True)
    vhost.bind_queue("q0", "x", "k0", owner=ME)
    vhost.bind_queue(f"q{N - 1}", "x", "again", owner=ME)
    vhost.delete_queue("q1", owner=ME)  # the old exchange's binding to it is still there
    assert "x" in vhost.exchanges, "auto-deleted for a binding it never had"
    _reap_all(vhost, [], vhost.now)
    assert _sources(vhost, "q0") == {"", "x"} and _sources(vhost, f"q{N - 1}") == {"", "x"}
    assert _sources(vhost, "q2") == {""}
    assert vhost.publish("x", message("again")).routed == 1
    assert vhost.publish("x", message("k2")).routed == 0
    vhost.delete_queue("q0", owner=ME)
    assert "x" in vhost.exchanges
    vhost.delete_queue(f"q{N - 1}", owner=ME)
    assert "x" not in vhost.exchanges, "its last binding went: auto-delete"


def test_a_deleted_exchanges_bindings_to_exchanges_go_too(sliced: VirtualHost) -> None:
    """A deleted exchange bound to other exchanges: those bindings go in slices as well; a
    destination exchange deleted meanwhile finds nothing to undo; nothing routes through the
    deleted one."""
    vhost = sliced
    vhost.declare_queue("sink", owner=ME)
    for i in range(N):
        vhost.declare_exchange(f"d{i}", "fanout")
        vhost.bind_queue("sink", f"d{i}", "", owner=ME)
    vhost.declare_exchange("x", "direct")
    for i in range(N):
        vhost.bind_exchange(f"d{i}", "x", f"k{i}")
    vhost.delete_exchange("x")
    vhost.delete_exchange("d3")
    _reap_all(vhost, [], vhost.now)
    assert all(not vhost._bindings._to_exchange.get(f"d{i}") for i in range(N))
    vhost.declare_exchange("x", "direct")
    assert vhost.publish("x", message("k5")).routed == 0


def _topic_bound_queue(vhost: VirtualHost, exchange: str = "t", **kw: object) -> None:
    """Queue q bound N times to the topic exchange ``exchange``."""
    vhost.declare_exchange(exchange, "topic", **kw)  # type: ignore[arg-type]
    vhost.declare_queue("q", owner=ME)
    for i in range(N):
        vhost.bind_queue("q", exchange, f"a.b{i}.#", owner=ME)


@pytest.fixture
def unbinding(sliced: VirtualHost) -> VirtualHost:
    """An exchange's bindings to a deleted queue go K per step once there are more than 10."""
    sliced.unbind_at_once = 10
    return sliced


def test_a_queue_bound_many_times_is_deleted_at_once_its_bindings_in_slices(
        unbinding: VirtualHost) -> None:
    """queue.delete of a queue bound N times: it is gone at once, a message matching its keys
    is routed nowhere, and its bindings go: 10 in the call, then K per step (the first slice in
    the same step, as the graveyard's work)."""
    vhost = unbinding
    _topic_bound_queue(vhost)
    exchange = vhost.exchanges["t"]
    vhost.delete_queue("q", owner=ME)
    assert "q" not in vhost.queues
    assert vhost.publish("t", message("a.b3.c")).routed == 0
    left = [exchange.bindings_to("q")]
    assert left[0] == N - 10 - K
    while (deadline := vhost.next_deadline()) is not None and deadline <= vhost.now:
        vhost.tick(vhost.now)
        left.append(exchange.bindings_to("q"))
    assert left[-1] == 0 and all(a - b <= K for a, b in itertools.pairwise(left))
    assert not exchange.has_bindings


def test_a_queue_declared_again_gets_nothing_through_the_old_bindings(unbinding: VirtualHost) -> None:
    """Declared again under its name before the old bindings are gone: they go at once, so the
    new queue gets only what its own bindings route."""
    vhost = unbinding
    _topic_bound_queue(vhost)
    vhost.delete_queue("q", owner=ME)
    vhost.declare_queue("q", owner=ME)
    assert vhost.exchanges["t"].bindings_to("q") == 0
    assert vhost.publish("t", message("a.b3.c")).routed == 0
    vhost.bind_queue("q", "t", "new", owner=ME)
    assert vhost.publish("t", message("new")).routed == 1
    _reap_all(vhost, [], vhost.now)
    assert vhost.exchanges["t"].bindings_to("q") == 1, "the new binding went with the old"


def test_an_auto_delete_exchange_goes_once_the_last_old_binding_has(unbinding: VirtualHost) -> None:
    """An auto-delete exchange whose only bindings were to the deleted queue goes when the last
    of them does; exchange.delete if-unused meanwhile does not count them."""
    vhost = unbinding
    _topic_bound_queue(vhost, auto_delete=True)
    vhost.delete_queue("q", owner=ME)
    assert "t" in vhost.exchanges
    _reap_all(vhost, [], vhost.now)
    assert "t" not in vhost.exchanges

    _topic_bound_queue(vhost, "u")
    vhost.delete_queue("q", owner=ME)
    vhost.delete_exchange("u", if_unused=True)  # its only bindings lead to a deleted queue
    assert "u" not in vhost.exchanges


def test_while_a_deleted_queues_bindings_go_its_matches_go_to_the_alternate_exchange(
        unbinding: VirtualHost) -> None:
    """An exchange with an alternate exchange whose only match is a binding of the deleted
    queue still going hands the message to its alternate, as RabbitMQ (whose bindings go with
    the queue) does."""
    vhost = unbinding
    vhost.declare_exchange("ae", "fanout")
    vhost.declare_queue("aeq", owner=ME)
    vhost.bind_queue("aeq", "ae", "", owner=ME)
    _topic_bound_queue(vhost, arguments={"alternate-exchange": "ae"})
    vhost.delete_queue("q", owner=ME)
    assert vhost.exchanges["t"].bindings_to("q") > 0, "the bindings should still be going"
    assert vhost.exchanges["t"].route(f"a.b{N - 1}.c") == {"q"}  # one of those left
    assert vhost.publish("t", message(f"a.b{N - 1}.c")).routed == 1
    assert vhost.queues["aeq"].message_count == 1


def _ticks_until_idle(vhost: VirtualHost, measure: Callable[[], int]) -> list[int]:
    """``measure()`` now and after each tick while the virtual host has work now."""
    seen = [measure()]
    while (deadline := vhost.next_deadline()) is not None and deadline <= vhost.now:
        vhost.tick(vhost.now)
        seen.append(measure())
        assert len(seen) < 1000, "the work never ends"
    return seen


def test_a_queue_bound_by_many_exchanges_is_unbound_in_slices(unbinding: VirtualHost) -> None:
    """queue.delete of a queue bound once by each of N exchanges (RabbitMQ walks them all in
    the call): 10 go at once, the rest K per step; auto-delete exchanges go with their last
    binding; the reverse index names the queue for nobody at the end."""
    vhost = unbinding
    vhost.declare_queue("q", owner=ME)
    for i in range(N):
        vhost.declare_exchange(f"x{i}", "fanout", auto_delete=i % 2 == 0)
        vhost.bind_queue("q", f"x{i}", "", owner=ME)
    vhost.delete_queue("q", owner=ME)
    assert all(vhost.publish(f"x{i}", message("")).routed == 0 for i in range(1, N, 2))

    def bound() -> int:
        return sum(1 for x in vhost.exchanges.values() if x.is_bound("q"))

    left = _ticks_until_idle(vhost, bound)
    assert N - 10 - K <= left[0] <= N - 10 and left[-1] == 0  # 10 in the call, <= K in its step
    assert all(a - b <= K for a, b in itertools.pairwise(left))
    assert not any(f"x{i}" in vhost.exchanges for i in range(0, N, 2)), "auto-delete"
    assert all(f"x{i}" in vhost.exchanges for i in range(1, N, 2))
    assert not vhost._bindings._to_queue.get("q")


def _exchange_bound_exchange(vhost: VirtualHost, sources: int, keys: int, **kw: object) -> None:
    """Exchange "d" (fanout to queue "sink") bound ``keys`` times by each of ``sources``
    direct exchanges s0, s1, ... (keys k0, k1, ...)."""
    vhost.declare_queue("sink", owner=ME)
    vhost.declare_exchange("d", "fanout")
    vhost.bind_queue("sink", "d", "", owner=ME)
    for i in range(sources):
        vhost.declare_exchange(f"s{i}", "direct", **kw)  # type: ignore[arg-type]
        for j in range(keys):
            vhost.bind_exchange("d", f"s{i}", f"k{j}")


@pytest.mark.parametrize(("sources", "keys"), [(1, N), (N, 1), (5, 10)])
def test_a_deleted_exchanges_bindings_from_other_exchanges_go_a_slice_per_step(
        unbinding: VirtualHost, sources: int, keys: int) -> None:
    """exchange.delete of an exchange that N exchange-to-exchange bindings lead to (from one
    exchange, from N, or a mix): it is gone at once and nothing reaches its queue through them;
    10 go in the call, then K per step, until no exchange is bound to it."""
    vhost = unbinding
    _exchange_bound_exchange(vhost, sources, keys)
    vhost.delete_exchange("d")
    assert all(vhost.publish(f"s{i}", message(f"k{keys - 1}")).routed == 0 for i in range(sources))
    destination = ExchangeDestination("d")

    def bindings() -> int:
        return sum(x.bindings_to(destination) for x in vhost.exchanges.values())

    left = _ticks_until_idle(vhost, bindings)
    assert N - 10 - K <= left[0] <= N - 10 and left[-1] == 0  # 10 in the call, <= K in its step
    assert all(a - b <= K for a, b in itertools.pairwise(left))
    assert not vhost._bindings._to_exchange.get("d")
    assert all(not vhost.exchanges[f"s{i}"].has_bindings for i in range(sources))
    assert vhost.queues["sink"].message_count == 0


def test_an_exchange_declared_again_gets_nothing_through_the_old_bindings(unbinding: VirtualHost) -> None:
    """Declared again under its name before the old bindings to it are gone: they go at once,
    so the new exchange gets only what its own bindings route."""
    vhost = unbinding
    _exchange_bound_exchange(vhost, 1, N)
    vhost.delete_exchange("d")
    vhost.declare_exchange("d", "fanout")
    vhost.bind_queue("sink", "d", "", owner=ME)
    assert vhost.exchanges["s0"].bindings_to(ExchangeDestination("d")) == 0
    assert vhost.publish("s0", message(f"k{N - 1}")).routed == 0
    vhost.bind_exchange("d", "s0", "new")
    assert vhost.publish("s0", message("new")).routed == 1
    _reap_all(vhost, [], vhost.now)
    assert vhost.exchanges["s0"].bindings_to(ExchangeDestination("d")) == 1, "the new binding went"


def test_auto_delete_sources_go_once_their_last_binding_to_a_deleted_exchange_has(
        unbinding: VirtualHost) -> None:
    """An auto-delete exchange whose only bindings led to the deleted exchange goes when the
    last of them does; exchange.delete if-unused meanwhile does not count them."""
    vhost = unbinding
    _exchange_bound_exchange(vhost, 2, N, auto_delete=True)
    vhost.delete_exchange("d")
    assert "s0" in vhost.exchanges and "s1" in vhost.exchanges
    vhost.delete_exchange("s1", if_unused=True)  # its only bindings lead to a deleted exchange
    assert "s1" not in vhost.exchanges
    _reap_all(vhost, [], vhost.now)
    assert "s0" not in vhost.exchanges


def test_while_a_deleted_exchanges_bindings_go_matches_go_to_the_alternate_exchange(
        unbinding: VirtualHost) -> None:
    """A source with an alternate exchange whose only match is a binding to the deleted
    exchange still going hands the message to its alternate (RabbitMQ removed the binding with
    the exchange)."""
    vhost = unbinding
    vhost.declare_exchange("ae", "fanout")
    vhost.declare_queue("aeq", owner=ME)
    vhost.bind_queue("aeq", "ae", "", owner=ME)
    _exchange_bound_exchange(vhost, 1, N, arguments={"alternate-exchange": "ae"})
    vhost.delete_exchange("d")
    assert vhost.exchanges["s0"].route(f"k{N - 1}") == {ExchangeDestination("d")}, "still going"
    assert vhost.publish("s0", message(f"k{N - 1}")).routed == 1
    assert vhost.queues["aeq"].message_count == 1 and vhost.queues["sink"].message_count == 0


def _exclusive_queues(vhost: VirtualHost, n: int) -> list[Message]:
    """n exclusive queues of ME, e0, e1, ..., each holding one message."""
    for i in range(n):
        vhost.declare_queue(f"e{i}", owner=ME, exclusive=True)
    return [m for i in range(n) for m in _publish(vhost, f"e{i}", 1)]


def test_a_closed_connections_many_exclusive_queues_go_a_slice_per_step(
        sliced: VirtualHost, dropped: list[Message]) -> None:
    """A connection owning N exclusive queues closes (more than close_at_once): they go a
    slice per step, at most K units of 4 a queue; meanwhile another connection using one gets
    405 RESOURCE_LOCKED (RabbitMQ's answer until the queue has seen its owner go); every
    queue and every message goes, each body once."""
    vhost = sliced
    vhost.close_at_once = 10
    messages = _exclusive_queues(vhost, N)
    assert vhost.delete_owned_queues(ME) == []
    left = [sum(1 for i in range(N) if f"e{i}" in vhost.queues)]
    assert N - 10 <= left[0] < N, "some go in the closing step, at most its slice"
    with pytest.raises(ResourceLocked):
        vhost.queue(f"e{N - 1}", owner=OTHER)
    with pytest.raises(ResourceLocked):
        vhost.declare_queue(f"e{N - 1}", owner=OTHER, exclusive=True)
    per_step = -(-K // 4)
    while (deadline := vhost.next_deadline()) is not None and deadline <= vhost.now:
        vhost.tick(vhost.now)
        left.append(sum(1 for i in range(N) if f"e{i}" in vhost.queues))
        assert len(left) < 1000
    assert left[-1] == 0 and all(a - b <= per_step for a, b in itertools.pairwise(left))
    assert vhost.queues_owned_by(ME) == []
    _reap_all(vhost, dropped, vhost.now)
    _exactly_once(dropped, messages)


def test_a_few_exclusive_queues_go_with_the_close_itself(sliced: VirtualHost,
                                                         dropped: list[Message]) -> None:
    """close_at_once or fewer: gone in the call, as always."""
    vhost = sliced
    vhost.close_at_once = N
    _exclusive_queues(vhost, N)
    vhost.delete_owned_queues(ME)
    assert not any(f"e{i}" in vhost.queues for i in range(N))


def test_consumers_of_exclusive_queues_going_in_slices_are_cancelled_as_they_go(
        sliced: VirtualHost) -> None:
    """The consumers of queues deleted in later steps reach ``on_cancel`` then."""
    vhost = sliced
    vhost.close_at_once = 10
    _exclusive_queues(vhost, N)
    consumers = [consumer(f"c{i}") for i in range(N)]
    for i, c in enumerate(consumers):
        vhost.queues[f"e{i}"].add_consumer(c)
    cancelled: list[QueueConsumer] = []
    cancelled += vhost.delete_owned_queues(ME, cancelled.extend)
    _reap_all(vhost, [], vhost.now)
    assert sorted(c.tag for c in cancelled) == sorted(c.tag for c in consumers)


def test_a_dead_workers_exclusive_queues_go_at_once_even_while_others_go_in_slices() -> None:
    """worker_died deletes its connections' exclusive queues in the call (its replacement
    numbers its connections from 1 again: a new connection must not own one of them), those of a
    connection closed just before included."""
    d = Dispatcher(2, lambda region, offset: None)
    d.vhost.close_at_once = 10
    d.vhost.reap_slice = K
    d.begin_batch(1.0)
    for conn in (1, 2):
        for i in range(N):
            d.handle(1, r.QueueDeclare(conn, 1, f"c{conn}e{i}", False, False, True, False, {}, False))
    d.handle(1, r.ConnClose(1))
    assert sum(1 for name in d.vhost.queues if name.startswith("c1e")) > 0, "still going"
    d.worker_died(1)
    assert not [name for name in d.vhost.queues if name.startswith(("c1e", "c2e"))]


class _Detaching:
    """A dispatcher with N consumers on worker 1's connection 7, channel 1 (ids and slots 1..N,
    each interested, with a standing pull on the empty queue ``q``), and one live consumer on
    worker 0 (connection 1, channel 2, id 100, slot 5), interested but without a pull; closed
    channels' consumers leave their queues K per step."""

    LIVE = 100

    def __init__(self, *, auto_delete: bool = False, n: int = N) -> None:
        self.d = Dispatcher(2, lambda region, offset: None)
        self.d.detach_slice = K
        self.now = 1.0
        self.d.begin_batch(self.now)
        self.d.handle(0, r.QueueDeclare(1, 2, "q", False, False, False, auto_delete, {}, False))
        self.queue = self.d.vhost.queues["q"]
        self.n = n
        for cid in range(1, n + 1):
            self.d.handle(1, r.Consume(7, 1, cid, cid, "q", f"c{cid}", False, False, 0, False,
                                       True, False))
            self.d.handle(1, r.Pull(cid, 10, True))
        self.d.handle(0, r.Consume(1, 2, self.LIVE, 5, "q", "live", False, False, 0, False,
                                   True, False))
        self.clear()

    def clear(self) -> None:
        for box in (*self.d.outbox, *self.d.notify):
            box.clear()

    def step(self) -> None:
        self.now += 1e-6
        self.d.begin_batch(self.now)

    def publish(self, offsets: list[int]) -> None:
        for offset in offsets:
            self.d.handle(0, r.Publish(1, 2, "", "q", False, False, offset, 16, 100, None))
        self.d.end_batch()
        self.d.serve_standing()

    def tick_all(self) -> list[int]:
        """The timer while it says "now"; the queue's consumers after each tick."""
        counts = []
        while (deadline := self.d.tick(self.now)) is not None and deadline <= self.now:
            self.d.serve_standing()
            counts.append(self.queue.consumer_count)
            assert len(counts) < 1000, "the consumers never go"
        self.d.serve_standing()
        counts.append(self.queue.consumer_count)
        return counts

    def dead_subscriptions(self) -> list[int]:
        return [cid for (worker, cid) in self.d._subs if worker == 1]

    def pulled_by_dead(self) -> list[r.Pulled]:
        return [e for e in self.d.outbox[1] if isinstance(e, r.Pulled)]


def test_a_closed_channels_many_consumers_leave_their_queue_a_slice_per_step() -> None:
    """A channel with N consumers closes: K leave the queue in the close (answered at once),
    the rest K per timer tick, which comes back at once; the live consumer stays."""
    t = _Detaching()
    t.step()
    t.d.handle(1, r.ChanClose(7, 1))
    assert t.d.outbox[1] == [r.Reply(7, 1, "chclose")]
    assert t.queue.consumer_count == N - K + 1
    assert t.d.next_deadline() == t.d.vhost.now, "the timer must come back at once"
    counts = t.tick_all()
    assert counts[-1] == 1 and len(counts) >= N // K
    assert all(a - b <= K for a, b in itertools.pairwise([N - K + 1, *counts]))
    assert t.dead_subscriptions() == []
    assert (t.d.next_deadline() or float("inf")) > t.now, "nothing left to do now"


def test_a_few_consumers_leave_with_the_close_itself() -> None:
    t = _Detaching(n=K)
    t.step()
    t.d.handle(1, r.ChanClose(7, 1))
    assert t.queue.consumer_count == 1 and t.dead_subscriptions() == []
    assert (t.d.next_deadline() or float("inf")) > t.now


def test_messages_published_while_closed_consumers_remain_reach_the_live_one() -> None:
    """Closed consumers still on the queue are never delivered to (their standing pulls are not
    served); what the queue notified them of goes to the live consumer as they leave, and the
    live consumer pulls every message, in order."""
    t = _Detaching()
    t.step()
    t.d.handle(1, r.ChanClose(7, 1))
    t.clear()
    offsets = [256 * (i + 1) for i in range(N)]
    t.step()
    t.publish(offsets)
    t.tick_all()
    assert t.pulled_by_dead() == [], "a closed channel's consumer was served"
    assert 5 in t.d.notify[0], "the live consumer was never notified"
    t.d.handle(0, r.Pull(t.LIVE, 2 * N))
    pulled = [d.offset for e in t.d.outbox[0] if isinstance(e, r.Pulled) for d in e.deliveries]
    assert pulled == offsets


def test_a_channel_reopened_meanwhile_consumes_as_a_new_one() -> None:
    """The worker reopens the channel number while the old consumers still leave: a consumer on
    it gets deliveries held by the new channel, and settling them is the new channel's."""
    t = _Detaching()
    t.step()
    t.d.handle(1, r.ChanClose(7, 1))
    t.d.handle(1, r.Consume(7, 1, 500, 3, "q", "again", False, False, 0, False, True, False))
    t.publish([256, 512])
    t.d.handle(1, r.Pull(500, 10))
    got = [d for e in t.d.outbox[1] if isinstance(e, r.Pulled) and e.consumer == 500
           for d in e.deliveries]
    assert [d.offset for d in got] == [256, 512]
    assert t.pulled_by_dead() == [p for p in t.pulled_by_dead() if p.consumer == 500]
    t.tick_all()
    assert t.d.vhost.queues["q"].acquired_count == 2
    t.d.handle(1, r.Settle(7, 1, [got[0].entry, got[1].entry], r.ACK))
    assert t.d.vhost.queues["q"].acquired_count == 0


def test_a_dead_workers_closed_channels_consumers_all_leave_at_once() -> None:
    """worker_died takes a closed channel's consumers still leaving off in the call (its
    replacement numbers consumers from 1 again)."""
    t = _Detaching()
    t.step()
    t.d.handle(1, r.ChanClose(7, 1))
    assert t.queue.consumer_count > 1
    t.d.worker_died(1)
    assert t.queue.consumer_count == 1 and t.dead_subscriptions() == []
    assert (t.d.next_deadline() or float("inf")) > t.now


def test_an_auto_delete_queue_goes_when_its_last_closed_consumer_has_left() -> None:
    t = _Detaching(auto_delete=True)
    t.d.handle(0, r.Cancel(1, 2, t.LIVE, False))
    t.step()
    t.d.handle(1, r.ChanClose(7, 1))
    assert "q" in t.d.vhost.queues, "gone before its consumers"
    t.tick_all()
    assert "q" not in t.d.vhost.queues


def test_a_queue_deleted_while_closed_consumers_leave_cancels_only_the_live_one() -> None:
    """queue.delete meanwhile: the live consumer is cancelled (basic.cancel to its worker);
    the closed channel's consumers, which its worker forgot, get nothing, and the ticks after
    find nothing left of them."""
    t = _Detaching()
    t.step()
    t.d.handle(1, r.ChanClose(7, 1))
    t.clear()
    t.d.handle(0, r.QueueDelete(1, 2, "q", False, False, False))
    assert r.Cancelled(t.LIVE) in t.d.outbox[0]
    assert not [e for e in t.d.outbox[1] if isinstance(e, (r.Cancelled, r.Pulled))]
    t.tick_all()
    assert t.dead_subscriptions() == [] and not t.d.outbox[1]


class _Cancels:
    """N consumers of ``q`` on worker 1 (connection 7, channel 1, ids and slots 1..N); queue.delete
    tells K of them at once and the rest K per step."""

    def __init__(self) -> None:
        self.d = Dispatcher(2, lambda region, offset: None)
        self.d.detach_slice = self.d.cancel_at_once = K
        self.now = 1.0
        self.d.begin_batch(self.now)
        self.d.handle(0, r.QueueDeclare(1, 2, "q", False, False, False, False, {}, False))
        for cid in range(1, N + 1):
            self.d.handle(1, r.Consume(7, 1, cid, cid, "q", f"c{cid}", False, False, 0, False,
                                       True, False))
        self.d.outbox[1].clear()

    def cancelled(self) -> list[int]:
        told = [e.consumer for e in self.d.outbox[1] if isinstance(e, r.Cancelled)]
        self.d.outbox[1].clear()
        return told

    def tick_all(self) -> list[list[int]]:
        told = []
        while (deadline := self.d.tick(self.now)) is not None and deadline <= self.now:
            told.append(self.cancelled())
            assert len(told) < 1000, "the cancels never end"
        told.append(self.cancelled())
        return told


def test_a_deleted_queues_many_consumers_are_cancelled_a_slice_per_step() -> None:
    """queue.delete-ok at once, K basic.cancels with it, the rest K per tick; each consumer
    told once, in the order they consumed."""
    t = _Cancels()
    t.d.begin_batch(t.now)
    t.d.handle(0, r.QueueDelete(1, 2, "q", False, False, False))
    assert "q" not in t.d.vhost.queues
    first = t.cancelled()
    assert first == list(range(1, K + 1))
    assert t.d.next_deadline() == t.d.vhost.now
    rest = t.tick_all()
    assert all(len(told) <= K for told in rest)
    assert first + [cid for told in rest for cid in told] == list(range(1, N + 1))
    assert [cid for (worker, cid) in t.d._subs if worker == 1] == []


def test_a_consumer_not_told_yet_pulls_nothing_from_its_deleted_queue() -> None:
    t = _Cancels()
    t.d.handle(0, r.Publish(1, 2, "", "q", False, False, 256, 16, 100, None))
    t.d.handle(0, r.QueueDelete(1, 2, "q", False, False, False))
    t.cancelled()
    t.d.handle(1, r.Pull(N, 10))
    assert [e for e in t.d.outbox[1] if isinstance(e, r.Pulled)] == [r.Pulled(N, [], False)]


def test_a_replaced_workers_new_consumers_are_not_cancelled_for_the_old_ones() -> None:
    """The worker dies while its consumers of a deleted queue are still being told; its
    replacement numbers consumers from 1 again: none of its own is cancelled by what is left."""
    t = _Cancels()
    t.d.handle(0, r.QueueDelete(1, 2, "q", False, False, False))
    t.d.worker_died(1)
    t.d.handle(0, r.QueueDeclare(1, 2, "other", False, False, False, False, {}, False))
    for cid in range(1, N + 1):
        t.d.handle(1, r.Consume(3, 1, cid, cid, "other", f"n{cid}", False, False, 0, False,
                                True, False))
    t.d.outbox[1].clear()
    assert t.tick_all()[-1] == [] and not any(t.tick_all())
    assert t.d.vhost.queues["other"].consumer_count == N
