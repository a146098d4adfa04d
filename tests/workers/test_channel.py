"""Channel: credit and interest (setNotifyWorkDesired), pulls (deliverSingleMessage),
delivery tags and settling, reply order, confirms, the "last declared queue".

Driven through a real AMQPConnection and ConnectionHandler (see the harness in
``tests/workers/helpers.py``); the records the channel sends are what is asserted on.
"""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands, header

from ipc import records as r
from tests.workers.helpers import (
    CONN,
    Harness,
    consumer,
    interests,
    methods,
    pulls,
)
from workers.consumer_target import PULL_BATCH, ConsumerTarget


def deliver(h: Harness, target: ConsumerTarget, entries: list[int], more: bool = False,
            still_open: int = 0, seq: int = 0) -> None:
    """The supervisor's Pulled; ``seq``: the last of the target's pulls it had applied
    (0: every pull sent so far)."""
    h.supervisor(r.Pulled(target.id, [h.delivery(e) for e in entries], more, still_open, seq))


def delivery_tags(frames: list[tuple[int, Any]]) -> list[tuple[int, int | None]]:
    """(channel, delivery tag) of each basic.deliver / basic.get-ok written."""
    return [(n, f.delivery_tag) for n, f in frames
            if isinstance(f, (commands.Basic.Deliver, commands.Basic.GetOk))]


def with_prefetch(h: Harness, count: int, tag: str = "c1", *, global_: bool = False,
                  queue: str = "q") -> ConsumerTarget:
    h.client(1, commands.Basic.Qos(prefetch_count=count, global_=global_))
    return consumer(h, 1, tag, queue)


def only_channel_close(h: Harness) -> commands.Channel.Close:
    [(n, close)] = methods(h.frames())
    assert n == 1 and isinstance(close, commands.Channel.Close)
    return close


# -- credit and interest (seed: setNotifyWorkDesired) --------------------------------


def test_consume_with_credit_is_interested() -> None:
    """A consumer with prefetch credit says it is interested in its Consume record."""
    h = Harness()
    h.client(1, commands.Basic.Qos(prefetch_count=2))
    h.client(1, commands.Basic.Consume(queue="q", consumer_tag="c1"))
    [consume] = h.take()
    assert isinstance(consume, r.Consume)
    assert (consume.queue, consume.tag, consume.interested) == ("q", "c1", True)


def test_prefetch_exhausted_makes_consumer_uninterested_and_ack_restores() -> None:
    """seed: setNotifyWorkDesired follows credit: N unacked → Interest(False); an ack → (True)."""
    h = Harness()
    target = with_prefetch(h, 2)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 2, True, target.pull_seq)]
    deliver(h, target, [11], more=True)
    assert interests(h.take()) == []  # one unacked, one credit left
    h.notify(target)
    h.take()
    deliver(h, target, [12], more=True)
    assert h.take() == [r.Interest(target.id, False)]

    h.client(1, commands.Basic.Ack(delivery_tag=1))
    # The last pull said the queue has more: the credit is pulled with the Interest, not
    # after a notification's round trip (ConsumerTarget.more).
    assert h.take() == [r.Settle(CONN, 1, [11], r.ACK), r.Interest(target.id, True),
                        r.Pull(target.id, 1, True, target.pull_seq)]


def test_an_ack_after_a_standing_pull_was_used_up_pulls_again() -> None:
    """A standing pull that its deliveries used up (the queue had no more) is asked for again
    with the credit the ack gives back: the queue's next message finds it open instead of
    waiting for a notification and a pull."""
    h = Harness()
    target = with_prefetch(h, 1)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 1, True, target.pull_seq)]
    deliver(h, target, [11], more=False)
    assert h.take() == [r.Interest(target.id, False)]
    h.client(1, commands.Basic.Ack(delivery_tag=1))
    assert h.take() == [r.Settle(CONN, 1, [11], r.ACK), r.Interest(target.id, True),
                        r.Pull(target.id, 1, True, target.pull_seq)]


def test_a_used_up_standing_pull_is_renewed_at_once_with_the_credit_left() -> None:
    """Prefetch 4, a standing pull of 4 used up while two of them are acked already: the
    answer's 2 of credit are pulled again at once (standing), without a notification."""
    h = Harness()
    target = with_prefetch(h, 4)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 4, True, target.pull_seq)]
    deliver(h, target, [1, 2], more=False, still_open=2)
    h.client(1, commands.Basic.Ack(delivery_tag=2, multiple=True))
    assert pulls(h.take()) == []  # the rest of the pull stays open
    deliver(h, target, [3, 4], more=False)
    assert pulls(h.take()) == [r.Pull(target.id, 2, True, target.pull_seq)]


def test_an_ack_after_a_pull_that_emptied_the_queue_only_restores_interest() -> None:
    """Under basic.qos global=true pulls are not standing: without "more" from the queue the
    consumer waits to be notified (no spurious pull)."""
    h = Harness()
    target = with_prefetch(h, 1, global_=True)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 1, False, target.pull_seq)]
    deliver(h, target, [11], more=False)
    assert h.take() == [r.Interest(target.id, False)]
    h.client(1, commands.Basic.Ack(delivery_tag=1))
    assert h.take() == [r.Settle(CONN, 1, [11], r.ACK), r.Interest(target.id, True)]


def test_notify_leads_to_one_pull_of_the_credit() -> None:
    """seed: notifyWork → deliverSingleMessage: one Pull for the credit, none while in flight."""
    h = Harness()
    target = with_prefetch(h, 5)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 5, True, target.pull_seq)]
    h.notify(target)
    h.refresh()
    assert h.take() == []


def test_pulled_with_more_pulls_again_with_remaining_credit() -> None:
    """seed: a notified consumer keeps pulling while pulls succeed and credit remains."""
    h = Harness()
    target = with_prefetch(h, 5)
    h.notify(target)
    h.take()
    deliver(h, target, [1, 2], more=True)
    assert pulls(h.take()) == [r.Pull(target.id, 3, True, target.pull_seq)]


