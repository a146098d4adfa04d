"""Persistent messages, the supervisor's half: index records per durable queue, confirms held for
the index sync, body segments freed, the index file read back and messages restored
(broker.messages.message_journal, broker.storage.message_store)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from broker.messages.body_ref import unpack_body_ref
from broker.messages.message import Message
from broker.messages.message_journal import IndexSyncGate, MessageJournal
from broker.runtime.dispatch import Dispatcher
from broker.storage.message_store import ArenasFull, IndexLog, load_index, restore
from broker.topology.vhost import VirtualHost
from ipc import logfile
from ipc import records as r
from ipc.arena import Arena
from ipc.logfile import BodyLog

W0, W1 = 0, 1


class Harness:
    def __init__(self) -> None:
        self.d = Dispatcher(2, lambda region, offset: None)
        self.journal = self.d.vhosts.messages = MessageJournal()
        self._offset = 0

    def events(self, worker: int = W0) -> list[r.Event]:
        out = list(self.d.outbox[worker])
        self.d.outbox[worker].clear()
        return out

    def declare(self, name: str, *, durable: bool, arguments: dict[str, object] | None = None) -> None:
        self.d.handle(W0, r.QueueDeclare(1, 1, name, False, durable, False, False, arguments or {},
                                         False))
        self.events()

    def publish(self, rk: str, *, body_at: tuple[int, int, int] | None = (0, 8, 140), ch: int = 1,
                confirm: bool = True) -> None:
        self._offset += 256
        self.d.handle(W0, r.Publish(1, ch, "", rk, False, confirm, self._offset, 16, 100, None,
                                    body_at=body_at))

    def kinds(self) -> list[str]:
        return [rec[0] for rec in self.journal.take()]


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_a_persistent_message_on_a_durable_queue_is_confirmed_only_after_the_index_sync(h: Harness) -> None:
    h.declare("d", durable=True)
    h.publish("d")
    assert h.events() == []  # held
    (rec,) = h.journal.take()
    assert rec[:7] == ("E", "d", 1, W0, 0, 8, 140)
    h.d.index_synced(h.journal.mark)
    assert h.events() == [r.Confirm(1, 1, True)]


def test_transient_queues_and_messages_are_not_recorded_and_confirm_at_once(h: Harness) -> None:
    h.declare("t", durable=False)
    h.declare("d", durable=True)
    h.publish("t")  # persistent, transient queue
    h.publish("d", body_at=None)  # transient message, durable queue
    assert h.events() == [r.Confirm(1, 1, True, 2)]  # one record for the channel's run
    assert h.journal.take() == []


def test_a_confirm_on_the_same_channel_waits_behind_a_held_one_and_other_channels_do_not(h: Harness) -> None:
    h.declare("d", durable=True)
    h.declare("t", durable=False)
    h.publish("d", ch=1)
    h.publish("t", ch=1)  # needs no sync, but comes after a held one on channel 1
    h.publish("t", ch=2)
    assert h.events() == [r.Confirm(1, 2, True)]
    h.d.index_synced(h.journal.mark)
    assert h.events() == [r.Confirm(1, 1, True, 2)]


def test_a_run_of_confirms_is_one_record_per_channel_and_kind(h: Harness) -> None:
    """Confirms fold into the outbox's last record while it is the same channel's, of the same
    kind: another channel's record, or a nack, starts a new one."""
    h.declare("t", durable=False)
    h.declare("capped", durable=False, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    for ch, queue in [(1, "t"), (1, "t"), (1, "t"), (2, "t"), (1, "t"), (1, "capped"), (1, "capped"),
                      (1, "t")]:
        h.publish(queue, ch=ch)
    assert h.events() == [r.Confirm(1, 1, True, 3), r.Confirm(1, 2, True), r.Confirm(1, 1, True),
                          r.Confirm(1, 1, False, 2), r.Confirm(1, 1, True)]


def test_a_closed_channel_loses_its_held_confirms_before_the_close_barrier(h: Harness) -> None:
    h.declare("d", durable=True)
    h.publish("d", ch=3)
    h.d.handle(W0, r.ChanClose(1, 3))
    h.d.index_synced(h.journal.mark)
    assert h.events() == [r.Reply(1, 3, "chclose")]


def test_first_delivery_ack_purge_and_delete_are_recorded(h: Harness) -> None:
    h.declare("d", durable=True)
    h.publish("d", confirm=False)
    h.publish("d", confirm=False)
    h.kinds()
    h.d.handle(W1, r.Get(5, 1, "d", False))
    (ok,) = h.events(W1)
    assert isinstance(ok, r.GetOk)
    h.d.handle(W1, r.Settle(5, 1, [ok.delivery.entry], r.REQUEUE))
    h.d.handle(W1, r.Get(5, 1, "d", False))  # the same message again: redelivered, not recorded again
    (again,) = h.events(W1)
    assert again.delivery.redelivered
    h.d.handle(W1, r.Settle(5, 1, [again.delivery.entry], r.ACK))
    assert h.kinds() == ["D", "R"]
    h.d.handle(W0, r.QueuePurge(1, 1, "d", False))
    h.d.handle(W0, r.QueueDelete(1, 1, "d", False, False, False))
    assert h.kinds() == ["P", "X"]


def deliver_and_settle(h: Harness, outcome: int = r.ACK) -> None:
    h.d.handle(W1, r.Get(5, 1, "d", False))
    (ok,) = h.events(W1)
    assert isinstance(ok, r.GetOk)
    h.d.handle(W1, r.Settle(5, 1, [ok.delivery.entry], outcome))


def test_a_message_acked_before_its_records_are_written_writes_none_and_is_confirmed(h: Harness) -> None:
    """E, D and R of one message all still unwritten cancel out: nothing of it goes to the
    index, and its confirm goes out with the next sync (which has nothing to write)."""
    h.declare("d", durable=True)
    h.publish("d")
    assert h.events() == []  # the confirm waits for the index
    deliver_and_settle(h)
    assert h.journal.take() == []
    assert h.journal.cancelled == 3
    h.d.index_synced(h.journal.mark)
    assert h.events() == [r.Confirm(1, 1, True)]


def test_only_the_message_that_went_cancels_and_written_records_are_not_taken_back(h: Harness) -> None:
    h.declare("d", durable=True)
    h.publish("d", confirm=False)  # id 1: its E is written before it goes
    assert h.kinds() == ["E"]
    h.publish("d", confirm=False)  # id 2: goes before a write
    h.publish("d", confirm=False)  # id 3: stays, delivered
    deliver_and_settle(h)  # id 1: D and R must be written
    deliver_and_settle(h)  # id 2: cancels
    h.d.handle(W1, r.Get(5, 1, "d", False))  # id 3: delivered, not settled
    h.events(W1)
    assert [(rec[0], rec[2]) for rec in h.journal.take()] == [("E", 3), ("D", 1), ("R", 1), ("D", 3)]


def test_a_requeued_and_redelivered_message_still_cancels_with_its_one_d_record(h: Harness) -> None:
    h.declare("d", durable=True)
    h.publish("d", confirm=False)
    deliver_and_settle(h, r.REQUEUE)
    deliver_and_settle(h)
    assert h.journal.take() == []


def test_a_purge_or_delete_keeps_what_was_recorded_before_it(h: Harness) -> None:
    """A P or X record speaks of what is on disk: records before it are written as they are,
    even for a message acked after it."""
    h.declare("d", durable=True)
    h.publish("d", confirm=False)
    h.publish("d", confirm=False)
    h.d.handle(W1, r.Get(5, 1, "d", False))  # id 1 acquired: kept by the purge
    (ok,) = h.events(W1)
    h.d.handle(W0, r.QueuePurge(1, 1, "d", False))
    h.d.handle(W1, r.Settle(5, 1, [ok.delivery.entry], r.ACK))
    assert [(rec[0], rec[2]) for rec in h.journal.take()] == [("E", 1), ("E", 2), ("D", 1),
                                                               ("P", [1]), ("R", 1)]


def test_a_body_segment_is_freed_once_nothing_needs_it_and_the_worker_moved_on(h: Harness) -> None:
    h.declare("d", durable=True)
    h.publish("d", body_at=(0, 8, 140), confirm=False)
    h.d.handle(W1, r.Get(5, 1, "d", False))
    (ok,) = h.events(W1)
    h.d.handle(W1, r.Settle(5, 1, [ok.delivery.entry], r.ACK))
    assert h.journal.segments_free == []  # segment 0 is still the worker's newest
    h.publish("d", body_at=(1, 8, 140), confirm=False)
    assert h.journal.segments_free == [(W0, 0)]
    assert h.journal.live_segments() == {(W0, 1)}


def test_an_unroutable_persistent_message_does_not_keep_its_segment(h: Harness) -> None:
    h.publish("nowhere", body_at=(0, 8, 140), confirm=False)
    h.publish("nowhere", body_at=(1, 8, 140), confirm=False)
    assert h.journal.live_segments() == set()
    assert h.journal.segments_free == [(W0, 0)]


def test_confirm_gate_releases_in_order_per_key() -> None:
    gate = IndexSyncGate()
    assert gate.admit("a", "a1", 0)  # nothing held, nothing needed: at once
    assert not gate.admit("a", "a2", 5)
    assert not gate.admit("a", "a3", 0)
    assert not gate.admit("b", "b1", 7)
    assert gate.release(6) == [("a", "a2"), ("a", "a3")]
    assert gate.release(7) == [("b", "b1")]
    assert not gate


# --------------------------------------------------------------------------- on disk


def write_index(tmp_path: Path, records: list[tuple]) -> None:
    log = IndexLog(tmp_path)
    log.start(records, len(records), [])
    log.close()


def e_record(queue: str, store_id: int, segment_at: tuple[int, int, int], rk: str = "k") -> tuple:
    return ("E", queue, store_id, W0, *segment_at, "", rk, None, None, None, False, 1_700_000_000.0)


def test_the_index_is_read_back_with_deliveries_removals_purges_and_deletes(tmp_path: Path) -> None:
    write_index(tmp_path, [
        e_record("a", 1, (0, 8, 10)), e_record("a", 2, (0, 18, 10)), e_record("a", 3, (0, 28, 10)),
        e_record("b", 1, (0, 8, 10)), e_record("c", 4, (0, 38, 10)),
        ("D", "a", 2), ("R", "a", 1), ("P", "b", []), ("X", "c"), e_record("c", 5, (0, 48, 10)),
    ])
    state = load_index(tmp_path, clean=True)
    assert {q: [(i, delivered) for i, (_, delivered, _) in entries.items()] for q, entries in state.queues.items()
            if entries} == {"a": [(2, True), (3, False)], "c": [(5, False)]}
    assert state.max_id == 5 and state.records == 10 and state.torn == []


def test_a_torn_tail_ends_the_index_where_the_last_whole_record_ends(tmp_path: Path) -> None:
    write_index(tmp_path, [e_record("a", 1, (0, 8, 10)), e_record("a", 2, (0, 18, 10))])
    (path,) = (tmp_path / "index").iterdir()
    data = path.read_bytes()
    path.write_bytes(data[:-5])  # the second record cut short
    state = load_index(tmp_path, clean=False)
    assert list(state.queues["a"]) == [1]
    assert len(state.torn) == 1 and "after the last whole record" in state.torn[0]


def test_restore_brings_bodies_back_into_the_arenas_in_order_and_redelivered(tmp_path: Path) -> None:
    bodies = BodyLog(tmp_path, W0)
    at = [bodies.append(b"H%d" % i, b"body %d" % i) for i in range(4)]
    bodies.close()
    write_index(tmp_path, [
        *(e_record("q", i + 1, at[i], rk=f"k{i}") for i in range(4)),
        e_record("other", 2, at[1]),  # one message on two queues: one body
        ("D", "q", 3), ("R", "q", 1),
        e_record("q", 9, (at[3][0], at[3][1] + 1, at[3][2])),  # a body that is not there
    ])
    vhost = VirtualHost("/")
    vhost.declare_queue("q", owner=None, durable=True)
    vhost.declare_queue("other", owner=None, durable=True)
    journal = vhost.messages = MessageJournal()
    for q in vhost.queues.values():
        q.store = journal
    arenas = [Arena(bytearray(1 << 16), init=True), Arena(bytearray(1 << 16), init=True)]
    result = restore(load_index(tmp_path, clean=True), journal, tmp_path, arenas, vhost.restore_message)
    assert (result.messages, result.bodies, result.lost) == (4, 3, {"q": 1})
    queue = vhost.queues["q"]
    entries = queue.available_entries()
    assert [e.message.routing_key for e in entries] == ["k1", "k2", "k3"]
    assert [e.redelivered for e in entries] == [False, True, False]
    for entry, i in zip(entries, (1, 2, 3), strict=True):
        region, offset, header_len, body_len = unpack_body_ref(entry.message.body_ref)
        assert bytes(arenas[region].view(offset, header_len + body_len)) == b"H%dbody %d" % (i, i)
    assert vhost.queues["other"].available_entries()[0].message is entries[0].message
    assert {region for e in entries for region in [unpack_body_ref(e.message.body_ref)[0]]} == {0, 1}
    # The index file stays: the journal records only what changed -- the entry whose body is
    # lost, so that no later start looks for it again.
    assert journal.take() == [("R", "q", 9)]
    assert journal.live_segments() == {(W0, at[0][0])}


def test_messages_of_a_failed_body_write_are_lost_at_restart_and_the_rest_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's batched body write failed (ENOSPC half way: one frame torn, the next never
    written) after their Publish records had gone: the index names them, a restart finds
    their frames torn or missing and forgets them (an R record each: never confirmed), and
    keeps the bodies written before and after (the new segment)."""
    bodies = BodyLog(tmp_path, W0)
    before = bodies.append(b"H", b"before")
    bodies.write_pending()
    failed = [bodies.append(b"H", b"failed %d" % i * 8) for i in range(2)]
    writev = os.writev

    def torn(fd: int, parts: list[bytes]) -> int:
        writev(fd, [b"".join(parts)[:30]])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(logfile.os, "writev", torn)
    with pytest.raises(OSError):
        bodies.write_pending()
    monkeypatch.undo()
    after = bodies.append(b"H", b"after")
    bodies.close()
    at = [before, *failed, after]
    write_index(tmp_path, [e_record("q", i + 1, at[i], rk=f"k{i}") for i in range(4)])
    vhost = VirtualHost("/")
    vhost.declare_queue("q", owner=None, durable=True)
    journal = vhost.messages = MessageJournal()
    vhost.queues["q"].store = journal
    arenas = [Arena(bytearray(1 << 16), init=True)]
    result = restore(load_index(tmp_path, clean=True), journal, tmp_path, arenas, vhost.restore_message)
    assert (result.messages, result.lost, result.cut_short) == (2, {"q": 2}, {"q": 2})
    assert [e.message.routing_key for e in vhost.queues["q"].available_entries()] == ["k0", "k3"]
    assert journal.take() == [("R", "q", 2), ("R", "q", 3)]


def _restart(tmp_path: Path, *queues: str) -> tuple[VirtualHost, MessageJournal, IndexLog]:
    """A start: the index read back, its messages restored onto durable ``queues``, the new
    index file begun (as broker.runtime.durability.Durability.recover_messages does)."""
    state = load_index(tmp_path, clean=True)
    journal = MessageJournal(last_id=state.max_id)

    def dropped(message: Message) -> None:  # the runtime's on_drop, for the journal's part
        if message.stored is not None:
            journal.body_dropped(message.stored)

    vhost = VirtualHost("/", on_drop=dropped)
    for name in queues:
        vhost.declare_queue(name, owner=None, durable=True)
    vhost.messages = journal
    for q in vhost.queues.values():
        q.store = journal
    log = IndexLog(tmp_path)
    journal.index_file = log.number
    arenas = [Arena(bytearray(1 << 16), init=True)]
    result = restore(state, journal, tmp_path, arenas, vhost.restore_message)
    for name in result.gone:  # set aside by the runtime (message_store.set_aside), then forgotten
        journal.deleted(name)
    log.start(journal.take(), journal.mark, state.files)
    return vhost, journal, log


def _index_files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "index").iterdir())


def test_a_restart_keeps_the_index_files_and_the_next_start_sees_what_happened_since(
        tmp_path: Path) -> None:
    """The restored state is not written again: the old file stays while its messages live,
    acks after the start go to the new file, and a second start reads both."""
    bodies = BodyLog(tmp_path, W0)
    at = [bodies.append(b"H%d" % i, b"body %d" % i) for i in range(3)]
    bodies.close()
    write_index(tmp_path, [*(e_record("q", i + 1, at[i], rk=f"k{i}") for i in range(3)), ("D", "q", 2)])
    vhost, journal, log = _restart(tmp_path, "q")
    assert _index_files(tmp_path) == ["0000000000.idx", "0000000001.idx"]
    queue = vhost.queues["q"]
    first = queue.get()
    assert first is not None and first.message.routing_key == "k0" and not first.redelivered
    journal.delivered("q", first.message)
    queue.settle(first)
    log.append(journal.take(), journal.mark)
    assert log.remove_unneeded(journal.index_file_needed) == 0  # k1, k2 still live in file 0
    log.close()
    vhost, journal, log = _restart(tmp_path, "q")
    entries = vhost.queues["q"].available_entries()
    assert [(e.message.routing_key, e.redelivered) for e in entries] == [("k1", True), ("k2", False)]
    for entry in entries:  # all acked: file 0 (and file 1, older than the newest) can go
        taken = vhost.queues["q"].get()
        assert taken is entry
        vhost.queues["q"].settle(taken)
    log.append(journal.take(), journal.mark)
    assert log.remove_unneeded(journal.index_file_needed) == 2
    assert _index_files(tmp_path) == ["0000000002.idx"]
    log.close()
    vhost, _, log = _restart(tmp_path, "q")
    assert vhost.queues["q"].message_count == 0
    log.close()


def test_messages_of_a_queue_gone_at_start_never_come_back_to_a_later_queue_of_that_name(
        tmp_path: Path) -> None:
    bodies = BodyLog(tmp_path, W0)
    at = bodies.append(b"H", b"body")
    bodies.close()
    write_index(tmp_path, [e_record("gone", 1, at)])
    _, _, log = _restart(tmp_path)  # no queue "gone" any more
    log.close()
    vhost, _, log = _restart(tmp_path, "gone")  # declared again, durable
    assert vhost.queues["gone"].message_count == 0
    log.close()


def test_restore_says_when_the_bodies_do_not_fit_the_arenas(tmp_path: Path) -> None:
    bodies = BodyLog(tmp_path, W0)
    at = [bodies.append(b"H", b"x" * 3000) for _ in range(4)]
    bodies.close()
    write_index(tmp_path, [e_record("q", i + 1, at[i]) for i in range(4)])
    vhost = VirtualHost("/")
    vhost.declare_queue("q", owner=None, durable=True)
    with pytest.raises(ArenasFull, match="do not fit"):
        restore(load_index(tmp_path, clean=True), MessageJournal(), tmp_path, [Arena(bytearray(8192), init=True)],
                vhost.restore_message)


def test_full_index_files_are_rotated_and_removed_oldest_first_once_their_messages_are_gone(
        tmp_path: Path) -> None:
    journal = MessageJournal()
    log = IndexLog(tmp_path, file_bytes=24)
    journal.index_file = log.number
    log.start([], 0, [])
    old = journal.new_body(W0, 0, 8, 100)  # E records in file 0
    log.append([e_record("q", old[0], (0, 8, 100))], 1)
    assert log.rotate() and log.number == 1
    journal.index_file = log.number
    newer = journal.new_body(W0, 0, 108, 100)  # file 1
    log.append([e_record("q", newer[0], (0, 108, 100))], 2)
    assert log.rotate()
    journal.index_file = log.number  # file 2 is the newest now
    files = lambda: sorted(p.name for p in (tmp_path / "index").iterdir())  # noqa: E731
    journal.body_dropped(newer)  # file 1 holds nothing alive, but file 0 does: nothing goes
    assert log.remove_unneeded(journal.index_file_needed) == 0
    journal.body_dropped(old)
    assert log.remove_unneeded(journal.index_file_needed) == 2
    assert files() == ["0000000002.idx"]
    mark, fds = log.sync_plan()
    log.synced_to(mark, fds)
    assert not log.unsynced
    log.close()


def test_a_commit_barrier_is_answered_once_the_index_holds_the_commit(h: Harness) -> None:
    """tx.commit ends with a Sync: its reply (commit-ok) waits for the index sync, and the
    channel's next answers wait behind it, in order."""
    h.declare("d", durable=True)
    h.publish("d", confirm=False)
    h.d.handle(W0, r.Sync(1, 1))
    h.d.handle(W0, r.QueueDeclare(1, 1, "d", True, True, False, False, {}, False))
    h.d.handle(W0, r.Get(1, 1, "nowhere", False))  # 404: an error answer, in its turn
    h.d.handle(W0, r.Sync(1, 2))  # another channel's barrier waits too: records are unsynced
    assert h.events() == []
    h.d.index_synced(h.journal.mark)
    events = h.events()
    assert [type(e).__name__ for e in events] == ["Reply", "Reply", "Error", "Reply"]
    assert [(e.ch, getattr(e, "method", None)) for e in events[:2]] == [(1, "sync"), (1, "qdecl")]


