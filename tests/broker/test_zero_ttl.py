"""TTL 0 (x-message-ttl 0, expiration "0"): delivered to a consumer that can take it at once, else expired.

RabbitMQ: "a message with TTL 0 ... will expire upon reaching a queue unless it can be delivered
to a consumer immediately" (the replacement for the immediate flag), dead-lettered with reason
``expired``. Here "delivered at once" is a notification and the pull it causes: the entry stays
only for that round of pulls (broker.queues.featured.featured_queue's module docstring).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from broker.messages.message import Message
from broker.queues.consumer_manager import INTERESTED, NOTIFIED, REMOVED
from broker.queues.entry_state import ACQUIRED
from broker.queues.featured.featured_queue import FeaturedQueue
from broker.queues.featured.zero_ttl import ZERO_TTL_GRACE
from broker.queues.queue import Queue
from broker.topology.vhost import VirtualHost
from tests.broker.support import ME, attach, consumer, keys, message

DLX_ARGS = {"x-dead-letter-exchange": "dlx"}




def _zero_queue(vhost: VirtualHost, **arguments: Any) -> FeaturedQueue:
    q = vhost.declare_queue("q", owner=ME, arguments={"x-message-ttl": 0, **arguments})
    assert isinstance(q, FeaturedQueue)
    return q


def _dead(vhost: VirtualHost, dlq: Queue) -> list[tuple[Message, str]]:
    """What reached the dead-letter queue: (original message, x-death reason)."""
    vhost.drain()
    out = []
    for entry in dlq.available_entries():
        copy = entry.message
        assert copy.headers is not None and copy.origin is not None
        out.append((copy.origin, copy.headers["x-death"][0]["reason"]))
    return out


# ------------------------------------------------------------------ delivered at once


def test_zero_ttl_message_goes_to_an_interested_consumer(vhost: VirtualHost, dropped: list[Message]) -> None:
    """x-message-ttl 0: a consumer with credit is notified and its pull gets the message."""
    q = _zero_queue(vhost)
    c = consumer("c")
    attach(q, c)
    m = message()
    routed, notify = vhost.publish("", m, now=1.0)[:2]
    assert routed == 1 and keys(notify) == ["c"]
    entries, more = q.pull(c, 10, now=1.0)
    assert [e.message for e in entries] == [m] and not more
    assert dropped == [] and q.message_count == 0


def test_zero_expiration_on_a_plain_queue_goes_to_an_interested_consumer(
    vhost: VirtualHost, dropped: list[Message]
) -> None:
    """expiration "0" on an argument-less queue (upgraded to featured storage) is delivered too."""
    q = vhost.declare_queue("q", owner=ME)
    c = consumer("c")
    attach(q, c)
    m = message(expiration="0")
    assert keys(vhost.publish("", m, now=1.0)[1]) == ["c"]
    assert isinstance(q, FeaturedQueue)
    assert [e.message for e in q.pull(c, 10, now=1.0)[0]] == [m]
    assert dropped == []


def test_zero_ttl_message_waits_for_a_consumer_already_notified(vhost: VirtualHost, dropped: list[Message]) -> None:
    """A consumer already Notified (its pull on the way) takes it: nobody else needs waking."""
    q = _zero_queue(vhost)
    c = consumer("c")
    attach(q, c)
    first, second = message(), message()
    assert keys(vhost.publish("", first, now=1.0)[1]) == ["c"]
    assert vhost.publish("", second, now=1.0)[1] == []
    assert [e.message for e in q.pull(c, 10, now=1.001)[0]] == [first, second]
    assert dropped == []


def test_zero_ttl_batch_pull_takes_every_pending_message_once(vhost: VirtualHost, dropped: list[Message]) -> None:
    """Pulls of one at a time while the round lasts deliver each pending message exactly once."""
    q = _zero_queue(vhost)
    c = consumer("c")
    attach(q, c)
    sent = [message() for _ in range(3)]
    for m in sent:
        vhost.publish("", m, now=1.0)
    got: list[Message] = []
    for expect_more in (True, True, False):
        entries, more = q.pull(c, 1, now=1.0)
        got += [e.message for e in entries]
        assert more is expect_more
    assert got == sent and dropped == [] and q.message_count == 0
    assert q.pull(c, 1, now=1.0) == ([], False)


def test_zero_ttl_message_goes_to_the_consumer_work_is_handed_to(vhost: VirtualHost, dropped: list[Message]) -> None:
    """The notified consumer loses interest before pulling: another consumer that was interested
    when the message arrived is notified instead and gets it."""
    q = _zero_queue(vhost)
    c, d = consumer("c"), consumer("d")
    attach(q, c, d)
    m = message()
    assert keys(vhost.publish("", m, now=1.0)[1]) == ["c"]
    assert keys(q.set_notify_work_desired(c, False)) == ["d"]
    assert [e.message for e in q.pull(d, 10, now=1.0)[0]] == [m]
    assert dropped == []


def test_entries_behind_a_pending_zero_ttl_message_stay_available(vhost: VirtualHost) -> None:
    """basic.get steps over the pending message and takes the one behind it; the consumer still
    gets the pending one."""
    q = vhost.declare_queue("q", owner=ME)
    c = consumer("c")
    attach(q, c)
    pending, normal = message(expiration="0"), message()
    vhost.publish("", pending, now=1.0)
    vhost.publish("", normal, now=1.0)
    got = q.get(now=1.0)
    assert got is not None and got.message is normal
    assert [e.message for e in q.pull(c, 10, now=1.0)[0]] == [pending]


def test_delivered_zero_ttl_message_that_is_requeued_expires(
    vhost: VirtualHost, dlq: Queue, dropped: list[Message]
) -> None:
    """Requeued, it keeps its expiry (RabbitMQ): it is expired at once, dead-lettered ``expired``."""
    q = _zero_queue(vhost, **DLX_ARGS)
    c = consumer("c")
    attach(q, c)
    m = message()
    vhost.publish("", m, now=1.0)
    (entry,) = q.pull(c, 10, now=1.0)[0]
    assert entry.state is ACQUIRED
    q.release(entry, now=1.5)
    assert q.message_count == 0 and _dead(vhost, dlq) == [(m, "expired")]


# ------------------------------------------------------------------- expired at once


def test_zero_ttl_message_without_a_consumer_is_dead_lettered_expired(vhost: VirtualHost, dlq: Queue) -> None:
    """Nobody can take it: expired on arrival, dead-lettered with reason expired."""
    q = _zero_queue(vhost, **DLX_ARGS)
    m = message()
    assert vhost.publish("", m, now=1.0)[:2] == (1, [])
    assert q.message_count == 0 and _dead(vhost, dlq) == [(m, "expired")]
    assert vhost.next_deadline() is None


def test_consumer_without_credit_does_not_count(vhost: VirtualHost, dlq: Queue) -> None:
    """A consumer whose prefetch is full (not interested) cannot take it: it expires at once and
    the consumer does not get it when its credit comes back."""
    q = _zero_queue(vhost, **DLX_ARGS)
    c = consumer("c")
    attach(q, c, interested=False)
    m = message()
    assert vhost.publish("", m, now=1.0)[:2] == (1, [])
    assert _dead(vhost, dlq) == [(m, "expired")]
    assert q.set_notify_work_desired(c, True) == []
    assert q.pull(c, 10, now=1.0) == ([], False)


def test_browser_alone_does_not_count(vhost: VirtualHost, dropped: list[Message]) -> None:
    """Only an acquiring consumer can take a message at once; a browser does not keep it."""
    q = _zero_queue(vhost)
    b = consumer("b", acquiring=False)
    attach(q, b)
    m = message()
    vhost.publish("", m, now=1.0)
    assert dropped == [m] and q.message_count == 0


def test_basic_get_never_sees_a_zero_ttl_message(vhost: VirtualHost, dropped: list[Message]) -> None:
    """basic.get gets nothing, neither while a consumer's pull is pending nor without consumers."""
    q = _zero_queue(vhost)
    vhost.publish("", message(), now=1.0)
    assert q.get(now=1.0) is None
    c = consumer("c")
    attach(q, c)
    m = message()
    vhost.publish("", m, now=2.0)
    assert q.get(now=2.0) is None
    assert [e.message for e in q.pull(c, 10, now=2.0)[0]] == [m]


