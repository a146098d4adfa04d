"""Queue entries: subscriptions as pointers, reject/release, Basic.Get (seed 001), purge and delete."""

from __future__ import annotations

import pytest

from broker.messages.message import Message
from broker.queues.consumer_manager import INTERESTED, NON_ACQUIRING
from broker.queues.entry_state import ACQUIRED, AVAILABLE, DELETED
from broker.queues.queue import Queue
from tests.broker.support import attach, consumer, fill, keys, message


def _positions(q: Queue) -> list[int]:
    return [e.position for e in q.available_entries()]


def test_release_returns_message_to_original_position() -> None:
    """A returned message must be made available again at its place in the queue."""
    q = Queue("q")
    fill(q, 5)
    first, second, third = q.get(), q.get(), q.get()
    assert first and second and third
    q.release(second)
    assert _positions(q) == [2, 4, 5]
    q.release(first)
    assert _positions(q) == [1, 2, 4, 5]
    assert first.state is AVAILABLE and first.redelivered and second.redelivered
    assert not third.redelivered


def test_acquiring_consumers_see_released_message_next() -> None:
    """The next entry that the subscriber sees is the returned message."""
    q = Queue("q")
    messages = fill(q, 4)
    c = consumer("c")
    attach(q, c)
    taken, _ = q.pull(c, 2)
    q.release(taken[0])
    again, _ = q.pull(c, 2)
    assert [e.message for e in again] == [messages[0], messages[2]]
    assert again[0].redelivered and not again[1].redelivered


def test_released_messages_come_back_in_position_order() -> None:
    """Several returned messages are seen in their original order, whatever the release order."""
    q = Queue("q")
    messages = fill(q, 4)
    entries = [q.get() for _ in range(3)]
    for entry in reversed(entries):
        assert entry is not None
        q.release(entry)
    assert [q.get().message for _ in range(4)] == messages  # type: ignore[union-attr]


def test_release_notifies_one_interested_acquiring_consumer() -> None:
    """A previously unavailable message becomes available: one interested Consumer is notified."""
    q = Queue("q")
    a, b = consumer("a"), consumer("b")
    attach(q, a, b)
    q.enqueue(message())
    taken, _ = q.pull(a, 10)
    assert a.state is INTERESTED
    assert keys(q.consumers.interested()) == ["b", "a"]
    assert keys(q.release(taken[0])) == ["b"]


def test_browsers_do_not_rewind_on_release() -> None:
    """We do not reset the pointer for browsing consumers: browsed messages are not redelivered to them."""
    q = Queue("q")
    fill(q, 3)
    browser = consumer("browser", acquiring=False)
    attach(q, browser)
    seen, _ = q.pull(browser, 10)
    assert [e.position for e in seen] == [1, 2, 3]
    assert all(e.state is AVAILABLE for e in seen)  # browsing does not acquire
    entry = q.get()
    assert entry is not None
    assert q.release(entry) == []  # the browser has passed it: not woken
    assert q.pull(browser, 10) == ([], False)
    q.enqueue(message())
    later, _ = q.pull(browser, 10)
    assert [e.position for e in later] == [4]


def test_browsers_see_entries_acquired_but_not_yet_settled() -> None:
    """A browser sees the queue's contents: a message an acquiring consumer took
    first is still shown to it until it is settled, never a settled one."""
    from broker.queues.featured.featured_queue import (
        FeaturedQueue,  # the same rule for queues with arguments
    )

    for q in (Queue("q"), FeaturedQueue("fq", arguments={"x-max-priority": 5})):
        fill(q, 3)
        taken = q.get()
        settled = q.get()
        assert taken is not None and settled is not None
        q.settle(settled)
        browser = consumer("browser", acquiring=False)
        attach(q, browser)
        seen, _ = q.pull(browser, 10)
        assert [e.position for e in seen] == [1, 3], type(q).__name__
        assert taken.state is ACQUIRED


def test_browser_behind_a_released_message_still_sees_it() -> None:
    """A browser whose pointer has not reached the returned message's place sees it when it gets there."""
    q = Queue("q")
    fill(q, 3)
    first = q.get()
    assert first is not None
    browser = consumer("browser", acquiring=False)
    attach(q, browser)
    assert browser.state is NON_ACQUIRING
    assert keys(q.release(first)) == ["browser"]
    seen, _ = q.pull(browser, 10)
    assert [e.position for e in seen] == [1, 2, 3]


def test_basic_get_is_one_message_subscription() -> None:
    """Basic.Get is a temporary subscription that can only ever receive one message."""
    q = Queue("q")
    messages = fill(q, 2)
    entry = q.get()
    assert entry is not None and entry.message is messages[0]
    assert entry.state is ACQUIRED
    assert q.message_count == 1 and q.acquired_count == 1
    assert q.consumer_count == 0 and not q.has_ever_had_consumers
    q.release(entry)
    assert q.get() is entry  # back at its place, seen first by the next subscription
    assert q.get() is not None
    assert q.get() is None


