"""Standing pulls (``r.Pull.standing``): what a consumer asked for and the queue did not have
stays asked for. The supervisor runs it where it would have set the consumer's notify slot,
before the flush (``Dispatcher.serve_standing``), and ends it with an empty ``Pulled`` when
the worker waits for one."""

from __future__ import annotations

import pytest

from ipc import records as r
from tests.broker.dispatch_harness import W0, W1, Harness


class Standing(Harness):
    def stand(self, cid: int, n: int, worker: int = W1, seq: int = 0) -> list[r.Event]:
        """A standing pull of ``n``: what it answered at once (nothing, on an empty queue)."""
        self.send(worker, r.Pull(cid, n, True, seq))
        self.d.serve_standing()
        return self.events(worker)

    def flush(self, worker: int = W1) -> list[r.Event]:
        self.d.serve_standing()
        return self.events(worker)


@pytest.fixture
def h() -> Standing:
    return Standing()


def test_a_standing_pull_on_an_empty_queue_is_not_answered(h: Standing) -> None:
    h.declare("q")
    h.consume("q", cid=1, slot=5)
    assert h.stand(1, 10) == []
    assert h.woken(W1) == []


def test_a_new_message_runs_the_standing_pull_instead_of_setting_the_slot(h: Standing) -> None:
    """One hop: the delivery itself reaches the worker, its notify slot stays clear, and the
    rest of the pull stays open (``open``)."""
    h.declare("q")
    h.consume("q", cid=1, slot=5)
    h.stand(1, 10)
    offset = h.publish("q")
    (pulled,) = h.flush()
    assert isinstance(pulled, r.Pulled)
    assert [d.offset for d in pulled.deliveries] == [offset]
    assert (pulled.more, pulled.open) == (False, 9)
    assert h.woken(W1) == []


def test_a_standing_pull_used_up_ends_and_the_next_message_notifies(h: Standing) -> None:
    h.declare("q")
    h.consume("q", cid=1, slot=5)
    h.stand(1, 2)
    h.publish("q")
    assert h.flush()[0].open == 1
    h.publish("q")
    (pulled,) = h.flush()
    assert (len(pulled.deliveries), pulled.open) == (1, 0)
    h.publish("q")
    assert h.flush() == []
    assert h.woken(W1) == [5]


def test_a_standing_pull_on_a_backlog_is_an_ordinary_pull(h: Standing) -> None:
    """The queue has more than was asked for: the pull ends (``more``), nothing stays open."""
    h.declare("q")
    for _ in range(3):
        h.publish("q")
    h.consume("q", cid=1, slot=5)
    h.woken(W1)
    (pulled,) = h.stand(1, 2)
    assert (len(pulled.deliveries), pulled.more, pulled.open) == (2, True, 0)


def test_a_short_answer_keeps_the_rest_open(h: Standing) -> None:
    h.declare("q")
    h.publish("q")
    h.consume("q", cid=1, slot=5)
    h.woken(W1)
    (pulled,) = h.stand(1, 4)
    assert (len(pulled.deliveries), pulled.more, pulled.open) == (1, False, 3)
    h.publish("q")
    assert h.flush()[0].open == 2


def test_a_pull_sent_before_the_last_was_answered_adds_to_what_stayed_open(h: Standing) -> None:
    """A consumer working off a backlog sends its next pull before the last is answered; when
    the queue ran dry under the first, the second adds to what the first left open, and each
    answer says which of the consumer's pulls the supervisor had applied (``seq``)."""
    h.declare("q")
    for _ in range(2):
        h.publish("q")
    h.consume("q", cid=1, slot=5)
    h.woken(W1)
    (first,) = h.stand(1, 5, seq=1)
    assert (len(first.deliveries), first.open, first.seq) == (2, 3, 1)
    assert h.stand(1, 5, seq=2) == []  # nothing to deliver: 3 + 5 stay open
    for _ in range(9):
        h.publish("q")
    pulled = [e for e in h.flush() if isinstance(e, r.Pulled)]
    assert sum(len(p.deliveries) for p in pulled) == 8
    assert (pulled[-1].open, pulled[-1].seq) == (0, 2)
    assert h.d.vhost.queue("q", owner=None).message_count == 1