def test_a_barrier_with_nothing_unsynced_is_answered_at_once(h: Harness) -> None:
    h.declare("t", durable=False)
    h.publish("t", confirm=False)
    h.d.handle(W0, r.Sync(1, 1))
    assert h.events() == [r.Reply(1, 1, "sync")]


def test_records_made_again_to_move_an_old_file_on_are_never_cancelled(h: Harness) -> None:
    """An E record written again in the newest index file (broker.storage.index_moves) must be
    followed by its R: the old file's E is on disk until the new one is."""
    h.declare("d", durable=True)
    h.publish("d", confirm=False)
    assert h.kinds() == ["E"]
    message = h.d.vhost.queues["d"].available_entries()[0].message
    h.journal.recorded_again("d", message, False, 0.0)
    deliver_and_settle(h)
    assert h.kinds() == ["E", "D", "R"]


async def test_a_sync_with_only_cancelled_records_writes_nothing_and_skips_the_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.runtime import durability

    fsyncs: list[list[int]] = []
    monkeypatch.setattr(durability, "sync_files", lambda fds: fsyncs.append(list(fds)))
    d = Dispatcher(2, lambda region, offset: None)
    store = durability.Durability(str(tmp_path), d)
    try:
        store.recover_definitions()
        store.recover_messages([None, None], 64)
        d.handle(W0, r.QueueDeclare(1, 1, "d", False, True, False, False, {}, False))
        assert await store.sync_once() is False  # nothing recorded yet
        d.handle(W0, r.Publish(1, 1, "", "d", False, True, 256, 16, 100, None, body_at=(0, 8, 140)))
        d.handle(W1, r.Get(5, 1, "d", False))
        (ok,) = [e for e in d.outbox[W1] if isinstance(e, r.GetOk)]
        d.handle(W1, r.Settle(5, 1, [ok.delivery.entry], r.ACK))
        assert r.Confirm(1, 1, True) not in d.outbox[W0]
        index = store.index
        assert index is not None
        size = index.bytes
        assert await store.sync_once() is True
        assert fsyncs == [] and index.bytes == size
        assert r.Confirm(1, 1, True) in d.outbox[W0]
        d.handle(W0, r.Publish(1, 1, "", "d", False, True, 512, 16, 100, None, body_at=(0, 150, 140)))
        assert await store.sync_once() is True  # a message that stays: written and synced
        assert len(fsyncs) == 1 and index.bytes > size
    finally:
        store.close()