def test_pulled_without_more_stops_until_next_notify() -> None:
    """seed: the first empty pull sends the consumer back to Interested: no pull until notified."""
    h = Harness()
    target = with_prefetch(h, 5)
    h.notify(target)
    h.take()
    deliver(h, target, [1], more=False)
    assert h.take() == []
    h.refresh()
    assert h.take() == []
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 4, True, target.pull_seq)]


def test_notify_seen_before_the_answer_of_the_pull_in_flight_is_not_lost() -> None:
    """The supervisor answers a pull (more=False: back to Interested), then a new message
    notifies the consumer again; the worker can find the slot set before it reads that answer.
    The answer must not undo the newer notification, or the consumer stalls while the
    supervisor thinks it Notified."""
    h = Harness()
    target = with_prefetch(h, 5)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 5, True, target.pull_seq)]
    h.notify(target)  # the slot, read before the Pulled event below
    assert h.take() == []
    deliver(h, target, [1], more=False)
    assert pulls(h.take()) == [r.Pull(target.id, 4, True, target.pull_seq)]
    deliver(h, target, [], more=False)  # that round is over: nothing more until notified
    assert h.take() == []


def test_unlimited_consumer_pulls_a_batch() -> None:
    """Without prefetch a Pull asks for PULL_BATCH, the most one turn may take."""
    h = Harness()
    target = consumer(h)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, PULL_BATCH, True, target.pull_seq)]


# -- waiting for credit from a backlog (ConsumerTarget.top_up) ---------------------------


def _all_taken(h: Harness, *, more: bool) -> tuple[ConsumerTarget, list[bool]]:
    """A consumer with prefetch 10 that was handed 10 messages (``more``: the queue has a
    backlog), on a worker with the PULL_DEFER timer the server installs (what arming it
    recorded)."""
    armed: list[bool] = []
    h.handler.worker.targets.arm_defer = lambda: armed.append(True)
    target = with_prefetch(h, 10)
    h.notify(target)
    h.take()
    deliver(h, target, list(range(11, 21)), more=more)
    if more:  # it stays interested for PULL_DEFER: an ack is likely on its way
        assert h.take() == [] and armed == [True]
    else:
        assert h.take() == [r.Interest(target.id, False)]
    return target, armed


def _not_settles(h: Harness) -> list[object]:
    return [rec for rec in h.take() if not isinstance(rec, r.Settle)]


def test_a_consumer_acking_each_message_of_a_backlog_pulls_half_its_prefetch_at_a_time() -> None:
    """Four records a message (Interest, Pull, deliveries, Interest) become two per five."""
    h = Harness()
    target, armed = _all_taken(h, more=True)
    for tag in range(1, 5):
        h.client(1, commands.Basic.Ack(delivery_tag=tag))
    assert _not_settles(h) == []
    assert armed == [True]  # one timer for the wait
    h.client(1, commands.Basic.Ack(delivery_tag=5))
    assert _not_settles(h) == [r.Pull(target.id, 5, True, target.pull_seq)]


def test_a_consumer_working_off_a_backlog_pulls_again_before_its_pull_is_answered() -> None:
    """Prefetch 10, each message acked: once half is back the next pull goes even though the
    last is still in flight (otherwise the client would wait a whole round trip with half its
    credit unused); what both asked for counts against the prefetch until each is answered."""
    h = Harness()
    target, _ = _all_taken(h, more=True)
    for tag in range(1, 6):
        h.client(1, commands.Basic.Ack(delivery_tag=tag))
    first = target.pull_seq
    assert _not_settles(h) == [r.Pull(target.id, 5, True, first)]
    for tag in range(6, 10):
        h.client(1, commands.Basic.Ack(delivery_tag=tag))
    assert _not_settles(h) == []  # 4 back, 5 asked for: not enough for another
    h.client(1, commands.Basic.Ack(delivery_tag=10))
    assert _not_settles(h) == [r.Pull(target.id, 5, True, first + 1)]
    assert target.pulling == 10 and target.unacked == 0

    deliver(h, target, list(range(21, 26)), more=True, seq=first)  # the second not seen yet
    assert target.pulling == 5 and target.unacked == 5
    assert _not_settles(h) == []  # 5 held, 5 asked for: no credit to pull with
    deliver(h, target, list(range(26, 31)), more=True, seq=first + 1)
    assert target.pulling == 0 and target.unacked == 10
    assert h.take() == []  # still interested until an ack, or PULL_DEFER
    assert [tag for _, tag in delivery_tags(h.frames())] == list(range(1, 21))


def test_a_pull_sent_before_the_last_was_answered_stays_counted_in_a_standing_answer() -> None:
    """The queue ran dry under the first of two pulls in flight: its answer leaves the rest of
    it open, and the second, which the supervisor had not seen yet, is still asked for."""
    h = Harness()
    target, _ = _all_taken(h, more=True)
    for tag in range(1, 11):
        h.client(1, commands.Basic.Ack(delivery_tag=tag))
    first = target.pull_seq - 1
    assert pulls(h.take()) == [r.Pull(target.id, 5, True, first), r.Pull(target.id, 5, True, first + 1)]
    deliver(h, target, [21, 22], still_open=3, seq=first)
    assert target.pulling == 3 + 5
    # The supervisor adds the second to what stayed open (8) and serves one message of it.
    deliver(h, target, [23], still_open=7, seq=first + 1)
    assert target.pulling == 7 and target.unacked == 3
    assert pulls(h.take()) == []  # everything the prefetch allows is asked for


def test_without_a_backlog_credit_back_does_not_pull_past_an_open_pull() -> None:
    """At a light load (no backlog) the standing pull left open covers the credit: acks add
    nothing to it, as before (one Pull record per prefetch's worth of messages)."""
    h = Harness()
    target = with_prefetch(h, 10)
    h.notify(target)
    h.take()
    deliver(h, target, [11, 12, 13, 14, 15, 16], still_open=4)
    for tag in range(1, 7):
        h.client(1, commands.Basic.Ack(delivery_tag=tag))
    assert pulls(h.take()) == []
    assert target.pulling == 4


