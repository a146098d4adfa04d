"""Overload: no single supervisor operation does unbounded work ("the supervisor schedules fairly"):
what goes with a channel, a connection or a queue.

A closed connection's many exclusive queues go a slice per step, a closed channel's many consumers
leave their queues a slice per step, and a deleted queue's many consumers are told a slice per
step; a few go at once, and a dead worker's go at once.
"""

from __future__ import annotations

import itertools

import pytest

from broker.errors import ResourceLocked
from broker.messages.message import Message
from broker.queues.consumer_manager import QueueConsumer
from broker.runtime.dispatch import Dispatcher
from broker.topology.vhost import VirtualHost
from ipc import records as r
from tests.broker.bounded_steps import OTHER, K, N, _exactly_once, _publish, _reap_all
from tests.broker.support import ME, consumer


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
