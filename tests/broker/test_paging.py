"""Paging (broker.storage.paging): persistent bodies leave an arena past its mark, newest first, and
deliveries of them name where they are on disk; restore leaves what is past the mark there."""

from __future__ import annotations

from pathlib import Path

from broker.messages.body_ref import body_log_at, pack_body_ref, paged_body_ref, unpack_paged_ref
from broker.messages.message import FullMessage
from broker.messages.message_journal import MessageJournal
from broker.storage.message_store import IndexLog, load_index, restore
from broker.storage.paging import Pager
from broker.topology.vhost import VirtualHost
from ipc import records as r
from ipc.arena import Arena
from ipc.logfile import BODY_OVERHEAD, BodyLog
from tests.broker.paging_harness import SIZE, W0, W1, Harness


def test_a_paged_handle_keeps_region_sizes_and_where_the_body_is_and_is_negative() -> None:
    paged = paged_body_ref(3, 20, 1000, 1, 7, 64 << 20)
    assert paged < 0 and unpack_paged_ref(paged) == (3, 20, 1000, 1, 7, 64 << 20)
    assert body_log_at(paged) == (1, 7, 64 << 20, 20 + 1000 + BODY_OVERHEAD)


def _message(region_bytes: list[int], offset: int, region: int = 0) -> FullMessage:
    m = FullMessage(0, "", "q", pack_body_ref(region, offset, 16, 100), 100)
    m.refs = 1
    m.stored = (offset, region, 0, offset, 140, 0)
    region_bytes[region] += SIZE
    return m


def test_the_pager_pages_the_newest_first_down_to_the_low_mark() -> None:
    region_bytes = [0, 0]
    freed: list[tuple[int, int, int]] = []
    pager = Pager(region_bytes, lambda region, offset, size: freed.append((region, offset, size)))
    pager.set_marks(high_watermark=20 * SIZE, ratio=0.5)  # page above 10 messages, down to 9
    messages = [_message(region_bytes, 1000 * i) for i in range(12)]
    for m in messages:
        pager.add(0, m)
    messages[11].refs = 0  # gone already: skipped
    region_bytes[0] -= SIZE
    assert pager.check() == {}  # persistent: nothing to write
    assert freed == [(0, 10_000, SIZE), (0, 9000, SIZE)]
    assert [m.body_ref < 0 for m in messages[:11]] == [False] * 9 + [True] * 2
    assert region_bytes == [9 * SIZE, 0] and pager.paged == 2
    assert body_log_at(messages[10].body_ref) == (0, 0, 10_000, SIZE + BODY_OVERHEAD)
    assert pager.check() == {} and pager.paged == 2  # under the mark: nothing more


def test_with_no_marks_nothing_is_registered_or_paged() -> None:
    region_bytes = [0]
    pager = Pager(region_bytes, lambda region, offset, size: None)
    m = _message(region_bytes, 0)
    pager.add(0, m)
    region_bytes[0] = 1 << 40
    assert pager.check() == {} and m.body_ref >= 0


def test_messages_that_went_are_compacted_away_so_the_list_stays_bounded() -> None:
    region_bytes = [0]
    pager = Pager(region_bytes, lambda region, offset, size: None)
    pager.set_marks(2)  # every message registered
    for i in range(10_000):
        m = _message(region_bytes, i)
        pager.add(0, m)
        m.refs = 0
    assert len(pager._pageable[0]) <= 2048


def test_below_half_the_low_mark_nothing_is_registered() -> None:
    """A broker whose consumers keep up pays one comparison a message."""
    region_bytes = [0]
    pager = Pager(region_bytes, lambda region, offset, size: None)
    pager.set_marks(high_watermark=20 * SIZE, ratio=0.5)  # low mark 9 messages
    for i in range(4):
        pager.add(0, _message(region_bytes, i))
    assert len(pager._pageable[0]) == 0
    pager.add(0, _message(region_bytes, 4))  # 5 messages held: past half the low mark
    assert len(pager._pageable[0]) == 1


def test_past_the_mark_persistent_bodies_leave_the_arena_and_are_delivered_from_disk() -> None:
    h = Harness()
    h.publish(12)
    assert h.d.region_bytes[W0] == 9 * SIZE
    assert h.freed == [(W0, 256 * 12), (W0, 256 * 11), (W0, 256 * 10)]
    deliveries = [h.get() for _ in range(12)]
    assert [d.stored for d in deliveries[:9]] == [None] * 9  # still in the arena
    assert [d.stored for d in deliveries[9:]] == [(W0, 0, 1000 * i, SIZE + BODY_OVERHEAD)
                                                  for i in (9, 10, 11)]
    assert [(d.header_len, d.body_len, d.reheader) for d in deliveries[9:]] == [(16, 100, False)] * 3
    h.freed.clear()
    h.d.handle(W1, r.Settle(5, 1, [d.entry for d in deliveries], r.ACK))
    # Only the nine bodies still in the arena are freed; the paged ones are not freed twice.
    assert sorted(h.freed) == [(W0, 256 * (i + 1)) for i in range(9)]
    assert h.d.region_bytes[W0] == 0