def test_global_qos_never_has_two_pulls_in_flight() -> None:
    """basic.qos global=true: the channel's consumers share the credit a pull reserves; one
    pull at a time, as the supervisor's notifications decide who takes what."""
    h = Harness()
    target = with_prefetch(h, 10, global_=True)
    h.notify(target)
    assert pulls(h.take()) == [r.Pull(target.id, 10, False, target.pull_seq)]
    deliver(h, target, list(range(11, 21)), more=True)
    h.take()
    for tag in range(1, 11):
        h.client(1, commands.Basic.Ack(delivery_tag=tag))
        assert len(pulls(h.take())) <= 1
    assert target.pulling <= 10


def test_a_cancelled_consumer_is_kept_until_both_its_pulls_are_answered() -> None:
    """basic.cancel with two pulls in flight: the target stays known until the second answer,
    and what each brought goes back to the queue."""
    h = Harness()
    target, _ = _all_taken(h, more=True)
    for tag in range(1, 11):
        h.client(1, commands.Basic.Ack(delivery_tag=tag))
    h.take()
    first = target.pull_seq - 1
    h.client(1, commands.Basic.Cancel(consumer_tag="c1", nowait=True))
    assert isinstance(h.take()[0], r.Cancel)
    deliver(h, target, [21, 22, 23, 24, 25], more=True, seq=first)
    assert h.take() == [r.Settle(CONN, 1, [21, 22, 23, 24, 25], r.REQUEUE)]
    assert h.handler.worker.targets.get(target.id) is target
    deliver(h, target, [26, 27], seq=first + 1)
    assert h.take() == [r.Settle(CONN, 1, [26, 27], r.REQUEUE)]
    assert h.handler.worker.targets.get(target.id) is None


def test_the_timer_pulls_what_came_back_meanwhile() -> None:
    """A client that acks one message and then waits for the next one still gets it."""
    h = Harness()
    target, armed = _all_taken(h, more=True)
    h.client(1, commands.Basic.Ack(delivery_tag=1))
    assert _not_settles(h) == []
    assert h.handler.worker.targets.take_deferred() == {target} and armed == [True]
    h.handler.pull_due(target)  # PULL_DEFER later
    # Its prefetch was full and one ack came back within PULL_DEFER: its client limits it.
    assert h.take() == [r.Pull(target.id, 1, True, target.pull_seq, limited=True)]


def test_a_consumer_out_of_credit_on_a_backlog_stays_interested_until_an_ack() -> None:
    """All its prefetch out and the queue has more: it does not say it is not interested
    (the supervisor would stop counting it as waiting on its backlog, and the next ack would
    say interested again) unless PULL_DEFER passes with no credit back."""
    h = Harness()
    target, _ = _all_taken(h, more=True)
    assert target.interested
    assert h.handler.worker.targets.take_deferred() == {target}
    h.handler.pull_due(target)  # PULL_DEFER later, nothing acked: a consumer that stopped
    assert h.take() == [r.Interest(target.id, False)]
    assert not target.interested
    for tag in range(1, 6):
        h.client(1, commands.Basic.Ack(delivery_tag=tag))
    assert _not_settles(h) == [r.Interest(target.id, True), r.Pull(target.id, 5, True, target.pull_seq)]


def test_without_a_backlog_credit_is_used_at_once() -> None:
    """The wait is for a queue that said it has more: after a standing pull the queue's
    messages used up, the first credit back is pulled at once (ConsumerTarget.renew)."""
    h = Harness()
    target, armed = _all_taken(h, more=False)
    h.client(1, commands.Basic.Ack(delivery_tag=1))
    assert _not_settles(h) == [r.Interest(target.id, True), r.Pull(target.id, 1, True, target.pull_seq)]
    assert armed == []


def test_without_a_backlog_a_notification_pulls_whatever_credit() -> None:
    """A pull that ended with credit left (not used up: a non-standing pull, under global
    qos) waits for a notification, which pulls whatever credit there is, no timer."""
    armed: list[bool] = []
    h = Harness()
    h.handler.worker.targets.arm_defer = lambda: armed.append(True)
    target = with_prefetch(h, 10, global_=True)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 10, False, target.pull_seq)]
    deliver(h, target, list(range(11, 21)), more=False)
    assert h.take() == [r.Interest(target.id, False)]
    h.client(1, commands.Basic.Ack(delivery_tag=1))
    assert _not_settles(h) == [r.Interest(target.id, True)]
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 1, False, target.pull_seq)]
    assert armed == []


# -- standing pulls (r.Pull.standing) -------------------------------------------------


def test_a_standing_pull_left_open_asks_for_nothing_more() -> None:
    """The supervisor keeps the rest of the pull open (``open``): deliveries come without
    another Pull, and a notification set before the answer was covered by it."""
    h = Harness()
    target = with_prefetch(h, 10)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 10, True, target.pull_seq)]
    h.notify(target)  # the slot was set again while the pull was in flight
    deliver(h, target, [11], still_open=9)
    assert pulls(h.take()) == []
    assert (target.pulling, target.notified) == (9, False)
    deliver(h, target, [12], still_open=8)
    assert pulls(h.take()) == []
    assert delivery_tags(h.frames()) == [(1, 1), (1, 2)]


def test_a_standing_pull_used_up_is_asked_for_again_when_credit_returns() -> None:
    """Its deliveries used the pull up while both credits are out: the ack that gives them
    back brings the Interest and a new standing pull, no notification needed."""
    h = Harness()
    target = with_prefetch(h, 2)
    h.notify(target)
    h.take()
    deliver(h, target, [11], still_open=1)
    deliver(h, target, [12])
    assert target.pulling == 0
    assert h.take() == [r.Interest(target.id, False)]  # both credits are out
    h.client(1, commands.Basic.Ack(delivery_tag=2, multiple=True))
    assert h.take() == [r.Settle(CONN, 1, [11, 12], r.ACK), r.Interest(target.id, True),
                        r.Pull(target.id, 2, True, target.pull_seq)]