def test_consumer_interested_later_does_not_get_a_pending_message(vhost: VirtualHost, dlq: Queue) -> None:
    """A consumer that became interested after the message arrived steps over it; when its pull
    ends the round with nobody else notified, the message expires (dead-lettered)."""
    q = _zero_queue(vhost, **DLX_ARGS)
    c, late = consumer("c"), consumer("late")
    attach(q, c)
    m = message()
    vhost.publish("", m, now=1.0)
    attach(q, late)
    assert q.pull(late, 10, now=1.0)[0] == []
    assert keys(q.set_notify_work_desired(c, False)) == ["late"]  # c's work is handed over
    assert _dead(vhost, dlq) == []
    assert q.pull(late, 10, now=1.0)[0] == []  # nobody is Notified any more: the round is over
    assert _dead(vhost, dlq) == [(m, "expired")] and q.message_count == 0
    q.set_notify_work_desired(c, True)
    assert q.pull(c, 10, now=1.0)[0] == [] and q.pull(late, 10, now=1.0)[0] == []


def test_later_consumer_gets_what_arrives_after_it(vhost: VirtualHost, dropped: list[Message]) -> None:
    """Late only for what was pending before it: a message arriving after is its to take."""
    q = _zero_queue(vhost)
    c, late = consumer("c"), consumer("late")
    attach(q, c)
    before = message()
    vhost.publish("", before, now=1.0)
    attach(q, late)
    after = message()
    vhost.publish("", after, now=1.0)
    assert [e.message for e in q.pull(late, 10, now=1.0)[0]] == [after]
    assert [e.message for e in q.pull(c, 10, now=1.0)[0]] == [before]
    assert dropped == []


