"""Flow control in the supervisor's dispatch: publish credit (credit flow), the per-worker
memory alarm with hysteresis, and arena room for a publish that found none."""

from __future__ import annotations

import logging

import pytest

from broker.runtime.credit_flow import FLOW_HOLD
from broker.runtime.dispatch import CREDIT_CHUNK, FLOW_BACKLOG
from ipc import records as r
from tests.broker.dispatch_harness import Harness as DispatchHarness

W0, W1 = 0, 1
SIZE = 116  # header 16 + body 100, as Harness.publish writes them


class Harness(DispatchHarness):
    """test_dispatch's harness, with publishers on several connections and credit read back."""

    def credit(self, worker: int) -> dict[int, int]:
        """Credit given to ``worker``'s connections since last asked (other events dropped)."""
        granted: dict[int, int] = {}
        for e in self.events(worker):
            if isinstance(e, r.Credit):
                for conn, n in zip(e.conns, e.counts, strict=True):
                    granted[conn] = granted.get(conn, 0) + n
        return granted

    def publish(self, rk: str, worker: int = W0, conn: int = 1,  # type: ignore[override]
                exchange: str = "", headers: dict[str, object] | None = None) -> int:
        self._offset += 256
        self.send(worker, r.Publish(conn, 1, exchange, rk, False, False, self._offset, 16, 100,
                                    headers))
        return self._offset

    def consume(self, queue: str, cid: int, worker: int = W1,  # type: ignore[override]
                *, interested: bool = True) -> None:
        self.send(worker, r.Consume(7, 1, cid, cid, queue, f"c{cid}", False, False, 0, False,
                                    interested, False))
        self.events(worker)

    def get_and_ack(self, queue: str, worker: int = W1) -> None:
        self.send(worker, r.Get(7, 1, queue, False))
        (ok,) = self.events(worker)
        assert isinstance(ok, r.GetOk)
        self.send(worker, r.Settle(7, 1, [ok.delivery.entry], r.ACK))


@pytest.fixture
def h() -> Harness:
    return Harness()


# -- credit flow ------------------------------------------------------------------------


def test_applied_publishes_give_their_credit_back_per_connection_in_chunks(h: Harness) -> None:
    """A batch gives back what reached CREDIT_CHUNK; the timer's tick gives back the rest."""
    h.declare("q")
    for _ in range(CREDIT_CHUNK):
        h.publish("q", conn=1)
    h.publish("q", conn=2)
    h.publish("q", worker=W1, conn=1)
    h.d.end_batch()
    assert h.credit(W0) == {1: CREDIT_CHUNK}
    assert h.credit(W1) == {}
    h.d.tick(1.0)
    assert h.credit(W0) == {2: 1}
    assert h.credit(W1) == {1: 1}
    h.d.tick(2.0)
    assert h.credit(W0) == {}  # given once


def test_a_refused_publish_gives_its_credit_back_too(h: Harness) -> None:
    h.publish("q", exchange="no-such-exchange")
    (error,) = [e for e in h.events(W0) if isinstance(e, r.Error)]
    assert error.code == 404
    h.d.tick(1.0)
    assert h.credit(W0) == {1: 1}


def _backlog_with_a_woken_consumer(h: Harness) -> None:
    h.declare("q")
    h.consume("q", cid=1, interested=False)
    for _ in range(FLOW_BACKLOG):
        h.publish("q")
    h.send(W1, r.Interest(1, True))  # credit came back: the queue wakes it, it has not pulled
    assert h.d.notify[W1] == [1]


def test_credit_is_withheld_while_a_woken_consumer_waits_on_a_backlog(h: Harness) -> None:
    """The supervisor is behind: publishers wait, the consumer's pull comes first."""
    _backlog_with_a_woken_consumer(h)
    h.d.end_batch()
    assert h.credit(W0) == {}
    assert h.d.behind
    h.publish("q")
    h.d.end_batch()
    assert h.credit(W0) == {}

    h.send(W1, r.Pull(1, 10))  # served: not behind any more; the credit held back comes back
    h.d.end_batch()
    assert not h.d.behind
    assert h.credit(W0) == {1: FLOW_BACKLOG + 1}


