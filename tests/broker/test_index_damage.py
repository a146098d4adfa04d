"""Damage in the index files and body segments (broker.storage.message_store, ipc.logfile): a damaged
record is skipped and every intact one after it kept; only the newest file's tail after an
unclean stop is a torn tail; what recovery cannot account for is set aside, never deleted."""

from __future__ import annotations

from pathlib import Path

import msgspec

from broker.messages.message_journal import MessageJournal
from broker.storage.message_store import IndexLog, load_index, restore, set_aside
from broker.topology.vhost import VirtualHost
from ipc import logfile
from ipc.arena import Arena
from ipc.logfile import FRAME, INDEX_MAGIC, INDEX_MAGIC_V1, SYNC, BodyLog, frame, scan_index

W0 = 0


def e_record(queue: str, store_id: int, at: tuple[int, int, int] = (0, 8, 10)) -> tuple:
    return ("E", queue, store_id, W0, *at, "", "k", None, None, None, False, 1_700_000_000.0)


def write_file(tmp_path: Path, number: int, records: list[tuple], *, v1: bool = False) -> Path:
    encode = msgspec.msgpack.encode
    path = tmp_path / "index" / f"{number:010d}.idx"
    path.parent.mkdir(parents=True, exist_ok=True)
    if v1:
        path.write_bytes(INDEX_MAGIC_V1 + b"".join(frame(encode(r)) for r in records))
    else:
        path.write_bytes(INDEX_MAGIC + b"".join(logfile.index_frame(encode(r)) for r in records))
    return path


def flip(path: Path, at: int, n: int = 4) -> None:
    data = bytearray(path.read_bytes())
    for i in range(at, at + n):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def frame_offsets(path: Path) -> list[int]:
    data = path.read_bytes()
    return [off for off, payload, _ in scan_index(data, data.startswith(INDEX_MAGIC)) if payload]


def test_scan_index_skips_a_damaged_frame_and_resynchronises_at_the_next() -> None:
    """Bytes that are not an intact frame are one gap; the frames after it are all read."""
    frames = [logfile.index_frame(b"record %d" % i) for i in range(5)]
    data = bytearray(INDEX_MAGIC + b"".join(frames))
    data[len(INDEX_MAGIC) + len(frames[0]) + 14] ^= 0xFF  # inside record 1's payload
    out = list(scan_index(bytes(data)))
    assert [p for _, p, _ in out] == [b"record 0", None, b"record 2", b"record 3", b"record 4"]
    gap = out[1]
    assert (gap[0], gap[2] - gap[0]) == (len(INDEX_MAGIC) + len(frames[0]), len(frames[1]))


def test_scan_index_reads_the_previous_format_and_resynchronises_too() -> None:
    frames = [frame(b"record %d" % i) for i in range(4)]
    data = bytearray(INDEX_MAGIC_V1 + b"".join(frames))
    data[len(INDEX_MAGIC_V1) + len(frames[0]) + 2] ^= 0xFF  # record 1's length
    out = [p for _, p, _ in scan_index(bytes(data), synced=False)]
    assert out == [b"record 0", None, b"record 2", b"record 3"]


def test_zeroed_bytes_are_a_gap_not_empty_records() -> None:
    data = INDEX_MAGIC + bytes(64) + logfile.index_frame(b"after")
    assert [p for _, p, _ in scan_index(data)] == [None, b"after"]
    assert [p for _, p, _ in scan_index(INDEX_MAGIC_V1 + bytes(64) + frame(b"after"), False)] == [
        None, b"after"]


def test_damage_in_an_older_file_keeps_every_record_after_it_and_redelivers_what_came_before(
        tmp_path: Path) -> None:
    """A damaged record in an older file is damage, not a torn tail: later records count, and
    every message enqueued before it comes back redelivered (its R may have been there)."""
    older = write_file(tmp_path, 0, [e_record("q", i) for i in range(1, 9)] + [("R", "q", 1)])
    write_file(tmp_path, 1, [("R", "q", 2), e_record("q", 9)])
    flip(older, frame_offsets(older)[4] + 6)  # E of message 5
    state = load_index(tmp_path, clean=True)
    assert state.torn == []
    (damage,) = state.damage
    assert (damage.path, damage.records, damage.torn, damage.queues) == (older, 1, False, {"q"})
    entries = state.queues["q"]
    assert list(entries) == [3, 4, 6, 7, 8, 9]  # 1 removed in file 0, 2 in file 1, 5 lost
    assert [state.delivered(entries[i]) for i in (3, 4, 6, 7, 8, 9)] == [True, True, False, False,
                                                                        False, False]


def test_only_the_newest_files_tail_after_an_unclean_stop_is_a_torn_tail(tmp_path: Path) -> None:
    path = write_file(tmp_path, 0, [e_record("q", i) for i in range(1, 4)])
    flip(path, frame_offsets(path)[2] + 6)  # the last record
    unclean = load_index(tmp_path, clean=False)
    assert len(unclean.torn) == 1 and unclean.damage == [] and unclean.tail is not None
    assert all(unclean.delivered(e) for e in unclean.queues["q"].values())  # an unclean stop
    clean = load_index(tmp_path, clean=True)
    assert clean.torn == [] and len(clean.damage) == 1 and list(clean.queues["q"]) == [1, 2]