def test_pending_message_expires_when_notified_consumer_loses_interest(vhost: VirtualHost, dlq: Queue) -> None:
    """Its credit runs out before it pulls and nobody else wants work: the message expires."""
    q = _zero_queue(vhost, **DLX_ARGS)
    c = consumer("c")
    attach(q, c)
    m = message()
    vhost.publish("", m, now=1.0)
    assert c.state is NOTIFIED
    assert q.set_notify_work_desired(c, False) == []
    assert _dead(vhost, dlq) == [(m, "expired")] and q.message_count == 0


def test_pending_message_expires_when_credit_runs_out_mid_round(vhost: VirtualHost, dlq: Queue) -> None:
    """Its credit covered only the first message: the second expires when it loses interest."""
    q = _zero_queue(vhost, **DLX_ARGS)
    c = consumer("c")
    attach(q, c)
    first, second = message(), message()
    vhost.publish("", first, now=1.0)
    vhost.publish("", second, now=1.0)
    assert [e.message for e in q.pull(c, 1, now=1.0)[0]] == [first]
    q.set_notify_work_desired(c, False)
    assert _dead(vhost, dlq) == [(second, "expired")] and q.message_count == 0


def test_pending_message_expires_when_notified_consumer_goes(vhost: VirtualHost, dlq: Queue) -> None:
    """basic.cancel (or its channel closing) before the pull: the message expires."""
    q = _zero_queue(vhost, **DLX_ARGS)
    c = consumer("c")
    attach(q, c)
    m = message()
    vhost.publish("", m, now=1.0)
    vhost.remove_consumer(q, c)
    assert _dead(vhost, dlq) == [(m, "expired")]


def test_pending_message_expires_after_the_grace_bound(vhost: VirtualHost, dropped: list[Message]) -> None:
    """A round that never ends (no pull, no answer) is cut at ZERO_TTL_GRACE by the timer."""
    q = _zero_queue(vhost)
    c = consumer("c")
    attach(q, c)
    m = message()
    vhost.publish("", m, now=1.0)
    assert vhost.next_deadline() == 1.0 + ZERO_TTL_GRACE
    vhost.tick(1.0 + ZERO_TTL_GRACE / 2)
    assert dropped == []
    vhost.tick(1.0 + ZERO_TTL_GRACE)
    assert dropped == [m] and q.pull(c, 10, now=3.0) == ([], False)


def test_grouped_zero_ttl_message_of_an_uninterested_owner_expires(vhost: VirtualHost, dropped: list[Message]) -> None:
    """Message groups: the message's group belongs to a consumer without credit, so no one can
    take it at once, though another consumer is interested."""
    q = _zero_queue(vhost, **{"qpid.group_header_key": "g"})
    owner, other = consumer("owner"), consumer("other")
    attach(q, owner, other)
    vhost.publish("", message(headers={"g": "a"}, expiration="60000"), now=1.0)
    q.set_notify_work_desired(other, False)
    (held,) = q.pull(owner, 10, now=1.0)[0]  # "owner" now owns group a
    q.set_notify_work_desired(owner, False)
    q.set_notify_work_desired(other, True)
    m = message(headers={"g": "a"})
    vhost.publish("", m, now=1.0)
    assert dropped == [m]
    q.settle(held)