def test_transient_bodies_are_written_out_by_their_worker_first_then_freed() -> None:
    h = Harness()
    h.publish(12, persistent=False)
    # Nothing freed yet: worker 0 is asked to write the three newest to its body log.
    (page_out,) = [e for e in h.d.outbox[W0] if isinstance(e, r.PageOut)]
    assert page_out.bodies == [(256 * i, 16, 100) for i in (12, 11, 10)]
    assert h.freed == [] and h.d.region_bytes[W0] == 12 * SIZE
    h.d.outbox[W0].clear()
    h.d.end_batch()  # the bytes on their way out count as gone: not asked twice
    assert not any(isinstance(e, r.PageOut) for e in h.d.outbox[W0])
    # The worker wrote two; the third failed (disk full, say) and stays in the arena.
    h.d.handle(W0, r.PagedOut([(256 * 12, 3, 8), (256 * 11, 3, 124), (256 * 10, -1, 0)]))
    assert h.freed == [(W0, 256 * 12), (W0, 256 * 11)] and h.d.region_bytes[W0] == 10 * SIZE
    assert h.d.vhost.messages is not None and h.d.vhost.messages.live_segments() == {(W0, 3)}
    deliveries = [h.get() for _ in range(12)]
    assert [d.stored for d in deliveries[10:]] == [(W0, 3, 124, SIZE + BODY_OVERHEAD),
                                                   (W0, 3, 8, SIZE + BODY_OVERHEAD)]
    assert deliveries[9].stored is None  # the one that failed
    h.d.handle(W1, r.Settle(5, 1, [d.entry for d in deliveries], r.ACK))
    assert h.d.region_bytes[W0] == 0
    assert h.d.vhost.messages.live_segments() == set()  # the segment is not needed any more


def test_a_transient_message_gone_while_its_body_was_written_out_is_freed_once() -> None:
    h = Harness()
    h.publish(12, persistent=False)
    h.d.handle(W0, r.QueuePurge(1, 1, "d", False))  # every message goes, pinned ones too
    h.freed.clear()
    h.d.handle(W0, r.PagedOut([(256 * 12, 3, 8), (256 * 11, 3, 124), (256 * 10, 3, 240)]))
    h.d.end_batch()
    assert sorted(h.freed) == [(W0, 256 * i) for i in (10, 11, 12)]
    assert h.d.region_bytes[W0] == 0


def test_a_worker_that_dies_with_page_outs_pending_lets_go_of_them() -> None:
    h = Harness()
    h.publish(12, persistent=False)
    h.d.worker_died(W0)
    h.d.handle(W0, r.QueuePurge(1, 1, "d", False))
    h.d.end_batch()
    assert h.d.region_bytes[W0] == 0 and len(h.freed) == 12


def test_a_worker_crash_sweep_keeps_only_bodies_still_in_the_arena() -> None:
    h = Harness()
    h.publish(12)
    assert h.d.live_offsets(W0) == {256 * (i + 1) for i in range(9)}


def _e(store_id: int, at: tuple[int, int, int]) -> tuple[object, ...]:
    return ("E", "q", store_id, W0, *at, "", "k", None, None, None, False, 1_700_000_000.0)


def test_a_lazy_restore_leaves_every_body_on_disk_and_only_checks_its_frame(tmp_path: Path) -> None:
    """With paging a restart reads no body: each message comes back paged (its CRC is checked
    on delivery), and a body whose frame is cut short (a torn tail) is lost, as before."""
    bodies = BodyLog(tmp_path, W0)
    at = [bodies.append(b"H", b"x" * 1000) for _ in range(10)]
    bodies.close()
    (segment_file,) = (tmp_path / "bodies" / "w0").iterdir()
    data = segment_file.read_bytes()
    segment_file.write_bytes(data[:-10])  # the last body torn
    log = IndexLog(tmp_path)
    log.start([_e(i + 1, at[i]) for i in range(10)], 10, [])
    log.close()
    vhost = VirtualHost("/")
    vhost.declare_queue("q", owner=None, durable=True)
    journal = vhost.messages = MessageJournal()
    vhost.queues["q"].store = journal
    arenas = [Arena(bytearray(1 << 16), init=True)]
    result = restore(load_index(tmp_path, clean=True), journal, tmp_path, arenas, vhost.restore_message,
                     lazy=True)
    assert (result.messages, result.bodies, result.paged, result.lost) == (9, 0, 9, {"q": 1})
    entries = vhost.queues["q"].available_entries()
    assert all(e.message.body_ref < 0 for e in entries)
    assert [body_log_at(e.message.body_ref) for e in entries] == [(W0, *at[i]) for i in range(9)]
    assert [e.message.body_size for e in entries] == [1000] * 9