def _behind(h: Harness, now: float | None = None) -> bool:
    """A publish (credit due), then the batch's end (or the timer at ``now``): is it behind?"""
    h.publish("q")
    if now is None:
        h.d.end_batch()
    else:
        h.d.tick(now)
    return h.d.behind


def test_a_consumer_served_and_still_notified_on_a_backlog_holds_its_publishers(
        h: Harness) -> None:
    """A pull answered in full on a backlog leaves its consumer Notified (it pulls again as its
    acks come back): it still waits on the supervisor."""
    _backlog_with_a_woken_consumer(h)
    for _ in range(10):  # the backlog stays at FLOW_BACKLOG
        h.publish("q")
    h.send(W1, r.Pull(1, 10))
    assert any(isinstance(e, r.Pulled) and e.more for e in h.events(W1))
    assert _behind(h)
    assert h.credit(W0) == {}


def test_a_consumer_back_within_a_moment_counts_while_it_is_out_of_credit(h: Harness) -> None:
    """A consumer working through a backlog with its whole prefetch out is not interested for
    moments at a time. Once it came back within FLOW_HOLD, the supervisor counts it as waiting
    while it is away again, for FLOW_HOLD at most (one that stopped acking holds nobody)."""
    h.d.begin_batch(10.0)
    _backlog_with_a_woken_consumer(h)
    assert _behind(h)
    h.send(W1, r.Interest(1, False))
    assert not _behind(h)  # away for the first time: not known to come back soon
    h.d.begin_batch(10.0 + FLOW_HOLD / 4)
    h.send(W1, r.Interest(1, True))  # back in a moment: woken again
    assert _behind(h)
    h.send(W1, r.Interest(1, False))
    assert _behind(h)  # away as it was a moment ago: still waiting for work
    assert _behind(h, 10.0 + FLOW_HOLD / 4 + FLOW_HOLD / 2)
    assert not _behind(h, 10.0 + FLOW_HOLD / 4 + FLOW_HOLD * 2)  # away too long: it stopped


def test_a_slow_consumer_out_of_credit_does_not_hold_publishers(h: Harness) -> None:
    """A consumer acking once a second on a deep queue is woken at each ack and out of credit
    again at once: the supervisor is behind only while it waits to be served, never while it
    is away (else each ack of each slow consumer would hold every publisher back)."""
    h.d.begin_batch(10.0)
    _backlog_with_a_woken_consumer(h)
    h.send(W1, r.Interest(1, False))
    assert not _behind(h)
    for second in range(1, 4):
        h.d.begin_batch(10.0 + second)
        h.send(W1, r.Interest(1, True))
        assert _behind(h)
        h.send(W1, r.Interest(1, False))
        assert not _behind(h)


def test_a_slow_consumer_acking_often_holds_back_its_own_queues_publisher_only(
        h: Harness) -> None:
    """A consumer acking every few milliseconds on a deep queue counts as waiting between its
    acks (it comes back within FLOW_HOLD): its own queue's publisher waits, a publisher to
    another queue, or to a queue without consumers, keeps its rate."""
    h.declare("other")
    h.declare("nobody")
    h.consume("other", cid=2)
    h.d.begin_batch(10.0)
    _backlog_with_a_woken_consumer(h)
    for ack in range(1, 5):
        h.d.begin_batch(10.0 + ack * FLOW_HOLD / 4)
        h.send(W1, r.Interest(1, True))  # an ack's credit: woken at once, a backlog waits
        h.send(W1, r.Pull(1, 1))
        h.events(W1)
        h.send(W1, r.Interest(1, False))  # its prefetch is full again
        for _ in range(CREDIT_CHUNK):
            h.publish("q")
            h.publish("other", conn=2)
            h.publish("nobody", conn=3)
        h.d.end_batch()
        # Away for the first time: not known to come back soon.
        first = {1: FLOW_BACKLOG + CREDIT_CHUNK} if ack == 1 else {}
        assert h.credit(W0) == {**first, 2: CREDIT_CHUNK, 3: CREDIT_CHUNK}
    assert h.d.credit_withheld() == {(W0, 1): 3}


