"""Consumer-queue interactions: each test is one rule of seed 002 (Qpid "Consumer-Queue Interactions")."""

from __future__ import annotations

import pytest

from broker.errors import AccessRefused
from broker.queues.consumer_manager import INTERESTED, NOT_INTERESTED, NOTIFIED
from broker.queues.queue import Queue
from tests.broker.support import attach, consumer, fill, keys, message


def test_new_consumer_starts_not_interested() -> None:
    """A consumer is NotInterested until it tells the queue it is interested in doing work."""
    q = Queue("q")
    c = consumer("c")
    q.add_consumer(c)
    assert c.state is NOT_INTERESTED
    assert keys(q.consumers.not_interested()) == ["c"]
    assert q.enqueue(message()) == []


def test_new_message_notifies_exactly_one_interested_acquiring_consumer() -> None:
    """It will only notify a single interested Consumer to avoid spurious wake-ups."""
    q = Queue("q")
    a, b, c = consumer("a"), consumer("b"), consumer("c")
    attach(q, a, b, c)
    assert keys(q.enqueue(message())) == ["a"]
    assert a.state is NOTIFIED
    assert b.state is INTERESTED and c.state is INTERESTED
    assert keys(q.consumers.interested()) == ["b", "c"]


def test_each_new_message_notifies_the_next_interested_consumer() -> None:
    """The Queue will notify Consumers from the Interested list and move them to the Notified list."""
    q = Queue("q")
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    assert keys(q.enqueue(message())) == ["a"]
    assert keys(q.enqueue(message())) == ["b"]
    assert keys(q.consumers.notified()) == ["a", "b"]
    assert q.enqueue(message()) == []  # both already notified: no one is woken twice


def test_new_message_notifies_highest_priority_interested_consumer_first() -> None:
    """When deciding which Consumer to notify the QCM should take consumer priorities into account."""
    q = Queue("q")
    low, high = consumer("low", 0), consumer("high", 5)
    attach(q, low, high)
    assert keys(q.enqueue(message())) == ["high"]
    assert high.state is NOTIFIED and low.state is INTERESTED


def test_non_acquiring_consumers_are_always_notified() -> None:
    """Non-acquiring consumers (browsers) should always be notified about new messages."""
    q = Queue("q")
    browser1, browser2 = consumer("b1", acquiring=False), consumer("b2", acquiring=False)
    worker = consumer("w")
    attach(q, browser1, browser2, worker)
    assert keys(q.enqueue(message())) == ["b1", "b2", "w"]
    # The acquiring consumer is already Notified; the browsers are told again regardless.
    assert keys(q.enqueue(message())) == ["b1", "b2"]


def test_no_spurious_wakeup_when_no_consumer_interested() -> None:
    """NotInterested exists to avoid spurious wake-ups of Consumers we know will not do any work."""
    q = Queue("q")
    a, b = consumer("a"), consumer("browser", acquiring=False)
    attach(q, a, b, interested=False)
    assert q.enqueue(message()) == []
    assert a.state is NOT_INTERESTED and b.state is NOT_INTERESTED


def test_consumer_becoming_interested_with_messages_available_is_notified() -> None:
    """notifyWork is called when a Consumer becomes Interested (and there is work)."""
    q = Queue("q")
    fill(q, 2)
    c = consumer("c")
    q.add_consumer(c)
    assert keys(q.set_notify_work_desired(c, True)) == ["c"]
    assert c.state is NOTIFIED


def test_consumer_becoming_interested_on_empty_queue_is_not_notified() -> None:
    """A Consumer becoming Interested with no work available is not woken (no spurious wake-up)."""
    q = Queue("q")
    c = consumer("c")
    q.add_consumer(c)
    assert q.set_notify_work_desired(c, True) == []
    assert c.state is INTERESTED


def test_notified_consumer_keeps_pulling_while_pulls_succeed() -> None:
    """The Consumer remains Notified and continues to call deliverSingleMessage while it delivers."""
    q = Queue("q")
    messages = fill(q, 5)
    c = consumer("c")
    attach(q, c)
    first, more = q.pull(c, 2)
    assert [e.message for e in first] == messages[:2] and more is True
    assert c.state is NOTIFIED
    second, more = q.pull(c, 2)
    assert [e.message for e in second] == messages[2:4] and more is True
    assert c.state is NOTIFIED
    last, more = q.pull(c, 2)
    assert [e.message for e in last] == messages[4:] and more is False
    assert c.state is INTERESTED


def test_first_empty_pull_moves_consumer_to_back_of_interested() -> None:
    """When deliverSingleMessage cannot deliver, the Consumer goes to the back of Interested."""
    q = Queue("q")
    a, b, c = consumer("a"), consumer("b"), consumer("c")
    attach(q, a, b, c)
    assert keys(q.enqueue(message())) == ["a"]
    assert keys(q.enqueue(message())) == ["b"]
    # b takes both messages; a, notified for one of them, finds nothing.
    entries, _ = q.pull(b, 10)
    assert len(entries) == 2
    assert keys(q.consumers.interested()) == ["c", "b"]
    assert q.pull(a, 10) == ([], False)
    assert a.state is INTERESTED
    # Asymptotic fairness: the consumer that found nothing is now last in line.
    assert keys(q.consumers.interested()) == ["c", "b", "a"]
    assert keys(q.enqueue(message())) == ["c"]


