"""Channel pulls (deliverSingleMessage): a consumer waiting for credit from a backlog
(ConsumerTarget.top_up) and standing pulls (r.Pull.standing).

Driven through a real AMQPConnection and ConnectionHandler (see the harness in
``tests/workers/helpers.py``); the records the channel sends are what is asserted on.
"""

from __future__ import annotations

from pamqp import commands

from ipc import records as r
from tests.workers.channel_helpers import deliver, delivery_tags, with_prefetch
from tests.workers.helpers import (
    CONN,
    Harness,
    consumer,
    interests,
    methods,
    pulls,
)
from workers.consumer_target import PULL_BATCH, ConsumerTarget

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


def test_global_qos_pulls_say_the_client_limits_them_when_little_came_back() -> None:
    """The channel's global prefetch full on backlogs: less than half of it back within
    PULL_DEFER and its shared pull carries r.Pull.limited (its client limits its consumers,
    not the supervisor); half of it back, or credit pulled at once, does not."""
    h = Harness()
    first, second = _two_on_backlogs(h, 10)
    h.handler.worker.targets.take_deferred()
    for tag in range(1, 6):
        h.client(1, commands.Basic.Ack(delivery_tag=tag))
    shared = pulls(h.take())
    assert sorted(p.max for p in shared) == [2, 3] and not any(p.limited for p in shared)
    deliver(h, first, [301, 302, 303], more=True)
    deliver(h, second, [304, 305], more=True)
    h.take()
    h.client(1, commands.Basic.Ack(delivery_tag=6))
    assert pulls(h.take()) == []
    for waiting in h.handler.worker.targets.take_deferred():
        h.handler.pull_due(waiting)  # PULL_DEFER later, one ack back
    [pull] = pulls(h.take())
    assert pull.max == 1 and pull.limited


def test_global_qos_pulls_without_a_backlog_are_not_limited() -> None:
    """Credit pulled at once (the first pull, no backlog) carries no r.Pull.limited."""
    h = Harness()
    h.client(1, commands.Basic.Qos(prefetch_count=10, global_=True))
    target = consumer(h, 1, "c1", "q1")
    h.notify(target)
    [pull] = pulls(h.take())
    assert pull.max == 10 and not pull.limited


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


def test_global_qos_consumers_notified_in_one_batch_share_the_credit() -> None:
    """Slots set in one batch of events (the worker reads them in slot order, the same
    consumer first each time): every consumer of the batch is notified before the first
    pulls, and the channel's credit is split between them, not all taken by the first."""
    h = Harness()
    h.client(1, commands.Basic.Qos(prefetch_count=6, global_=True))
    targets = [consumer(h, 1, f"c{i}", f"q{i}") for i in range(3)]
    h.notify(*targets)
    assert sorted((p.consumer, p.max) for p in pulls(h.take())) == sorted(
        (target.id, 2) for target in targets)


def test_global_qos_a_consumer_interested_while_the_channel_is_out_of_credit_stays_so() -> None:
    """A consumer that has not pulled yet said it is interested, and its sibling's pull took the
    channel's credit before the supervisor notified it: it does not say it is not interested
    (PULL_DEFER at most), and the next credit back is split with it, not all pulled by the
    sibling. Saying so would cost it the notification on its way, and under CPU load each ack
    would be an Interest true and false that the supervisor reads in one batch, never notifying
    it (one queue took all its 300 of a channel's first 450 deliveries)."""
    h = Harness()
    armed: list[bool] = []
    h.handler.worker.targets.arm_defer = lambda: armed.append(True)
    h.client(1, commands.Basic.Qos(prefetch_count=4, global_=True))
    first = consumer(h, 1, "c1", "q1")
    h.notify(first)
    assert pulls(h.take()) == [r.Pull(first.id, 4, False, first.pull_seq)]
    deliver(h, first, [1, 2, 3, 4], more=True)
    h.take()
    second = consumer(h, 1, "c2", "q2")  # consumed with no credit: not interested
    h.client(1, commands.Basic.Ack(delivery_tag=1))
    assert _not_settles(h) == [r.Interest(second.id, True)]
    h.client(1, commands.Basic.Ack(delivery_tag=2))
    assert _not_settles(h) == [r.Pull(first.id, 2, False, first.pull_seq)]
    assert second.interested and armed
    deliver(h, first, [5, 6], more=True)
    h.notify(second)  # the channel's credit is all out
    assert _not_settles(h) == [] and second.interested and second.notified
    h.client(1, commands.Basic.Ack(delivery_tag=3))  # its turn
    assert pulls(h.take()) == [r.Pull(second.id, 1, False, second.pull_seq)]