def test_a_consumer_its_client_limits_holds_back_nobody_however_often_it_acks(
        h: Harness) -> None:
    """The same consumer, its pulls marked client-limited by its worker (r.Pull.limited: its
    prefetch was full and one ack came back within PULL_DEFER): it waits on its application,
    not on the supervisor, so its own queue's publisher keeps its credit too (RabbitMQ lets
    the queue grow), while it is notified and while it is away."""
    h.d.begin_batch(10.0)
    _backlog_with_a_woken_consumer(h)
    h.send(W1, r.Pull(1, 1, True, 1, limited=True))
    h.events(W1)
    for ack in range(1, 5):
        h.d.begin_batch(10.0 + ack * FLOW_HOLD / 4)
        h.send(W1, r.Interest(1, True))
        assert not _behind(h)  # notified, not served yet: its last pull said its client limits it
        h.send(W1, r.Pull(1, 1, True, ack + 1, limited=True))
        h.events(W1)
        h.send(W1, r.Interest(1, False))
        for _ in range(CREDIT_CHUNK):
            h.publish("q")
        h.d.end_batch()
        assert not h.d.behind
    assert h.d.credit_withheld() == {}
    h.send(W1, r.Interest(1, True))
    h.send(W1, r.Pull(1, 5, True, 6))  # half its prefetch back at once: the supervisor's turn
    h.send(W1, r.Interest(1, False))
    assert _behind(h)


def test_a_backlog_whose_consumers_have_no_credit_does_not_hold_publishers(h: Harness) -> None:
    """Slow consumers (all prefetch used) are not the supervisor being behind: RabbitMQ lets
    such a queue grow, and so do we."""
    h.declare("q")
    h.consume("q", cid=1, interested=False)
    for _ in range(FLOW_BACKLOG * 2):
        h.publish("q")
    h.d.end_batch()
    assert h.credit(W0) == {1: FLOW_BACKLOG * 2}


def test_publishers_to_other_queues_keep_their_credit_while_one_queue_is_behind(
        h: Harness) -> None:
    """Credit is withheld only from the connections feeding the queue whose consumer waits:
    a publisher to another queue, on the same worker or another, is not held back."""
    h.declare("other")
    _backlog_with_a_woken_consumer(h)
    for _ in range(CREDIT_CHUNK):
        h.publish("other", conn=2)
        h.publish("other", worker=W1, conn=3)
    h.d.end_batch()
    assert h.d.behind
    assert h.credit(W0) == {2: CREDIT_CHUNK}  # conn 1, feeding q, waits
    assert h.credit(W1) == {3: CREDIT_CHUNK}
    assert h.d.credit_withheld() == {(W0, 1): 1}


def test_a_connection_that_fed_the_waited_on_queue_through_an_exchange_is_held(
        h: Harness) -> None:
    """What a connection's publishes reached is routed as its publishes were: through a
    topic exchange to the queue, held; the same exchange to another queue, not held."""
    h.declare("q")
    h.declare("other")
    h.send(W0, r.ExchangeDeclare(1, 1, "t", "topic", False, False, False, False, {}, False))
    h.send(W0, r.QueueBind(1, 1, "q", "t", "to.q.#", {}, False))
    h.send(W0, r.QueueBind(1, 1, "other", "t", "to.other", {}, False))
    _backlog_with_a_woken_consumer(h)
    h.d.tick(1.0)  # conn 1's backlog publishes are held from here on
    for _ in range(CREDIT_CHUNK):
        h.publish("to.q.x", conn=2, exchange="t")
        h.publish("to.other", conn=3, exchange="t")
        h.publish("nowhere", conn=4, exchange="t")
    h.d.end_batch()
    assert h.credit(W0) == {3: CREDIT_CHUNK, 4: CREDIT_CHUNK}


def test_a_publish_routed_by_its_headers_counts_as_feeding_every_queue(h: Harness) -> None:
    """CC / BCC and headers exchanges route by headers: such a publisher is held while any
    queue is behind."""
    h.declare("other")
    _backlog_with_a_woken_consumer(h)
    for _ in range(CREDIT_CHUNK):
        h.publish("other", conn=2, headers={"CC": ["elsewhere"]})
    h.d.end_batch()
    assert h.credit(W0) == {}
    h.send(W1, r.Pull(1, 10))  # served: everyone's credit comes back
    h.d.end_batch()
    assert h.credit(W0) == {1: FLOW_BACKLOG, 2: CREDIT_CHUNK}


