"""A plain queue's waiting entries as compact as they can be (broker.queues.fifo_entries): the message
alone until handed out, and only its body handle for a plain message nothing else holds -- and
everything a consumer, a browser, a purge or an arena sweep sees is what it was."""

from __future__ import annotations

from broker.messages.body_ref import (
    ARENA_BODY_CODEC,
    handle_words,
    pack_body_ref,
    paged_body_ref,
    words_handle,
)
from broker.messages.message import FullMessage, Message, PageableMessage, PlainMessage
from broker.queues.entry_state import ACQUIRED, PACKED
from broker.queues.fifo_entries import _SWEEP_EVERY, _SWEEP_LAG
from broker.queues.queue import Queue
from broker.queues.queue_entry import QueueEntry
from broker.queues.queue_host import StandaloneHost
from tests.broker.support import attach, consumer

LONG = _SWEEP_LAG + 3 * _SWEEP_EVERY  # long enough that its older part is swept


def _plain(i: int, routing_key: str = "q", exchange: str = "") -> PlainMessage:
    return PlainMessage(exchange, routing_key, pack_body_ref(i % 2, 64 * i, 20, 100 + i % 50),
                        100 + i % 50)


def _queue(dropped: list[Message] | None = None) -> Queue:
    on_drop = dropped.append if dropped is not None else None
    return Queue("q", host=StandaloneHost(body_codec=ARENA_BODY_CODEC), on_drop=on_drop)


def _handles(q: Queue) -> int:
    """Slots holding a handle alone: as two words (PACKED) or an int."""
    return sum(slot is PACKED or type(slot) is int for slot in q._fifo.log)


def _fields(m: Message) -> tuple[object, ...]:
    return (m.exchange, m.routing_key, m.body_ref, m.body_size, m.refs, m.headers, m.stored)


def test_a_long_queue_keeps_its_older_plain_messages_as_handles_and_gives_them_back_whole() -> None:
    q = _queue()
    messages = [_plain(i) for i in range(LONG)]
    expected = [(m.exchange, m.routing_key, m.body_ref, m.body_size, 1, None, None) for m in messages]
    for m in messages:
        q.enqueue(m)
    assert _handles(q) >= LONG - _SWEEP_LAG - _SWEEP_EVERY
    assert q.message_count == LONG
    taken = [q.get() for _ in range(LONG)]
    assert all(e is not None and e.state is ACQUIRED for e in taken)
    assert [e.position for e in taken if e] == list(range(1, LONG + 1))
    assert [_fields(e.message) for e in taken if e] == expected
    assert q.get() is None and q.message_count == 0


def test_what_a_handle_cannot_say_keeps_its_message() -> None:
    """Other routing keys than the usual, a message two queues hold, one with headers, and a
    pageable one not paged yet (the pager may still change its handle) stay objects."""
    q, other = _queue(), _queue()
    kept: dict[int, Message] = {}
    for i in range(LONG):
        m: Message
        if i % 7 == 1:
            m = _plain(i, routing_key="elsewhere")
        elif i % 7 == 2:
            m = _plain(i)
            other.enqueue(m)  # two references
        elif i % 7 == 3:
            m = FullMessage(0, "", "q", pack_body_ref(0, 64 * i, 20, 100), 100, {"h": 1})
        elif i % 7 == 4:
            m = PageableMessage("", "q", pack_body_ref(0, 64 * i, 20, 100), 100)
        else:
            m = _plain(i)
        if i % 7 in (1, 2, 3, 4):
            kept[i + 1] = m
        q.enqueue(m)
    assert _handles(q) > 0
    taken = [q.get() for _ in range(LONG)]
    for entry in taken:
        assert entry is not None
        if entry.position in kept:
            assert entry.message is kept[entry.position]


def test_a_paged_out_pageable_message_only_this_queue_holds_becomes_a_handle() -> None:
    q = _queue()
    paged = paged_body_ref(1, 20, 128, 1, 3, 4096)
    for i in range(LONG):
        m = PageableMessage("", "q", pack_body_ref(0, 64 * i, 20, 100), 100)
        if i == 10:
            m = PageableMessage("", "q", paged, 128)
        q.enqueue(m)
    assert q._fifo.log[10] is PACKED
    entries = [q.get() for _ in range(11)]
    last = entries[-1]
    assert last is not None and last.message.body_ref == paged and last.message.body_size == 128
    assert type(last.message) is PlainMessage and last.message.refs == 1