async def test_after_an_index_sync_that_covered_many_records_the_next_one_waits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor's group commit is paced as the workers' is (ipc.logfile): after a sync
    covering BUSY_SYNC records or more on a saturated host, SYNC_GAP without one; after a small
    one, none."""
    import trio

    from broker.runtime import durability

    monkeypatch.setattr(logfile, "SYNC_GAP", 60.0)
    d = Dispatcher(2, lambda region, offset: None)
    store = durability.Durability(str(tmp_path), d)
    store.saturated = lambda: True  # type: ignore[method-assign]  # the host's CPUs are busy
    store.recover_definitions()
    store.recover_messages([None, None], 64)
    index = store.index
    assert index is not None
    d.handle(W0, r.QueueDeclare(1, 1, "d", False, True, False, False, {}, False))
    offset = 0

    def publish(n: int) -> None:
        nonlocal offset
        for _ in range(n):
            offset += 256
            d.handle(W0, r.Publish(1, 1, "", "d", False, False, offset, 16, 100, None,
                                   body_at=(0, offset, 140)))
        store.save()

    async def until_synced() -> None:
        with trio.fail_after(5):
            while index.synced < d.vhost.messages.mark:  # type: ignore[union-attr]
                await trio.sleep(0.001)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.sync_index, lambda: None)
            publish(1)
            await until_synced()
            publish(1)  # after a small sync: at once
            await until_synced()
            publish(logfile.BUSY_SYNC)
            await until_synced()
            publish(1)  # after a busy one: it waits
            await trio.sleep(0.2)
            assert index.synced < d.vhost.messages.mark  # type: ignore[union-attr]
            nursery.cancel_scope.cancel()
    finally:
        store.close()



def test_cpu_saturation_is_read_from_proc_stat_deltas(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    now = [0.0]

    def write(user: int, idle: int, iowait: int = 0) -> None:
        stat.write_text(f"cpu  {user} 0 0 {idle} {iowait} 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")

    write(1000, 1000)
    busy = logfile.CpuSaturation(str(stat), clock=lambda: now[0])
    assert busy() is True  # one reading: no interval yet (as if busy)
    now[0] += 1
    write(1600, 1400)  # 60 % busy since
    assert busy() is True
    write(2000, 2400)
    assert busy() is True  # looked at most once per SATURATION_LOOK: the last answer
    now[0] += 1
    assert busy() is False  # 400 busy, 1000 idle
    now[0] += 1
    write(2300, 2500, 200)  # iowait counts as idle: 300 busy, 300 idle
    assert busy() is False
    missing = logfile.CpuSaturation(str(tmp_path / "none"))
    assert missing() is True



def test_sync_pause_only_under_load_on_a_busy_host_with_a_fast_disk() -> None:
    gap, many = logfile.SYNC_GAP, logfile.BUSY_SYNC
    assert logfile.sync_pause(many - 1, 0.0, lambda: True) == 0.0  # a small sync: no wait
    assert logfile.sync_pause(many, 0.0, lambda: False) == 0.0  # CPUs to spare: no wait
    assert logfile.sync_pause(many, gap, lambda: True) == 0.0  # a slow disk batches by itself
    assert logfile.sync_pause(many, gap / 4, lambda: True) == gap