def test_a_standing_pull_ended_by_the_supervisor_waits_for_a_notification() -> None:
    """An empty answer ends a standing pull (the queue went away, the consumer lost its
    interest): nothing is renewed until the consumer is notified again."""
    h = Harness()
    target = with_prefetch(h, 2)
    h.notify(target)
    h.take()
    deliver(h, target, [], still_open=2)
    deliver(h, target, [])
    assert target.pulling == 0
    h.refresh()
    assert h.take() == []
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 2, True, target.pull_seq)]


def test_a_cancelled_consumer_is_kept_until_its_standing_pull_is_ended() -> None:
    """basic.cancel with a pull left open: the target stays known until the supervisor's
    empty answer, and what a pull brought meanwhile goes back to the queue."""
    h = Harness()
    target = with_prefetch(h, 5)
    h.notify(target)
    h.take()
    deliver(h, target, [], still_open=5)
    h.client(1, commands.Basic.Cancel(consumer_tag="c1", nowait=True))
    assert isinstance(h.take()[0], r.Cancel)
    deliver(h, target, [31], still_open=4)  # run before the supervisor saw the cancel
    assert h.take() == [r.Settle(CONN, 1, [31], r.REQUEUE)]
    assert h.handler.worker.targets.get(target.id) is target
    deliver(h, target, [])  # the cancel's answer
    assert h.handler.worker.targets.get(target.id) is None


def test_global_qos_pulls_are_not_standing() -> None:
    """Under basic.qos global=true the channel's consumers share the credit: a pull left
    open would keep it from the others."""
    h = Harness()
    target = with_prefetch(h, 3, global_=True)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 3, False, target.pull_seq)]


def test_global_qos_is_shared_by_the_channels_consumers() -> None:
    """basic.qos global=true: consumers notified together never pull more than the shared credit."""
    h = Harness()
    h.client(1, commands.Basic.Qos(prefetch_count=3, global_=True))
    first = consumer(h, 1, "c1", "q1")
    second = consumer(h, 1, "c2", "q2")
    h.notify(first)
    h.notify(second)
    asked = pulls(h.take())
    assert sum(p.max for p in asked) == 3
    assert h.channel().pull_reserved == 3

    deliver(h, first, [1, 2, 3], more=True)
    h.notify(second)
    assert pulls(h.take()) == []
    assert not first.interested and not second.interested


def test_global_qos_ack_gives_credit_back_to_every_consumer() -> None:
    """An ack under global qos makes every consumer of the channel interested again."""
    h = Harness()
    h.client(1, commands.Basic.Qos(prefetch_count=1, global_=True))
    first = consumer(h, 1, "c1", "q1")
    second = consumer(h, 1, "c2", "q2")
    h.notify(first)
    h.take()
    deliver(h, first, [1], more=True)
    h.notify(second)
    assert set(interests(h.take())) == {r.Interest(first.id, False), r.Interest(second.id, False)}
    h.client(1, commands.Basic.Ack(delivery_tag=1))
    assert set(interests(h.take())) == {r.Interest(first.id, True), r.Interest(second.id, True)}


def test_global_credit_released_by_a_short_pull_reaches_the_other_consumers() -> None:
    """Global credit a pull reserved but did not use makes the channel's other consumers interested."""
    h = Harness()
    h.client(1, commands.Basic.Qos(prefetch_count=3, global_=True))
    first = consumer(h, 1, "c1", "q1")
    second = consumer(h, 1, "c2", "q2")
    h.notify(first)
    h.notify(second)
    assert h.take() == [r.Pull(first.id, 3, False, first.pull_seq), r.Interest(second.id, False)]
    deliver(h, first, [], more=False)  # q1 was empty after all
    assert r.Interest(second.id, True) in h.take()


