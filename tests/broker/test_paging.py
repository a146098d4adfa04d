"""Paging (broker.paging): persistent bodies leave an arena past its mark, newest first, and
deliveries of them name where they are on disk; restore leaves what is past the mark there."""

from __future__ import annotations

from pathlib import Path

from broker.body_ref import pack_body_ref, paged_body_ref, unpack_paged_ref
from broker.dispatch import Dispatcher
from broker.message import FullMessage
from broker.message_journal import MessageJournal
from broker.message_store import IndexLog, load_index, restore
from broker.paging import Pager
from broker.vhost import VirtualHost
from ipc import records as r
from ipc.arena import Arena
from ipc.logfile import BodyLog

W0, W1 = 0, 1
SIZE = 116  # header 16 + body 100, as Harness.publish sends


def test_a_paged_handle_keeps_region_and_sizes_and_is_negative() -> None:
    ref = pack_body_ref(3, 4096, 20, 1000)
    paged = paged_body_ref(ref)
    assert paged < 0 and unpack_paged_ref(paged) == (3, 20, 1000)


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
    messages[11].refs = 0  # gone already (its drop was counted then): skipped
    pager.dropped(0)
    region_bytes[0] -= SIZE
    assert pager.check() == 2
    assert freed == [(0, 10_000, SIZE), (0, 9000, SIZE)]
    assert [m.body_ref < 0 for m in messages[:11]] == [False] * 9 + [True] * 2
    assert region_bytes == [9 * SIZE, 0] and pager.paged == 2
    assert pager.check() == 0  # under the mark: nothing more


def test_with_no_marks_nothing_is_registered_or_paged() -> None:
    region_bytes = [0]
    pager = Pager(region_bytes, lambda region, offset, size: None)
    m = _message(region_bytes, 0)
    pager.add(0, m)
    region_bytes[0] = 1 << 40
    assert pager.check() == 0 and m.body_ref >= 0


def test_messages_that_went_are_compacted_away_so_the_list_stays_bounded() -> None:
    region_bytes = [0]
    pager = Pager(region_bytes, lambda region, offset, size: None)
    pager.set_marks(1 << 40)
    for i in range(10_000):
        m = _message(region_bytes, i)
        pager.add(0, m)
        m.refs = 0
        pager.dropped(0)
    assert len(pager._pageable[0]) <= 2048


class Harness:
    def __init__(self) -> None:
        self.freed: list[tuple[int, int]] = []
        self.d = Dispatcher(2, lambda region, offset: self.freed.append((region, offset)))
        self.d.vhost.messages = MessageJournal()
        self.d.pager.set_marks(high_watermark=20 * SIZE, ratio=0.5)
        self.d.handle(W0, r.QueueDeclare(1, 1, "d", False, True, False, False, {}, False))
        self.d.outbox[W0].clear()

    def publish(self, n: int, *, persistent: bool = True) -> None:
        for i in range(n):
            offset = 256 * (i + 1)
            body_at = (0, 1000 * i, 140) if persistent else None
            self.d.handle(W0, r.Publish(1, 1, "", "d", False, False, offset, 16, 100, None,
                                        body_at=body_at))
        self.d.end_batch()

    def get(self) -> r.Delivery:
        self.d.handle(W1, r.Get(5, 1, "d", False))
        (ok,) = self.d.outbox[W1]
        self.d.outbox[W1].clear()
        assert isinstance(ok, r.GetOk)
        return ok.delivery


def test_past_the_mark_persistent_bodies_leave_the_arena_and_are_delivered_from_disk() -> None:
    h = Harness()
    h.publish(12)
    assert h.d.region_bytes[W0] == 9 * SIZE
    assert h.freed == [(W0, 256 * 12), (W0, 256 * 11), (W0, 256 * 10)]
    deliveries = [h.get() for _ in range(12)]
    assert [d.stored for d in deliveries[:9]] == [None] * 9  # still in the arena
    assert [d.stored for d in deliveries[9:]] == [(W0, 0, 1000 * i, 140) for i in (9, 10, 11)]
    assert [(d.header_len, d.body_len, d.reheader) for d in deliveries[9:]] == [(16, 100, False)] * 3
    h.freed.clear()
    h.d.handle(W1, r.Settle(5, 1, [d.entry for d in deliveries], r.ACK))
    # Only the nine bodies still in the arena are freed; the paged ones are not freed twice.
    assert sorted(h.freed) == [(W0, 256 * (i + 1)) for i in range(9)]
    assert h.d.region_bytes[W0] == 0


def test_transient_messages_are_not_paged() -> None:
    h = Harness()
    h.publish(30, persistent=False)
    assert h.freed == [] and h.d.region_bytes[W0] == 30 * SIZE
    assert h.d.pager.paged == 0


def test_a_worker_crash_sweep_keeps_only_bodies_still_in_the_arena() -> None:
    h = Harness()
    h.publish(12)
    assert h.d.live_offsets(W0) == {256 * (i + 1) for i in range(9)}


def _e(store_id: int, at: tuple[int, int, int]) -> tuple[object, ...]:
    return ("E", "q", store_id, W0, *at, "", "k", None, None, None, False, 1_700_000_000.0)


def test_restore_leaves_the_bodies_past_the_mark_paged_out_on_disk(tmp_path: Path) -> None:
    bodies = BodyLog(tmp_path, W0)
    at = [bodies.append(b"H", b"x" * 1000) for _ in range(10)]
    bodies.close()
    log = IndexLog(tmp_path)
    log.start([_e(i + 1, at[i]) for i in range(10)], 10, [])
    log.close()
    vhost = VirtualHost("/")
    vhost.declare_queue("q", owner=None, durable=True)
    journal = vhost.messages = MessageJournal()
    vhost.queues["q"].store = journal
    resident: list[tuple[int, object]] = []
    arenas = [Arena(bytearray(1 << 16), init=True)]  # room for all ten: the mark decides
    result = restore(load_index(tmp_path), journal, tmp_path, arenas, vhost.restore_message,
                     limit=4 * 1001, resident=lambda k, m: resident.append((k, m)))
    assert (result.messages, result.bodies, result.paged) == (10, 4, 6)
    entries = vhost.queues["q"].available_entries()
    assert [e.message.body_ref < 0 for e in entries] == [False] * 4 + [True] * 6
    assert [m for _, m in resident] == [e.message for e in entries[:4]]
    assert all(e.message.stored is not None and e.message.stored[3] == at[i][1]
               for i, e in enumerate(entries))