def test_a_short_queue_with_a_woken_consumer_does_not_hold_publishers(h: Harness) -> None:
    h.declare("q")
    h.consume("q", cid=1)
    h.publish("q")  # wakes the consumer, which has not pulled yet
    h.d.tick(1.0)
    assert h.credit(W0) == {1: 1}


def test_credit_held_back_is_released_by_the_timer_when_nothing_else_comes(h: Harness) -> None:
    _backlog_with_a_woken_consumer(h)
    h.d.end_batch()
    assert h.credit(W0) == {}
    h.send(W1, r.Cancel(7, 1, 1, False))  # the waiting consumer goes
    h.d.tick(1.0)
    assert h.credit(W0) == {1: FLOW_BACKLOG}


def test_a_dead_workers_credit_is_forgotten(h: Harness) -> None:
    h.declare("q")
    h.publish("q", worker=W1)
    h.d.worker_died(W1)
    h.d.end_batch()
    assert h.credit(W1) == {}


# -- memory alarm -----------------------------------------------------------------------


def test_memory_alarm_blocks_the_filling_workers_publishers_only_with_hysteresis(
        h: Harness) -> None:
    h.d.high_watermark = 10 * SIZE
    h.d.low_watermark = 5 * SIZE
    h.declare("q")
    for _ in range(9):
        h.publish("q")
    h.d.end_batch()
    assert [e for e in h.events(W0) if isinstance(e, r.Blocked)] == []
    h.publish("q")  # the tenth reaches the high watermark
    h.d.end_batch()
    assert [e for e in h.events(W0) if isinstance(e, r.Blocked)] == [r.Blocked(True)]
    assert [e for e in h.events(W1) if isinstance(e, r.Blocked)] == []

    for _ in range(4):  # 6 held: below high, above low -- still blocked
        h.get_and_ack("q")
    h.d.end_batch()
    assert [e for e in h.events(W0) if isinstance(e, r.Blocked)] == []
    h.get_and_ack("q")
    h.d.end_batch()
    assert [e for e in h.events(W0) if isinstance(e, r.Blocked)] == []  # 5 held: not below low
    h.get_and_ack("q")
    h.d.end_batch()
    assert [e for e in h.events(W0) if isinstance(e, r.Blocked)] == [r.Blocked(False)]


def test_a_replacement_worker_learns_its_arena_is_still_over_the_watermark(h: Harness) -> None:
    h.d.high_watermark = h.d.low_watermark = SIZE
    h.declare("q")
    h.publish("q")
    h.d.end_batch()
    assert r.Blocked(True) in h.events(W0)
    h.d.worker_died(W0)
    h.send(W0, r.Hello(1234))
    assert r.Blocked(True) in h.events(W0)


# -- arena room -------------------------------------------------------------------------


def test_arena_wait_is_answered_once_that_much_was_freed_in_its_region(h: Harness) -> None:
    h.declare("q")
    h.declare("other")
    for _ in range(3):
        h.publish("q")
    h.publish("other", worker=W1)
    h.events(W0)
    h.send(W0, r.ArenaWait(2 * SIZE))
    h.get_and_ack("other")  # freed in W1's region: not what W0 waits for
    h.get_and_ack("q")
    assert r.ArenaFreed() not in h.events(W0)
    h.get_and_ack("q")
    assert h.events(W0).count(r.ArenaFreed()) == 1
    h.get_and_ack("q")
    assert r.ArenaFreed() not in h.events(W0)  # answered once per wait


def test_the_memory_alarm_is_logged_when_set_and_when_cleared(
        h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    """What RabbitMQ logs at warning: which worker, how much, and that its publishers are
    blocked (then unblocked)."""
    h.d.high_watermark = 2 * SIZE
    h.d.low_watermark = SIZE
    h.declare("q")
    with caplog.at_level(logging.WARNING, logger="shoal.dispatch"):
        h.publish("q")
        h.publish("q")
        h.d.end_batch()
        assert [m for m in caplog.messages if "memory alarm set on worker 0" in m
                and "publishers are blocked" in m]
        h.get_and_ack("q")
        h.get_and_ack("q")
        h.d.end_batch()
    assert [m for m in caplog.messages if "memory alarm cleared on worker 0" in m]