def test_a_pull_for_a_cancelled_consumer_is_answered_with_its_own_number(h: Standing) -> None:
    h.declare("q")
    h.consume("q", cid=1, slot=5)
    h.send(W1, r.Cancel(1, 1, 1, False))
    h.events(W1)
    h.send(W1, r.Pull(1, 5, True, 7))
    assert h.events(W1) == [r.Pulled(1, [], False, 0, 7)]


def test_the_empty_answer_that_ends_a_standing_pull_names_the_last_pull_applied(
        h: Standing) -> None:
    h.declare("q")
    h.consume("q", cid=1, slot=5)
    h.stand(1, 5, seq=3)
    h.send(W1, r.Interest(1, False))
    assert h.events(W1) == [r.Pulled(1, [], False, 0, 3)]


def test_one_message_runs_one_of_two_standing_pulls(h: Standing) -> None:
    """seed: a new message notifies exactly one interested consumer; the other stays open."""
    h.declare("q")
    h.consume("q", cid=1, slot=5)
    h.consume("q", cid=2, slot=6)
    h.stand(1, 10)
    h.stand(2, 10)
    h.publish("q")
    (pulled,) = h.flush()
    assert len(pulled.deliveries) == 1 and pulled.consumer in (1, 2)
    other = 3 - pulled.consumer
    h.publish("q")
    (second,) = h.flush()
    assert second.consumer == other  # asymptotic fairness: the other one is next


@pytest.mark.parametrize("how", ["not interested", "cancel"])
def test_losing_interest_or_cancelling_ends_it_with_an_empty_answer(h: Standing, how: str) -> None:
    h.declare("q")
    h.consume("q", cid=1, slot=5)
    h.stand(1, 10)
    if how == "cancel":
        h.send(W1, r.Cancel(1, 1, 1, False))
    else:
        h.send(W1, r.Interest(1, False))
    events = h.events(W1)
    assert events[0] == r.Pulled(1, [], False, 0)
    h.publish("q")
    assert h.flush() == []
    assert h.woken(W1) == []


def test_a_deleted_queue_ends_it_before_the_cancel(h: Standing) -> None:
    h.declare("q")
    h.consume("q", cid=1, slot=5)
    h.stand(1, 10)
    h.send(W0, r.QueueDelete(1, 1, "q", False, False, False))
    assert h.events(W1) == [r.Pulled(1, [], False, 0), r.Cancelled(1)]


def test_a_closed_channel_forgets_it_silently(h: Standing) -> None:
    """The worker dropped the channel's consumers: nothing answers, nothing is served later."""
    h.declare("q")
    h.consume("q", cid=1, slot=5)
    h.stand(1, 10)
    h.send(W1, r.ChanClose(1, 1))
    assert h.events(W1) == [r.Reply(1, 1, "chclose")]
    h.consume("q", cid=2, slot=6, ch=2)
    h.publish("q")
    assert h.flush() == []
    assert h.woken(W1) == [6]


def test_a_dead_worker_forgets_its_standing_pulls(h: Standing) -> None:
    h.declare("q")
    h.consume("q", cid=1, slot=5)
    h.stand(1, 10)
    h.d.worker_died(W1)
    h.consume("q", cid=1, slot=5)  # the replacement's first consumer has the same id
    h.publish("q")
    assert h.flush() == []
    assert h.woken(W1) == [5]


def test_a_requeue_runs_another_consumers_standing_pull(h: Standing) -> None:
    """Released messages go to whoever is woken for them, standing or not."""
    h.declare("q")
    h.publish("q")
    h.consume("q", cid=1, slot=5)
    h.woken(W1)
    (taken,) = h.pull(1, 1).deliveries
    h.consume("q", cid=2, slot=6, ch=2)
    h.stand(2, 10)
    h.send(W1, r.ChanClose(1, 1))
    events = h.flush()
    pulled = next(e for e in events if isinstance(e, r.Pulled))
    assert pulled.consumer == 2
    assert [(d.entry, d.redelivered) for d in pulled.deliveries] == [(taken.entry, True)]
