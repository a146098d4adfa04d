"""Overload: no single supervisor operation does unbounded work ("the supervisor schedules fairly"):
deliveries and publishes.

A closed channel's (or a dead worker's) unacknowledged deliveries go back to their queue a slice
per step, the head first; a run of publishes stops at the step's work limit and goes on in the
next; a publish to a fanout wider than a step is offered to its queues in slices, each queue once.
"""

from __future__ import annotations

import itertools

from broker.runtime.dispatch import Dispatcher
from ipc import records as r
from tests.broker.bounded_steps import K, N


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
