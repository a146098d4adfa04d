"""The QueueConsumerManager's lists (seed 002): one list per state, O(1) moves, nothing left behind."""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

import pytest

from broker.queues.consumer_manager import (
    INTERESTED,
    NON_ACQUIRING,
    NOT_INTERESTED,
    NOTIFIED,
    REMOVED,
    Bucket,
    QueueConsumer,
    QueueConsumerManager,
)
from broker.queues.queue import Queue
from broker.queues.queue_entry import QueueEntry
from tests.broker.support import attach, consumer, message


class _CountingBucket(OrderedDict[Any, None]):
    """A list of the seed that counts how often it is walked."""

    walks = 0

    def __iter__(self) -> Any:
        _CountingBucket.walks += 1
        return super().__iter__()


class _CountingManager(QueueConsumerManager):
    def _new_bucket(self) -> Bucket[QueueConsumer, None]:
        return _CountingBucket()


def _expected_lists(c: QueueConsumer) -> list[str]:
    if c.state is NOT_INTERESTED:
        return ["NotInterested"]
    if c.state is NON_ACQUIRING:
        return ["NonAcquiring"]
    if c.state is INTERESTED:
        return [f"Interested[{c.priority}]"]
    if c.state is NOTIFIED:
        return [f"Notified[{c.priority}]"]
    return []


def test_consumer_close_leaves_no_references() -> None:
    """A consumer is removed from every list when it closes; nothing keeps a reference to it."""
    q = Queue("q")
    notified, interested, idle = consumer("n", 3), consumer("i", 3), consumer("idle", 7)
    browser = consumer("b", acquiring=False)
    attach(q, notified, interested, browser)
    attach(q, idle, interested=False)
    q.enqueue(message())
    q.pull(browser, 10)
    assert notified.state is NOTIFIED and browser.browse_position == 1
    for c in (notified, interested, idle, browser):
        q.remove_consumer(c)
        assert c.state is REMOVED
        assert q.consumers.lists_holding(c) == []
        assert c not in q.consumers
    assert q.consumers.all() == [] and q.consumers.priorities() == []
    assert browser.browse_position == 0  # seed 001: the pointer is nulled out on removal
    assert q.remove_consumer(notified) == []  # removing twice is harmless


def test_consumer_is_in_exactly_one_state_list() -> None:
    """Each consumer is in All and in exactly the one list matching its state."""
    q = Queue("q")
    cs = [consumer("a", 1), consumer("b", 1), consumer("c", 0), consumer("d", acquiring=False)]
    attach(q, *cs)
    q.enqueue(message())
    q.set_notify_work_desired(cs[1], False)
    for c in cs:
        assert q.consumers.lists_holding(c) == _expected_lists(c)
    assert q.consumers.all() == cs


def test_list_moves_are_constant_time() -> None:
    """A move touches only the consumer's own node: no list is walked, whatever its length."""

    def walks_for(n: int) -> list[int]:
        q = Queue("q")
        q.consumers = _CountingManager()
        cs = [consumer(f"c{i}") for i in range(n)]
        attach(q, *cs)
        middle = cs[n // 2]
        counts = []
        for step in (
            lambda: q.set_notify_work_desired(middle, False),
            lambda: q.set_notify_work_desired(middle, True),
            lambda: q.remove_consumer(cs[n // 3]),
            lambda: q.enqueue(message()),  # picks the front of Interested
            lambda: q.pull(cs[0], 10),
        ):
            _CountingBucket.walks = 0
            step()
            counts.append(_CountingBucket.walks)
        return counts

    small, large = walks_for(10), walks_for(1_000)
    assert small == large
    assert small[:3] == [0, 0, 0]  # interest changes and removal walk nothing
    assert max(small) <= 1  # notifying takes the front of one list


def test_priority_lists_are_kept_per_priority_highest_first() -> None:
    """A QueueConsumerNodeList is kept per consumer priority, iterated highest priority first."""
    q = Queue("q")
    attach(q, consumer("p1", 1), consumer("p9", 9), consumer("p5", 5), consumer("p5b", 5))
    assert q.consumers.priorities() == [9, 5, 1]
    assert [c.key for c in q.consumers.interested()] == ["p9", "p5", "p5b", "p1"]


def test_consumer_attached_twice_is_refused() -> None:
    """A QueueConsumer belongs to exactly one queue."""
    manager = QueueConsumerManager()
    c = consumer("c")
    manager.add(c)
    with pytest.raises(ValueError):
        manager.add(c)


def test_random_operations_keep_lists_consistent_and_strand_no_work() -> None:
    """Whenever work is available and a consumer wants it, some consumer at the top priority is Notified."""
    rng = random.Random(20240517)
    q = Queue("q")
    pool = [consumer(f"c{i}", rng.choice([0, 0, 5])) for i in range(6)]
    pool.append(consumer("browser", acquiring=False))
    held: list[QueueEntry] = []
    published = settled = 0
    for _ in range(5_000):
        c = rng.choice(pool)
        op = rng.randrange(8)
        if op == 0:
            if c.state is REMOVED:
                q.add_consumer(c)
            else:
                q.remove_consumer(c)
        elif op == 1 and c.state is not REMOVED:
            q.set_notify_work_desired(c, rng.random() < 0.7)
        elif op in (2, 3):
            q.enqueue(message())
            published += 1
        elif op == 4 and c.state is not REMOVED:
            entries, _ = q.pull(c, rng.randint(1, 3))
            if c.acquiring:
                held += entries
        elif op == 5 and held:
            q.release(held.pop(rng.randrange(len(held))))
        elif op == 6 and held:
            q.settle(held.pop(rng.randrange(len(held))))
            settled += 1
        elif op == 7 and rng.random() < 0.1:
            entry = q.get()
            if entry is not None:
                held.append(entry)
        _check_invariants(q, pool)
        assert q.message_count + q.acquired_count + settled == published
        assert q.acquired_count == len(held)


def _check_invariants(q: Queue, pool: list[QueueConsumer]) -> None:
    for c in pool:
        assert q.consumers.lists_holding(c) == _expected_lists(c)
        assert (c in q.consumers) == (c.state is not REMOVED)
    top = q.consumers.top_active_priority()
    if q.message_count and top is not None:
        assert any(c.priority == top for c in q.consumers.notified()), "available work is stranded"