def _two_on_backlogs(h: Harness, prefetch: int,
                     armed: list[bool] | None = None) -> tuple[ConsumerTarget, ConsumerTarget]:
    """basic.qos global=true ``prefetch``, consumers c1 on q1 and c2 on q2, notified together
    and each handed half the prefetch with "more" (both queues have a backlog), on a worker
    with the PULL_DEFER timer the server installs (``armed``: what arming it recorded)."""
    h.handler.worker.targets.arm_defer = lambda: (armed if armed is not None else []).append(True)
    h.client(1, commands.Basic.Qos(prefetch_count=prefetch, global_=True))
    first = consumer(h, 1, "c1", "q1")
    second = consumer(h, 1, "c2", "q2")
    first.notified = True  # both slots set in one batch of events
    h.notify(second)
    assert sorted(p.max for p in pulls(h.take())) == [prefetch // 2] * 2
    half = prefetch // 2
    deliver(h, first, list(range(100, 100 + half)), more=True)
    deliver(h, second, list(range(200, 200 + half)), more=True)
    h.take()
    return first, second


def test_global_qos_credit_is_split_between_the_notified_consumers() -> None:
    """A pull shared by the channel's consumers: what the channel has goes to every consumer
    notified at the time, evenly, not all of it to the first one asked."""
    h = Harness()
    h.client(1, commands.Basic.Qos(prefetch_count=7, global_=True))
    first = consumer(h, 1, "c1", "q1")
    second = consumer(h, 1, "c2", "q2")
    third = consumer(h, 1, "c3", "q3")
    first.notified = second.notified = True  # notified in one batch of events
    h.notify(third)
    assert sorted((p.consumer, p.max) for p in pulls(h.take())) == sorted(
        [(first.id, 3), (second.id, 2), (third.id, 2)])
    assert h.channel().pull_reserved == 7


def test_global_qos_credit_a_consumers_own_prefetch_leaves_goes_to_the_others() -> None:
    """Both limits apply (RabbitMQ): global 9 and a per-consumer prefetch of 1 for the first
    consumer; the 2 of its share it cannot take go to the other two."""
    h = Harness()
    h.client(1, commands.Basic.Qos(prefetch_count=1))
    first = consumer(h, 1, "c1", "q1")
    h.client(1, commands.Basic.Qos(prefetch_count=0))  # none for the consumers after it
    h.client(1, commands.Basic.Qos(prefetch_count=9, global_=True))
    second = consumer(h, 1, "c2", "q2")
    third = consumer(h, 1, "c3", "q3")
    first.notified = second.notified = True
    h.notify(third)
    assert sorted((p.consumer, p.max) for p in pulls(h.take())) == sorted(
        [(first.id, 1), (second.id, 4), (third.id, 4)])


def test_global_qos_takes_turns_between_queues_with_backlogs() -> None:
    """Each message acked on its own, both queues with a backlog: the credit each ack gives
    back goes to the two consumers in turn (RabbitMQ's queues share a channel's prefetch about
    evenly; before the shared pull the consumer that pulled last took nearly all of it)."""
    h = Harness()
    first, second = _two_on_backlogs(h, 2)  # half of 2 is 1: each ack's credit is pulled at once
    takers = []
    for tag in range(1, 5):
        h.client(1, commands.Basic.Ack(delivery_tag=tag))
        [pull] = pulls(h.take())
        assert pull.max == 1
        takers.append(pull.consumer)
        deliver(h, first if pull.consumer == first.id else second, [300 + tag], more=True)
        h.take()
    assert sorted(takers) == sorted([first.id, second.id] * 2)
    assert takers[0] != takers[1] and takers[1] != takers[2] and takers[2] != takers[3]


def test_global_qos_consumers_on_backlogs_stay_notified_while_the_channel_is_out_of_credit() -> None:
    """The channel's whole prefetch out, both queues with more: neither says it is not
    interested (the next ack's credit would otherwise go to whichever was notified first)
    unless PULL_DEFER passes with nothing acked."""
    h = Harness()
    armed: list[bool] = []
    first, second = _two_on_backlogs(h, 4, armed)
    assert h.take() == [] and first.interested and second.interested and armed == [True]
    assert h.handler.worker.targets.take_deferred() == {first, second}
    h.handler.pull_due(first)  # PULL_DEFER later, nothing acked
    h.handler.pull_due(second)
    assert set(interests(h.take())) == {r.Interest(first.id, False), r.Interest(second.id, False)}


def test_global_qos_waits_for_half_the_prefetch_before_pulling_from_backlogs() -> None:
    """Acking each message from backlogs under a global prefetch of 10: no pull a message;
    the credit is pulled once half the prefetch is back, split between the consumers, or
    when PULL_DEFER passes with less."""
    h = Harness()
    first, second = _two_on_backlogs(h, 10)
    h.handler.worker.targets.take_deferred()
    for tag in range(1, 5):
        h.client(1, commands.Basic.Ack(delivery_tag=tag))
        assert pulls(h.take()) == []
    h.client(1, commands.Basic.Ack(delivery_tag=5))
    assert sorted(p.max for p in pulls(h.take())) == [2, 3]
    deliver(h, first, [301, 302, 303], more=True)  # (either order: each got a share)
    deliver(h, second, [304, 305], more=True)
    h.take()
    h.client(1, commands.Basic.Ack(delivery_tag=6))
    assert pulls(h.take()) == []
    for waiting in h.handler.worker.targets.take_deferred():
        h.handler.pull_due(waiting)  # PULL_DEFER later: the one credit back is pulled
    [pull] = pulls(h.take())
    assert pull.max == 1


def test_a_no_ack_consumer_is_not_held_to_a_global_prefetch() -> None:
    """AMQP 0-9-1: prefetch limits acknowledged deliveries only, the channel's too."""
    h = Harness()
    h.client(1, commands.Basic.Qos(prefetch_count=1, global_=True))
    target = consumer(h, 1, "c1", "q1", no_ack=True)
    h.notify(target)
    assert pulls(h.take()) == [r.Pull(target.id, PULL_BATCH, False, target.pull_seq)]


def test_cancel_nowait_with_pull_in_flight_gives_its_credit_back() -> None:
    """A consumer cancelled while pulling does not keep the channel's global credit."""
    h = Harness()
    h.client(1, commands.Basic.Qos(prefetch_count=2, global_=True))
    first = consumer(h, 1, "c1", "q1")
    h.notify(first)
    assert h.take() == [r.Pull(first.id, 2, False, first.pull_seq)]
    h.client(1, commands.Basic.Cancel(consumer_tag="c1", nowait=True))
    deliver(h, first, [], more=False)
    h.client(1, commands.Basic.Consume(queue="q2", consumer_tag="c2"))
    [consume] = [rec for rec in h.take() if isinstance(rec, r.Consume)]
    assert consume.interested


def test_no_ack_consumer_ignores_prefetch_and_settles_on_delivery() -> None:
    """no-ack deliveries are not limited by prefetch and are settled (AUTO_ACK) right after delivery."""
    h = Harness()
    h.client(1, commands.Basic.Qos(prefetch_count=1))
    target = consumer(h, no_ack=True)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, PULL_BATCH, True, target.pull_seq)]
    deliver(h, target, [21, 22], more=True)
    assert h.take() == [r.Settle(CONN, 1, [21, 22], r.AUTO_ACK), r.Pull(target.id, PULL_BATCH, True, target.pull_seq)]
    assert delivery_tags(h.frames()) == [(1, 1), (1, 2)]
    assert not h.channel().unacked and target.unacked == 0


def test_consume_before_consume_ok_does_not_pull() -> None:
    """Deliveries never precede consume-ok: a notified consumer pulls only once it is sent."""
    h = Harness()
    h.client(1, commands.Basic.Consume(queue="q", consumer_tag="c1"))
    h.take()
    target = h.channel().consumers["c1"]
    h.notify(target)
    assert h.take() == []
    h.supervisor(r.Reply(CONN, 1, "consume"))
    [(n, ok)] = methods(h.frames())
    assert n == 1 and isinstance(ok, commands.Basic.ConsumeOk) and ok.consumer_tag == "c1"
    assert h.take() == [r.Pull(target.id, PULL_BATCH, True, target.pull_seq)]