def test_queue_without_zero_ttl_keeps_no_pending_state(vhost: VirtualHost) -> None:
    """Other TTLs never become pending, and a plain queue without expirations stays plain."""
    plain = vhost.declare_queue("plain", owner=ME)
    vhost.publish("", message("plain"), now=1.0)
    assert plain.plain
    q = vhost.declare_queue("q", owner=ME, arguments={"x-message-ttl": 1000})
    assert isinstance(q, FeaturedQueue)
    attach(q, consumer("c"))
    vhost.publish("", message(), now=1.0)
    assert q._zero.pending == {} and vhost.next_deadline() == 2.0


@pytest.mark.parametrize("seed", range(40))
def test_zero_ttl_messages_are_never_lost_duplicated_or_late(seed: int) -> None:
    """Random publishes (TTL 0 or none), pulls, gets, interest changes, requeues, cancels and
    timer ticks: every message is freed exactly once, delivered at most once, a TTL-0 message
    only to a consumer that wanted work, unchanged, since before it arrived, and never to get."""
    rng = random.Random(seed)
    freed: list[Message] = []
    vhost = VirtualHost("/", on_drop=freed.append)
    arguments: dict[str, Any] = rng.choice(
        [{}, {"x-message-ttl": 0}, {"x-max-priority": 3}, {"qpid.group_header_key": "g"}]
    )
    q = vhost.declare_queue("q", owner=ME, arguments=arguments)
    consumers = [consumer(f"c{i}", priority=rng.choice([0, 0, 1])) for i in range(3)]
    attached: dict[Any, bool] = {}
    interested_since: dict[Any, int] = {}
    zero_at: dict[int, tuple[int, bool]] = {}  # message id → (step published, someone wanted work)
    delivered: set[int] = set()
    held: list[Any] = []
    now = 0.0
    published: list[Message] = []
    for step in range(300):
        now += rng.choice([0.0, 0.0, 0.001, 0.3])
        vhost.advance(now)
        action = rng.random()
        c = rng.choice(consumers)
        if action < 0.3:
            zero = rng.random() < 0.7
            m = message(
                headers={"g": rng.choice("ab")}, priority=rng.randint(0, 3),
                expiration="0" if zero else None,
            )
            published.append(m)
            if zero:
                wanted = any(x.state in (INTERESTED, NOTIFIED) for x in consumers if attached.get(x))
                zero_at[m.id] = (step, wanted)
            vhost.publish("", m, now=now)
        elif action < 0.5 and attached.get(c):
            entries, _ = q.pull(c, rng.randint(1, 3), now=now)
            for e in entries:
                assert e.message.id not in delivered, "delivered twice"
                delivered.add(e.message.id)
                if e.message.id in zero_at:
                    at, wanted = zero_at[e.message.id]
                    assert wanted and interested_since[c] < at, "a TTL-0 message went to a late consumer"
                held.append(e)
        elif action < 0.55:
            entry = q.get(now=now)
            if entry is not None:
                assert entry.message.id not in zero_at, "basic.get saw a TTL-0 message"
                assert entry.message.id not in delivered
                delivered.add(entry.message.id)
                held.append(entry)
        elif action < 0.7 and attached.get(c):
            desired = rng.random() < 0.5
            if desired and c.state not in (INTERESTED, NOTIFIED):
                interested_since[c] = step
            q.set_notify_work_desired(c, desired)
        elif action < 0.75:
            if attached.get(c):
                vhost.remove_consumer(q, c)
                attached[c] = False
            elif c.state is REMOVED:
                q.add_consumer(c)
                attached[c] = True
        elif action < 0.9 and held:
            entry = held.pop(rng.randrange(len(held)))
            if rng.random() < 0.3:
                delivered.discard(entry.message.id)  # requeued: it may be delivered again
                q.release(entry, now=now)
            else:
                q.settle(entry)
        else:
            deadline = vhost.next_deadline()
            if deadline is not None and rng.random() < 0.5:
                now = max(now, deadline)
            vhost.tick(now)
    for entry in held:
        q.settle(entry)
    q.delete()
    assert sorted(m.id for m in freed) == sorted(m.id for m in published), "a message lost or freed twice"
