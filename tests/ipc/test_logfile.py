"""ipc.logfile: a worker's body log written and read back, rotation, damaged tails, restarts."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from ipc import logfile
from ipc.logfile import BodyLog, BodyReader


def _sync(log: BodyLog) -> None:
    appended, fds = log.sync_plan()
    logfile.sync_files(fds)
    log.synced_to(appended, fds)


def _file(data_dir: Path, segment: int, worker: int = 0) -> Path:
    return logfile.segment_path(data_dir, worker, segment)


def test_append_then_read_gives_the_header_and_body_back(tmp_path: Path) -> None:
    log = BodyLog(tmp_path, 3)
    arena = bytearray(b"HEADERbody bytes" + b"\x00" * 64)
    places = [
        log.append(memoryview(arena)[:6], memoryview(arena)[6:16]),
        log.append(b"h2", b""),
        log.append(b"", b"x" * 100_000),
    ]
    _sync(log)
    reader = BodyReader(tmp_path)
    try:
        assert [reader.read(3, *where) for where in places] == [
            (b"HEADER", b"body bytes"), (b"h2", b""), (b"", b"x" * 100_000),
        ]
        assert places[0][:2] == (0, len(logfile.BODY_MAGIC))  # the first frame follows the magic
    finally:
        reader.close()
        log.close()


def test_frames_read_back_in_append_order(tmp_path: Path) -> None:
    log = BodyLog(tmp_path, 0)
    places = [log.append(b"h", bytes([n]) * n) for n in range(5)]
    log.close()
    data = _file(tmp_path, 0).read_bytes()
    assert data.startswith(logfile.BODY_MAGIC)
    assert [offset for offset, _ in logfile.iter_frames(data)] == [off for _, off, _ in places]


def test_counters_say_what_a_sync_covers(tmp_path: Path) -> None:
    log = BodyLog(tmp_path, 0)
    assert not log.unsynced
    log.append(b"h", b"1")
    log.append(b"h", b"2")
    assert (log.appended, log.synced, log.unsynced) == (2, 0, True)
    appended, fds = log.sync_plan()
    log.append(b"h", b"3")  # after the plan: the next sync's
    logfile.sync_files(fds)
    log.synced_to(appended, fds)
    assert (log.appended, log.synced, log.unsynced) == (3, 2, True)
    _sync(log)
    assert (log.synced, log.unsynced) == (3, False)
    log.close()


def test_a_new_segment_begins_at_segment_bytes(tmp_path: Path) -> None:
    log = BodyLog(tmp_path, 1, segment_bytes=100)
    places = [log.append(b"head", bytes([n]) * 40) for n in range(5)]
    assert [segment for segment, _, _ in places] == [0, 0, 1, 1, 2]
    assert [offset for _, offset, _ in places[::2]] == [len(logfile.BODY_MAGIC)] * 3
    assert logfile.segments(tmp_path, 1) == [0]  # queued: a segment is begun by its first write
    log.write_pending()
    assert logfile.segments(tmp_path, 1) == [0, 1, 2]
    _, fds = log.sync_plan()
    assert len(fds) == 4  # the two retired segments, the open one, the directory
    log.synced_to(log.appended, fds)
    assert len(log.sync_plan()[1]) == 1  # retired files closed once synced; directory clean
    reader = BodyReader(tmp_path)
    assert [reader.read(1, *where) for where in places] == [
        (b"head", bytes([n]) * 40) for n in range(5)
    ]
    reader.close()
    log.close()


def test_a_torn_tail_reads_as_never_written(tmp_path: Path) -> None:
    log = BodyLog(tmp_path, 0)
    first = log.append(b"h", b"kept")
    torn = log.append(b"h", b"torn off" * 10)
    log.close()
    path = _file(tmp_path, 0)
    data = path.read_bytes()
    path.write_bytes(data[: torn[1] + torn[2] - 5])  # the last frame half written
    reader = BodyReader(tmp_path)
    assert reader.read(0, *first) == (b"h", b"kept")
    assert reader.read(0, *torn) is None
    reader.close()
    assert [offset for offset, _ in logfile.iter_frames(path.read_bytes())] == [first[1]]


def test_a_flipped_byte_fails_the_checksum(tmp_path: Path) -> None:
    log = BodyLog(tmp_path, 0)
    first = log.append(b"h", b"fine")
    damaged = log.append(b"h", b"flipped")
    after = log.append(b"h", b"after the damage")
    log.close()
    path = _file(tmp_path, 0)
    data = bytearray(path.read_bytes())
    data[damaged[1] + damaged[2] - 1] ^= 0x01
    path.write_bytes(data)
    reader = BodyReader(tmp_path)
    assert reader.read(0, *first) == (b"h", b"fine")
    assert reader.read(0, *damaged) is None
    assert reader.read(0, *after) == (b"h", b"after the damage")  # read by its own place
    reader.close()
    # A scan stops at the damage: what follows is not trusted.
    assert [offset for offset, _ in logfile.iter_frames(bytes(data))] == [first[1]]


def test_reading_a_missing_segment_or_a_wrong_length_is_none(tmp_path: Path) -> None:
    log = BodyLog(tmp_path, 0)
    segment, offset, length = log.append(b"h", b"body")
    log.close()
    reader = BodyReader(tmp_path)
    assert reader.read(0, segment + 1, offset, length) is None
    assert reader.read(1, segment, offset, length) is None
    assert reader.read(0, segment, offset, length - 1) is None
    assert reader.read(0, segment, offset, length + 1) is None
    reader.close()


def test_a_new_body_log_on_the_same_directory_starts_a_new_segment(tmp_path: Path) -> None:
    old = BodyLog(tmp_path, 2)
    before = old.append(b"h", b"before the restart")
    old.close()
    old_bytes = _file(tmp_path, 0, worker=2).read_bytes()
    new = BodyLog(tmp_path, 2)
    after = new.append(b"h", b"after the restart")
    new.close()
    assert (before[0], after[0]) == (0, 1)
    assert logfile.segments(tmp_path, 2) == [0, 1]
    assert _file(tmp_path, 0, worker=2).read_bytes() == old_bytes  # never appended to again
    reader = BodyReader(tmp_path)
    assert reader.read(2, *before) == (b"h", b"before the restart")
    assert reader.read(2, *after) == (b"h", b"after the restart")
    reader.close()


def test_removed_segments_are_gone(tmp_path: Path) -> None:
    log = BodyLog(tmp_path, 0, segment_bytes=10)
    log.append(b"h", b"x")
    log.append(b"h", b"y")  # in segment 1: segment 0 is full
    log.close()
    assert logfile.segments(tmp_path, 0) == [0, 1]
    logfile.remove_segment(tmp_path, 0, 0)
    logfile.remove_segment(tmp_path, 0, 0)  # twice: nothing to do
    assert logfile.segments(tmp_path, 0) == [1]
    assert logfile.segments(tmp_path, 9) == []


def test_close_releases_every_file(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    log = BodyLog(tmp_path, 0, segment_bytes=10)
    log.append(b"h", b"x")
    log.append(b"h", b"y")
    log.write_pending()  # one retired segment, one open, the directory
    assert len(os.listdir("/proc/self/fd")) == before + 3
    log.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_appends_are_queued_and_written_in_one_batch(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    log = BodyLog(tmp_path, 0)
    calls: list[int] = []
    writev = os.writev

    def counting(fd: int, parts: list[bytes]) -> int:
        calls.append(len(parts))
        return writev(fd, parts)

    monkeypatch.setattr(logfile.os, "writev", counting)
    places = [log.append(b"h", bytes([n]) * n) for n in range(4)]
    assert _file(tmp_path, 0).stat().st_size == len(logfile.BODY_MAGIC)  # no IO yet
    assert (log.appended, log.unsynced) == (4, True)
    log.write_pending()
    assert calls == [12]  # three parts a frame, one writev
    log.write_pending()  # nothing queued: nothing to do
    assert calls == [12]
    data = _file(tmp_path, 0).read_bytes()
    assert [offset for offset, _ in logfile.iter_frames(data)] == [off for _, off, _ in places]
    assert len(data) == places[-1][1] + places[-1][2]
    log.close()


def test_a_batch_of_more_than_iov_max_parts_is_written_in_chunks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = BodyLog(tmp_path, 0)
    calls: list[int] = []
    writev = os.writev

    def counting(fd: int, parts: list[bytes]) -> int:
        assert len(parts) <= logfile.IOV_MAX
        calls.append(len(parts))
        return writev(fd, parts)

    monkeypatch.setattr(logfile.os, "writev", counting)
    arena = bytearray(os.urandom(4000))
    places = [log.append(memoryview(arena)[n:n + 3], memoryview(arena)[n + 3:n + 3 + n % 50])
              for n in range(700)]  # 2,100 parts
    _sync(log)  # a sync writes what is queued first
    assert calls == [1024, 1024, 52]
    reader = BodyReader(tmp_path)
    assert [reader.read(0, *where) for where in places] == [
        (bytes(arena[n:n + 3]), bytes(arena[n + 3:n + 3 + n % 50])) for n in range(700)]
    reader.close()
    log.close()


def test_a_failed_batch_write_begins_a_new_segment(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC half way through a batch: part of it is in the file (a torn frame), the queue is
    dropped, and later appends go to a new segment, where every offset is true."""
    log = BodyLog(tmp_path, 0)
    kept = log.append(b"h", b"written before")
    log.write_pending()
    failed = [log.append(b"h", b"lost %d" % n * 10) for n in range(3)]
    writev = os.writev

    def half(fd: int, parts: list[bytes]) -> int:
        writev(fd, [b"".join(parts)[:40]])  # the first frame torn
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(logfile.os, "writev", half)
    with pytest.raises(OSError, match="No space"):
        log.write_pending()
    monkeypatch.setattr(logfile.os, "writev", writev)
    assert not log.pending
    after = [log.append(b"h", b"after %d" % n) for n in range(2)]
    assert after[0][:2] == (1, len(logfile.BODY_MAGIC))
    _sync(log)
    assert log.synced == log.appended == 6
    reader = BodyReader(tmp_path)
    assert reader.read(0, *kept) == (b"h", b"written before")
    assert [reader.read(0, *where) for where in failed] == [None] * 3  # torn, missing
    assert [reader.read(0, *where) for where in after] == [(b"h", b"after 0"), (b"h", b"after 1")]
    reader.close()
    log.close()
    assert logfile.segments(tmp_path, 0) == [0, 1]