def test_channel_flow_switches_interest() -> None:
    """channel.flow active=false: consumers uninterested; active=true: interested again."""
    h = Harness()
    target = consumer(h)
    h.client(1, commands.Channel.Flow(active=False))
    assert h.take() == [r.Interest(target.id, False)]
    h.notify(target)
    assert h.take() == []
    h.client(1, commands.Channel.Flow(active=True))
    assert h.take()[0] == r.Interest(target.id, True)
    assert [f.active for _, f in methods(h.frames())] == [False, True]


# -- delivery tags and settling ---------------------------------------------------------


def test_delivery_tags_increase_per_channel_from_one() -> None:
    """Delivery tags are the channel's: 1, 2, 3… on each channel, get-ok included."""
    h = Harness(channels=(1, 2))
    first = consumer(h, 1, "c1")
    second = consumer(h, 2, "c2")
    h.notify(first)
    h.notify(second)
    deliver(h, first, [1, 2])
    deliver(h, second, [3])
    h.client(1, commands.Basic.Get(queue="q"))
    h.supervisor(r.GetOk(CONN, 1, h.delivery(4), 0))
    deliver(h, second, [5])
    assert delivery_tags(h.frames()) == [(1, 1), (1, 2), (2, 1), (1, 3), (2, 2)]


def _three_delivered(h: Harness) -> ConsumerTarget:
    target = consumer(h)
    h.notify(target)
    deliver(h, target, [11, 12, 13])
    h.take()
    h.frames()
    return target


def test_ack_multiple_settles_every_tag_up_to_it() -> None:
    """basic.ack multiple=true settles every unacked tag up to it, in one Settle, in order."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Basic.Ack(delivery_tag=2, multiple=True))
    assert h.take() == [r.Settle(CONN, 1, [11, 12], r.ACK)]
    h.client(1, commands.Basic.Ack(delivery_tag=3))
    assert h.take() == [r.Settle(CONN, 1, [13], r.ACK)]
    assert not h.channel().unacked


def test_ack_multiple_zero_settles_everything() -> None:
    """AMQP 0-9-1: multiple with delivery tag 0 acknowledges all outstanding messages."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Basic.Ack(delivery_tag=0, multiple=True))
    assert h.take() == [r.Settle(CONN, 1, [11, 12, 13], r.ACK)]


@pytest.mark.parametrize("tag", [5, 2])
def test_ack_of_unknown_tag_closes_the_channel(tag: int) -> None:
    """An unknown (or already acked) delivery tag is 406 PRECONDITION_FAILED, channel closed."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Basic.Ack(delivery_tag=2))
    h.take()
    h.client(1, commands.Basic.Ack(delivery_tag=tag))
    close = only_channel_close(h)
    assert close.reply_code == 406
    assert close.reply_text == f"PRECONDITION_FAILED - unknown delivery tag {tag}"
    assert (close.class_id, close.method_id) == (60, 80)
    assert h.take() == [r.ChanClose(CONN, 1)]


def test_nack_without_requeue_drops() -> None:
    """basic.nack requeue=false drops the message (Settle DROP)."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Basic.Nack(delivery_tag=2, requeue=False))
    assert h.take() == [r.Settle(CONN, 1, [12], r.DROP)]


def test_nack_multiple_with_requeue_requeues_up_to_it() -> None:
    """basic.nack multiple=true requeue=true requeues every tag up to it."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Basic.Nack(delivery_tag=2, multiple=True, requeue=True))
    assert h.take() == [r.Settle(CONN, 1, [11, 12], r.REQUEUE)]


@pytest.mark.parametrize(("requeue", "action"), [(True, r.REQUEUE), (False, r.DROP)])
def test_reject(requeue: bool, action: int) -> None:
    """basic.reject requeue=true requeues (Settle REQUEUE); requeue=false drops."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Basic.Reject(delivery_tag=3, requeue=requeue))
    assert h.take() == [r.Settle(CONN, 1, [13], action)]