def test_settle_drops_message_when_last_queue_lets_go() -> None:
    """Ack settles an entry; the body is dropped only when no queue entry references it."""
    dropped: list[Message] = []
    q1, q2 = Queue("q1", on_drop=dropped.append), Queue("q2", on_drop=dropped.append)
    m = message()
    q1.enqueue(m)
    q2.enqueue(m)
    assert m.refs == 2
    e1, e2 = q1.get(), q2.get()
    assert e1 and e2
    q1.settle(e1)
    assert dropped == [] and e1.state is DELETED
    q2.settle(e2)
    assert dropped == [m] and m.refs == 0
    q2.settle(e2)  # a second ack of the same entry is harmless
    assert dropped == [m] and m.refs == 0


def test_entry_ids_are_global_and_positions_per_queue() -> None:
    """Entry ids (the runtime's handles) are unique across queues once entries are handed out,
    acquired or browsed; positions increase monotonically within one queue."""
    q1, q2 = Queue("q1"), Queue("q2")
    fill(q1, 3)
    fill(q2, 3)
    e1, e2 = q1.available_entries(), q2.available_entries()
    assert [e.position for e in e1] == [1, 2, 3] == [e.position for e in e2]
    browser = consumer("b", acquiring=False)
    attach(q1, browser)
    taker = consumer("t")
    attach(q2, taker)
    seen, _ = q1.pull(browser, 3)
    taken, _ = q2.pull(taker, 3)
    assert seen == e1 and taken == e2
    assert len({e.id for e in seen + taken}) == 6 and all(e.id > 0 for e in seen + taken)
    second = consumer("t2")
    attach(q1, second)
    again, _ = q1.pull(second, 3)
    assert [e.id for e in again] == [e.id for e in seen], "an entry keeps its id once drawn"


def test_a_queued_entry_of_a_plain_queue_holds_no_id_of_its_own() -> None:
    """S8: a plain queue's never-delivered entries share the id 0 (no int per entry)."""
    q = Queue("q")
    fill(q, 3)
    assert [e.id for e in q.available_entries()] == [0, 0, 0]


def test_purge_removes_available_entries_only() -> None:
    """queue.purge drops ready messages; acquired ones stay until they are settled."""
    dropped: list[Message] = []
    q = Queue("q", on_drop=dropped.append)
    messages = fill(q, 4)
    held = q.get()
    assert held is not None
    assert q.purge() == 3
    assert q.message_count == 0 and q.acquired_count == 1
    assert dropped == messages[1:]
    q.settle(held)
    assert dropped == messages[1:] + messages[:1]


def test_purge_then_release_makes_the_held_message_available() -> None:
    """A message acquired before a purge can still be requeued to the purged queue."""
    q = Queue("q")
    fill(q, 2)
    held = q.get()
    assert held is not None
    q.purge()
    q.release(held)
    assert q.message_count == 1
    q.enqueue(message())
    assert _positions(q) == [1, 3]


def test_delete_drops_ready_entries_and_delivered_ones_when_given_back() -> None:
    """queue.delete drops the ready entries at once; an acquired one keeps its message (a
    worker may still be reading its body) until it is released or settled, which drops it
    once, without requeueing; a second settle does nothing."""
    dropped: list[Message] = []
    q = Queue("q", on_drop=dropped.append)
    messages = fill(q, 3)
    held = q.get()
    assert held is not None
    a = consumer("a")
    attach(q, a)
    assert q.delete() == [a]
    assert sorted(m.id for m in dropped) == sorted(m.id for m in messages[1:])
    assert q.release(held) == [] and held.state is DELETED
    assert sorted(m.id for m in dropped) == sorted(m.id for m in messages)
    q.settle(held)
    assert len(dropped) == 3 and q.message_count == 0 and q.acquired_count == 0
    assert q.consumer_count == 0 and a.state.name == "REMOVED"


@pytest.mark.parametrize("give_back", ["settle", "release", "discard"])
def test_a_deleted_queues_delivered_entry_is_dropped_once_when_given_back(give_back: str) -> None:
    dropped: list[Message] = []
    q = Queue("q", on_drop=dropped.append)
    (message,) = fill(q, 1)
    held = q.get()
    assert held is not None
    q.delete()
    assert dropped == []
    assert getattr(q, give_back)(held) == []
    assert dropped == [message] and held.state is DELETED and q.acquired_count == 0
    q.settle(held)
    q.release(held)
    assert dropped == [message]


def test_browsing_does_not_take_messages_from_acquiring_consumers() -> None:
    """Non-acquiring consumers see messages without acquiring them."""
    q = Queue("q")
    messages = fill(q, 2)
    browser, worker = consumer("browser", acquiring=False), consumer("worker")
    attach(q, browser, worker)
    seen, more = q.pull(browser, 1)
    assert [e.message for e in seen] == messages[:1] and more is True
    taken, _ = q.pull(worker, 10)
    assert [e.message for e in taken] == messages


def test_large_queue_drains_in_order_with_interleaved_releases() -> None:
    """Entries come out in position order across log compaction and releases to the front."""
    q = Queue("q")
    fill(q, 20_000)
    c = consumer("c")
    attach(q, c)
    delivered: list[int] = []
    while q.message_count:
        batch, _ = q.pull(c, 7)
        # The last entry of each batch goes back and must be the first of the next batch.
        kept = batch[:-1] if len(batch) > 1 else batch
        for entry in kept:
            delivered.append(entry.position)
            q.settle(entry)
        if len(batch) > 1:
            q.release(batch[-1])
    assert delivered == list(range(1, 20_001))
    assert q.acquired_count == 0