def test_pull_that_drains_the_queue_ends_the_notification() -> None:
    """A pull that empties the queue moves the Consumer back to Interested (no extra empty pull)."""
    q = Queue("q")
    fill(q, 2)
    c = consumer("c")
    attach(q, c)
    entries, more = q.pull(c, 2)
    assert len(entries) == 2 and more is False
    assert c.state is INTERESTED
    assert keys(q.enqueue(message())) == ["c"]


def test_pull_by_not_interested_consumer_returns_nothing() -> None:
    """A NotInterested Consumer is not going to do any work: a pull gives it nothing and keeps it there."""
    q = Queue("q")
    fill(q, 3)
    c = consumer("c")
    q.add_consumer(c)
    assert q.pull(c, 10) == ([], False)
    assert c.state is NOT_INTERESTED
    assert q.message_count == 3


def test_notified_consumer_turning_uninterested_hands_work_to_another() -> None:
    """A notified consumer did not do the work we expected it to do: we notify someone else."""
    q = Queue("q")
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    assert keys(q.enqueue(message())) == ["a"]
    assert keys(q.set_notify_work_desired(a, False)) == ["b"]
    assert a.state is NOT_INTERESTED and b.state is NOTIFIED
    entries, _ = q.pull(b, 10)
    assert len(entries) == 1


def test_uninterested_consumer_hands_over_nothing_when_queue_is_empty() -> None:
    """No work left means nobody is woken when a Notified Consumer turns uninterested."""
    q = Queue("q")
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    q.enqueue(message())
    q.get()
    assert q.set_notify_work_desired(a, False) == []
    assert b.state is INTERESTED


def test_high_priority_consumer_turning_uninterested_lets_lower_priority_consume() -> None:
    """A high priority consumer becomes uninterested and thus allows a low priority consumer to consume."""
    q = Queue("q")
    low, high = consumer("low", 0), consumer("high", 10)
    attach(q, low, high)
    assert keys(q.enqueue(message())) == ["high"]
    assert keys(q.set_notify_work_desired(high, False)) == ["low"]
    entries, _ = q.pull(low, 10)
    assert len(entries) == 1


def test_lower_priority_consumer_gets_nothing_while_higher_priority_interested() -> None:
    """Lookup of consumers with higher priority decides: a higher-priority interested consumer takes the message."""
    q = Queue("q")
    low, high = consumer("low", 0), consumer("high", 10)
    attach(q, low, high)
    q.enqueue(message())
    assert q.pull(low, 10) == ([], False)
    assert q.message_count == 1
    high_entries, _ = q.pull(high, 10)
    assert len(high_entries) == 1


def test_lower_priority_consumer_is_not_notified_when_becoming_interested_below_an_active_one() -> None:
    """Becoming Interested below a higher-priority interested consumer brings no notification."""
    q = Queue("q")
    high = consumer("high", 10)
    attach(q, high)
    fill(q, 3)
    low = consumer("low", 0)
    q.add_consumer(low)
    assert q.set_notify_work_desired(low, True) == []
    assert low.state is INTERESTED


def test_notified_consumer_closing_hands_work_to_another() -> None:
    """A consumer closing while notified must not strand the message: another consumer is notified."""
    q = Queue("q")
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    q.enqueue(message())
    assert keys(q.remove_consumer(a)) == ["b"]
    assert b.state is NOTIFIED


def test_closing_consumer_does_not_wake_anyone_when_another_is_already_notified() -> None:
    """If a Consumer at the top priority is already Notified it will pull the work: no extra wake-up."""
    q = Queue("q")
    a, b, c = consumer("a"), consumer("b"), consumer("c")
    attach(q, a, b, c)
    q.enqueue(message())  # a notified
    assert q.remove_consumer(b) == []
    assert c.state is INTERESTED


def test_exclusive_consumer_refuses_other_consumers() -> None:
    """RabbitMQ: a queue with an exclusive consumer refuses others with 403 "in exclusive use"."""
    q = Queue("jobs")
    q.add_consumer(consumer("solo", exclusive=True))
    with pytest.raises(AccessRefused) as err:
        q.add_consumer(consumer("other"))
    assert err.value.reply_code == 403 and not err.value.hard
    assert err.value.reply_text == "queue 'jobs' in vhost '/' in exclusive use"


def test_exclusive_consumer_refused_when_queue_already_consumed() -> None:
    """RabbitMQ: an exclusive basic.consume on a queue that has consumers gets 403."""
    q = Queue("jobs")
    q.add_consumer(consumer("first"))
    with pytest.raises(AccessRefused, match="in exclusive use"):
        q.add_consumer(consumer("solo", exclusive=True))
    assert q.consumer_count == 1


def test_exclusive_consumer_leaving_frees_the_queue() -> None:
    """Once the exclusive consumer is cancelled, other consumers may attach."""
    q = Queue("jobs")
    solo = consumer("solo", exclusive=True)
    q.add_consumer(solo)
    q.remove_consumer(solo)
    q.add_consumer(consumer("next"))
    assert q.consumer_count == 1