def test_recover_requeues_every_unacked_message() -> None:
    """basic.recover requeues all unacked messages of the channel and answers recover-ok."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Basic.Ack(delivery_tag=2))
    h.take()
    h.client(1, commands.Basic.Recover(requeue=True))
    assert h.take() == [r.Settle(CONN, 1, [11, 13], r.REQUEUE)]
    assert [type(f) for _, f in methods(h.frames())] == [commands.Basic.RecoverOk]
    assert not h.channel().unacked


@pytest.mark.parametrize("recover", [commands.Basic.Recover(requeue=False),
                                     commands.Basic.RecoverAsync(requeue=False)],
                         ids=["recover", "recover-async"])
def test_recover_without_requeue_is_540_as_in_rabbitmq(recover: Any) -> None:
    """rabbit_channel: basic.recover / recover-async with requeue=false is 540 "requeue=false";
    nothing is settled."""
    h = Harness()
    _three_delivered(h)
    h.take()
    h.client(1, recover)
    [(channel, close)] = methods(h.frames())
    assert channel == 0 and isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - requeue=false")
    assert (close.class_id, close.method_id) == divmod(recover.index, 1 << 16)
    assert not [rec for rec in h.take() if isinstance(rec, r.Settle)]


def test_recover_async_requeues_without_a_reply() -> None:
    """basic.recover-async requeue=true: basic.recover without the recover-ok."""
    h = Harness()
    _three_delivered(h)
    h.take()
    h.client(1, commands.Basic.RecoverAsync(requeue=True))
    assert h.take() == [r.Settle(CONN, 1, [11, 12, 13], r.REQUEUE)]
    assert methods(h.frames()) == []


def test_get_no_ack_settles_and_get_ack_waits_for_ack() -> None:
    """basic.get no-ack settles at once; with acks the entry waits for basic.ack."""
    h = Harness()
    h.client(1, commands.Basic.Get(queue="q", no_ack=True))
    h.client(1, commands.Basic.Get(queue="q"))
    assert [rec.no_ack for rec in h.take()] == [True, False]
    h.supervisor(r.GetOk(CONN, 1, h.delivery(31), 1), r.GetOk(CONN, 1, h.delivery(32), 0))
    assert h.take() == [r.Settle(CONN, 1, [31], r.AUTO_ACK)]
    assert delivery_tags(h.frames()) == [(1, 1), (1, 2)]
    h.client(1, commands.Basic.Ack(delivery_tag=2))
    assert h.take() == [r.Settle(CONN, 1, [32], r.ACK)]


# -- reply order -------------------------------------------------------------------------


def test_local_reply_waits_behind_supervisor_reply() -> None:
    """AMQP 0-9-1 §2.2.2: queue.declare then basic.qos: qos-ok never precedes declare-ok."""
    h = Harness()
    h.client(1, commands.Queue.Declare(queue="q"))
    h.client(1, commands.Basic.Qos(prefetch_count=10))
    assert h.frames() == []
    h.supervisor(r.Reply(CONN, 1, "qdecl", queue="q", message_count=4))
    assert [type(f) for _, f in methods(h.frames())] == [
        commands.Queue.DeclareOk, commands.Basic.QosOk,
    ]


def test_local_replies_after_several_supervisor_replies_keep_their_order() -> None:
    """Local replies asked after several supervisor requests follow all of their replies."""
    h = Harness()
    h.client(1, commands.Queue.Declare(queue="q"))
    h.client(1, commands.Queue.Bind(queue="q", exchange="amq.fanout"))
    h.client(1, commands.Basic.Qos(prefetch_count=10))
    h.client(1, commands.Channel.Flow(active=True))
    h.supervisor(r.Reply(CONN, 1, "qdecl", queue="q"))
    assert [type(f) for _, f in methods(h.frames())] == [commands.Queue.DeclareOk]
    h.supervisor(r.Reply(CONN, 1, "qbind"))
    assert [type(f) for _, f in methods(h.frames())] == [
        commands.Queue.BindOk, commands.Basic.QosOk, commands.Channel.FlowOk,
    ]


def test_replies_come_in_request_order() -> None:
    """AMQP 0-9-1 §2.2.2: pipelined methods on one channel are answered in the order asked."""
    h = Harness()
    h.client(1, commands.Exchange.Declare(exchange="x", exchange_type="fanout"))
    h.client(1, commands.Queue.Declare(queue="q"))
    h.client(1, commands.Confirm.Select())
    h.client(1, commands.Queue.Bind(queue="q", exchange="x"))
    h.client(1, commands.Channel.Flow(active=True))
    h.supervisor(r.Reply(CONN, 1, "xdecl"), r.Reply(CONN, 1, "qdecl", queue="q"))
    h.supervisor(r.Reply(CONN, 1, "qbind"))
    assert [type(f) for _, f in methods(h.frames())] == [
        commands.Exchange.DeclareOk, commands.Queue.DeclareOk, commands.Confirm.SelectOk,
        commands.Queue.BindOk, commands.Channel.FlowOk,
    ]


def test_a_local_reply_after_a_mandatory_publish_waits_for_its_return() -> None:
    """confirm.select (answered by the worker itself) after an unroutable mandatory publish: a
    Sync goes through the supervisor first, so select-ok follows the publish's basic.return."""
    h = Harness()
    h.publish(1, exchange="", routing_key="nowhere", mandatory=True)
    h.client(1, commands.Confirm.Select())
    assert [type(rec) for rec in h.take()] == [r.Publish, r.Sync]
    assert h.frames() == []
    h.supervisor(_unroutable(h), r.Reply(CONN, 1, "sync"))
    assert [type(f) for _, f in methods(h.frames())] == [
        commands.Basic.Return, commands.Confirm.SelectOk]


@pytest.mark.parametrize("local", [commands.Basic.Qos(prefetch_count=1), commands.Channel.Flow(active=True),
                                   commands.Basic.Recover(requeue=True),
                                   commands.Basic.Cancel("unknown-tag")],
                         ids=["qos", "flow", "recover", "cancel"])
def test_every_local_reply_after_a_confirmed_publish_follows_its_ack(local: Any) -> None:
    """Whatever the worker answers itself, after a publish in confirm mode: the ack first."""
    h = Harness()
    h.client(1, commands.Confirm.Select())
    h.frames()
    h.publish(1, exchange="", routing_key="q")
    h.client(1, local)
    assert h.frames() == []
    h.supervisor(r.Confirm(CONN, 1, True), r.Reply(CONN, 1, "sync"))
    frames = methods(h.frames())
    assert [type(f) for _, f in frames][:1] == [commands.Basic.Ack] and len(frames) == 2


def test_no_sync_when_no_publish_can_still_be_answered() -> None:
    """Without a mandatory or confirmed publish since the last request, a local reply is at once."""
    h = Harness()
    h.publish(1, exchange="", routing_key="q")
    h.client(1, commands.Basic.Qos(prefetch_count=1))
    assert [type(rec) for rec in h.take()] == [r.Publish]
    assert [type(f) for _, f in methods(h.frames())] == [commands.Basic.QosOk]


def test_declare_ok_follows_the_acks_that_came_before_it() -> None:
    """A reply the worker encodes itself (declare-ok, get-ok) never overtakes an ack the same
    batch of supervisor events brought before it."""
    h = Harness()
    h.client(1, commands.Confirm.Select())
    h.frames()
    h.publish(1, exchange="", routing_key="q")
    h.client(1, commands.Queue.Declare(queue="q"))
    h.supervisor(r.Confirm(CONN, 1, True), r.Reply(CONN, 1, "qdecl", queue="q"))
    assert [type(f) for _, f in methods(h.frames())] == [commands.Basic.Ack, commands.Queue.DeclareOk]


def _unroutable(h: Harness) -> r.Returned:
    head = header.ContentHeader(0, 1, commands.Basic.Properties()).marshal()
    offset = h.worker.region.arena.store(head + b"m")
    return r.Returned(CONN, 1, 312, "NO_ROUTE", "", "nowhere", offset, len(head), 1)


# -- publisher confirms ------------------------------------------------------------------