def test_a_damaged_frame_in_the_newest_file_followed_by_intact_ones_is_damage(tmp_path: Path) -> None:
    path = write_file(tmp_path, 0, [e_record("q", i) for i in range(1, 5)])
    flip(path, frame_offsets(path)[1] + 6)
    state = load_index(tmp_path, clean=False)
    assert state.torn == [] and len(state.damage) == 1
    assert list(state.queues["q"]) == [1, 3, 4]


def test_a_file_cut_short_since_a_clean_stop_is_damage_even_at_a_frame_boundary(tmp_path: Path) -> None:
    path = write_file(tmp_path, 0, [e_record("q", i) for i in range(1, 5)])
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:frame_offsets(path)[3]])
    state = load_index(tmp_path, clean=True, sizes={path.name: size})
    assert len(state.damage) == 1 and state.damage[0].size == size - path.stat().st_size
    assert list(state.queues["q"]) == [1, 2, 3]


def test_a_previous_format_file_is_read_and_its_torn_tail_is_no_damage(tmp_path: Path) -> None:
    path = write_file(tmp_path, 0, [e_record("q", i) for i in range(1, 4)], v1=True)
    path.write_bytes(path.read_bytes()[:-3])
    write_file(tmp_path, 1, [("D", "q", 1)])
    state = load_index(tmp_path, clean=True)
    assert state.damage == [] and len(state.torn) == 1 and state.tail is None
    assert list(state.queues["q"]) == [1, 2] and state.queues["q"][1][1]


def test_a_u_record_redelivers_every_message_enqueued_before_it(tmp_path: Path) -> None:
    write_file(tmp_path, 0, [e_record("q", 1)])
    write_file(tmp_path, 1, [("U",), e_record("q", 2)])
    state = load_index(tmp_path, clean=True)
    assert [state.delivered(e) for e in state.queues["q"].values()] == [True, False]


def test_orphan_records_after_damage_name_the_messages_whose_enqueue_was_lost(tmp_path: Path) -> None:
    path = write_file(tmp_path, 0, [e_record("q", 1), e_record("q", 2), ("D", "q", 2)])
    flip(path, frame_offsets(path)[1] + 6)
    state = load_index(tmp_path, clean=True)
    assert state.orphans == {("q", 2)}


def test_a_damaged_magic_is_damage_and_the_frames_are_still_read(tmp_path: Path) -> None:
    path = write_file(tmp_path, 0, [e_record("q", 1), e_record("q", 2)])
    flip(path, 2)
    state = load_index(tmp_path, clean=True)
    assert len(state.damage) == 1 and state.damage[0].records == 0
    assert list(state.queues["q"]) == [1, 2]


def test_a_torn_tail_is_cut_off_so_that_a_later_start_does_not_call_it_damage(tmp_path: Path) -> None:
    from broker.storage.message_store import cut_torn_tail
    path = write_file(tmp_path, 0, [e_record("q", 1), e_record("q", 2)])
    path.write_bytes(path.read_bytes()[:-3])
    cut_torn_tail(load_index(tmp_path, clean=False))
    write_file(tmp_path, 1, [])
    state = load_index(tmp_path, clean=True)
    assert state.torn == [] and state.damage == [] and list(state.queues["q"]) == [1]


def test_a_queue_the_definitions_lost_is_set_aside_not_deleted(tmp_path: Path) -> None:
    """Index records and body segments of a queue that is not declared are copied into
    DIR/quarantine/<time>/; segments no known message needs are moved there after damage."""
    bodies = BodyLog(tmp_path, W0, segment_bytes=64)
    at = [bodies.append(b"H", b"x" * 40) for _ in range(3)]
    bodies.close()
    log = IndexLog(tmp_path)
    log.start([e_record("kept", 1, at[0]), e_record("lost", 2, at[1])], 2, [])
    log.close()
    state = load_index(tmp_path, clean=True)
    vhost = VirtualHost("/")
    vhost.declare_queue("kept", owner=None, durable=True)
    journal = vhost.messages = MessageJournal()
    vhost.queues["kept"].store = journal
    result = restore(state, journal, tmp_path, [Arena(bytearray(1 << 16), init=True)],
                     vhost.restore_message)
    assert (result.messages, result.gone) == (1, {"lost": 1})
    unneeded = [(W0, at[2][0])]
    aside = set_aside(tmp_path, state, set(result.gone), unneeded)
    assert aside.path is not None and (aside.index_files, aside.copied_segments,
                                      aside.moved_segments) == (1, 1, 1)
    assert sorted(p.relative_to(aside.path).as_posix() for p in aside.path.rglob("*.*")) == [
        f"bodies/w0/{at[1][0]:010d}.seg", f"bodies/w0/{at[2][0]:010d}.seg", "index/0000000000.idx"]
    assert logfile.segment_path(tmp_path, W0, at[1][0]).exists()  # copied, not moved
    assert not logfile.segment_path(tmp_path, W0, at[2][0]).exists()  # moved


def test_a_drained_restored_segment_is_freed_without_new_publishes() -> None:
    """A segment on disk at start is never appended to again: it goes with its last message."""
    journal = MessageJournal()
    journal.restored_bodies(2, {(W0, 3): 2}, {0: 2})
    stored = (1, W0, 3, 8, 10, 0)
    journal.body_dropped(stored)
    assert journal.segments_free == []
    journal.body_dropped((2, W0, 3, 18, 10, 0))
    assert journal.segments_free == [(W0, 3)] and not journal.index_file_needed(0)


def test_frame_sizes_are_what_the_format_says() -> None:
    assert len(logfile.index_frame(b"x")) == len(SYNC) + FRAME.size + 1