def test_a_purged_queue_drops_every_message_once_handles_included() -> None:
    dropped: list[Message] = []
    q = _queue(dropped)
    messages = [_plain(i) for i in range(LONG)]
    for m in messages:
        q.enqueue(m)
    first = q.get()
    assert first is not None and _handles(q) > 0
    assert q.purge() == LONG - 1
    assert sorted(m.body_ref for m in dropped) == sorted(m.body_ref for m in messages[1:])
    q.settle(first)
    assert len(dropped) == LONG


def test_an_arena_sweep_sees_every_body_handle_without_making_entries() -> None:
    q = _queue()
    messages = [_plain(i) for i in range(LONG)]
    for m in messages:
        q.enqueue(m)
    taken = q.get()
    assert taken is not None
    before = list(q._fifo.log)
    assert sorted(q.body_refs()) == sorted(m.body_ref for m in messages)
    assert q._fifo.log == before  # nothing was made


def test_browsers_and_released_entries_see_positions_across_handles() -> None:
    q = _queue()
    for i in range(LONG):
        q.enqueue(_plain(i))
    browser = consumer("b", acquiring=False)
    attach(q, browser)
    seen, more = q.pull(browser, 50)
    assert [e.position for e in seen] == list(range(1, 51)) and more
    first, second = q.get(), q.get()
    assert first is seen[0] and second is seen[1]  # the browsed entries, ids and all
    assert first is not None and second is not None
    q.release(second)
    again = q.get()
    assert again is second and again.redelivered
    # Far into the swept part: a browser's pointer moved there finds the right entry.
    browser.browse_position = LONG - _SWEEP_LAG - 100
    (entry,), _ = q.pull(browser, 1)
    assert entry.position == LONG - _SWEEP_LAG - 99 and isinstance(entry, QueueEntry)
    assert entry.message.body_ref == _plain(entry.position - 1).body_ref


def test_a_restored_redelivered_message_keeps_its_flag_in_a_long_queue() -> None:
    q = _queue()
    for i in range(LONG):
        q.restore(_plain(i), redelivered=i % 1000 == 5, now=0.0)
    flags = [e.redelivered for e in (q.get() for _ in range(LONG)) if e is not None]
    assert flags == [i % 1000 == 5 for i in range(LONG)]


def test_without_the_runtime_s_body_size_nothing_becomes_a_handle() -> None:
    q = Queue("q")
    for i in range(LONG):
        q.enqueue(_plain(i))
    assert _handles(q) == 0


def test_a_handle_is_kept_as_two_words_when_it_fits_and_as_itself_when_not() -> None:
    fits = [pack_body_ref(0, 0, 0, 0), pack_body_ref(255, (1 << 36) - 16, (1 << 24) - 1, (1 << 32) - 1),
            paged_body_ref(0, 0, 0, 0, 0, 0), paged_body_ref(255, 1 << 20, 1 << 29, 255, (1 << 23) - 1, (1 << 32) - 1)]
    for ref in fits:
        words = handle_words(ref)
        assert words is not None and all(0 <= w < 1 << 64 for w in words)
        assert words_handle(*words) == ref
    too_big = [paged_body_ref(256, 20, 128, 0, 3, 4096), paged_body_ref(0, 20, 128, 256, 3, 4096),
               paged_body_ref(0, 20, 128, 1, 1 << 23, 4096)]
    assert [handle_words(ref) for ref in too_big] == [None, None, None]


def test_a_handle_that_does_not_fit_two_words_stays_an_int_and_comes_back_whole() -> None:
    q = _queue()
    odd = paged_body_ref(300, 20, 128, 1, 3, 4096)  # region 300: not two words
    for i in range(LONG):
        ref = odd if i == 7 else paged_body_ref(1, 20, 128, 1, 3, 4096 * i)
        q.enqueue(PageableMessage("", "q", ref, 128))
    assert q._fifo.log[7] == odd and q._fifo.log[8] is PACKED
    entries = [q.get() for _ in range(9)]
    assert [e.message.body_ref for e in entries if e] == [
        odd if i == 7 else paged_body_ref(1, 20, 128, 1, 3, 4096 * i) for i in range(9)]