def test_confirms_of_one_batch_become_one_ack_multiple() -> None:
    """Confirms arriving in one batch are one basic.ack multiple=true for the last sequence."""
    h = Harness()
    h.client(1, commands.Confirm.Select())
    h.frames()
    for _ in range(4):
        h.publish(1, b"m", exchange="", routing_key="q")
    assert [rec.confirm for rec in h.take()] == [True] * 4
    h.supervisor(*[r.Confirm(CONN, 1, True)] * 3)
    [(n, ack)] = h.frames()
    assert n == 1 and isinstance(ack, commands.Basic.Ack)
    assert (ack.delivery_tag, ack.multiple) == (3, True)
    h.supervisor(r.Confirm(CONN, 1, True))
    [(_, ack)] = h.frames()
    assert (ack.delivery_tag, ack.multiple) == (4, False)


def test_publish_without_confirm_mode_is_not_numbered() -> None:
    """Outside confirm mode a publish carries confirm=false and nothing is acked."""
    h = Harness()
    h.publish(1, b"m", exchange="", routing_key="q")
    [pub] = h.take()
    assert isinstance(pub, r.Publish) and not pub.confirm and pub.body_len == 1
    assert h.channel().published == 0


# -- queue name "" means the last declared queue ------------------------------------------

_EMPTY_QUEUE_METHODS = [
    (commands.Basic.Consume(queue="", consumer_tag="c1"), r.Consume),
    (commands.Queue.Bind(queue="", exchange="amq.fanout", routing_key="k"), r.QueueBind),
    (commands.Basic.Get(queue=""), r.Get),
]


@pytest.mark.parametrize(("method", "record"), _EMPTY_QUEUE_METHODS)
def test_empty_queue_name_means_last_declared(method: Any, record: type[Any]) -> None:
    """AMQP 0-9-1: queue name "" means the last queue declared on the channel."""
    h = Harness()
    h.client(1, commands.Queue.Declare(queue=""))
    h.supervisor(r.Reply(CONN, 1, "qdecl", queue="amq.gen-abc"))
    h.frames()
    h.take()
    h.client(1, method)
    [rec] = h.take()
    assert isinstance(rec, record) and rec.queue == "amq.gen-abc"


@pytest.mark.parametrize(("method", "record"), _EMPTY_QUEUE_METHODS)
def test_empty_queue_name_without_declared_queue_is_not_found(method: Any, record: type) -> None:
    """Queue name "" with no queue declared on the channel is 404 NOT_FOUND, channel closed."""
    h = Harness()
    h.client(1, method)
    close = only_channel_close(h)
    assert close.reply_code == 404
    assert h.take() == [r.ChanClose(CONN, 1)]


def test_bind_with_empty_queue_and_key_uses_the_queue_name_as_key() -> None:
    """queue.bind with queue "" and routing key "" binds the last queue by its own name."""
    h = Harness()
    h.client(1, commands.Queue.Declare(queue="q"))
    h.take()
    h.client(1, commands.Queue.Bind(queue="", exchange="amq.direct", routing_key=""))
    [bind] = h.take()
    assert (bind.queue, bind.routing_key) == ("q", "q")


def test_empty_queue_name_after_pipelined_server_named_declare() -> None:
    """A channel is serial: "" names the queue a still-unanswered queue.declare creates."""
    h = Harness()
    h.client(1, commands.Queue.Declare(queue="", exclusive=True))
    h.client(1, commands.Basic.Consume(queue="", consumer_tag="c1"))
    assert h.proto.is_channel_open(1)
    h.supervisor(r.Reply(CONN, 1, "qdecl", queue="amq.gen-abc"))
    consumes = [rec for rec in h.take() if isinstance(rec, r.Consume)]
    assert [c.queue for c in consumes] == ["amq.gen-abc"]


def test_an_ack_behind_an_unanswered_server_named_declare_waits_for_it() -> None:
    """The channel is serial for acks too (read on the hot path, AckReceived): an ack after a
    queue.declare whose name the supervisor has yet to give settles only after declare-ok."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Queue.Declare(queue="", exclusive=True))
    h.client(1, commands.Basic.Ack(delivery_tag=2))
    assert [type(rec) for rec in h.take()] == [r.QueueDeclare]
    h.supervisor(r.Reply(CONN, 1, "qdecl", queue="amq.gen-abc"))
    assert h.take() == [r.Settle(CONN, 1, [12], r.ACK)]
    assert [type(m) for _, m in h.frames()] == [commands.Queue.DeclareOk]
    h.client(1, commands.Basic.Ack(delivery_tag=2))  # acked already: 406, as any unknown tag
    assert only_channel_close(h).reply_code == 406


# -- basic.return -----------------------------------------------------------------


def _returned(h: Harness, **reheader: Any) -> tuple[Any, Any, bytes]:
    """Publish a message with headers, have the supervisor return it; what the client got."""
    data = b"unroutable"
    head = header.ContentHeader(0, len(data), commands.Basic.Properties(
        headers={"CC": ["a"], "BCC": ["b"]}, expiration="500", message_id="m1")).marshal()
    offset = h.worker.region.arena.store(head + data)
    h.supervisor(r.Returned(CONN, 1, 312, "NO_ROUTE", "", "nowhere", offset, len(head),
                            len(data), **reheader))
    (_, method), (_, content), (_, payload) = h.frames()
    assert isinstance(method, commands.Basic.Return)
    assert (method.reply_code, method.routing_key) == (312, "nowhere")
    return method, content, payload.value


def test_return_passes_the_published_header_through() -> None:
    _, content, body = _returned(Harness())
    assert content.properties.headers == {"CC": ["a"], "BCC": ["b"]}
    assert body == b"unroutable"


def test_return_with_reheader_sends_the_new_headers_and_keeps_other_properties() -> None:
    _, content, body = _returned(Harness(), reheader=True, headers={"CC": ["a"]}, expiration="500")
    assert content.properties.headers == {"CC": ["a"]}
    assert (content.properties.expiration, content.properties.message_id) == ("500", "m1")
    assert body == b"unroutable"
