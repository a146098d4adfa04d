"""The worker's body log and its sync task: made from WorkerConfig.data_dir, closed with the
worker; workers.body_sync.sync_bodies syncs when there is something to sync, and group-commits
what arrives while a sync runs."""

from __future__ import annotations

import errno
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
from pamqp import commands, header

from ipc import logfile
from ipc import records as r
from ipc.logfile import BodyLog
from ipc.region import Region
from ipc.wakeup import EventFd
from ipc.worker_config import WorkerConfig
from workers import body_sync, server
from workers.body_sync import sync_bodies
from workers.socket_writer import Doorbell
from workers.worker import Worker


@pytest.fixture
def region() -> Iterator[tuple[Region, EventFd, EventFd]]:
    name = f"/shoaltest.{os.getpid()}-{secrets.token_hex(4)}.w0"
    region = Region.create(name, ring_bytes=1 << 16, slots=64, arena_bytes=1 << 16)
    request, event = EventFd(), EventFd()
    try:
        yield region, request, event
    finally:
        region.close()
        region.unlink()
        request.close()
        event.close()


def _worker(region: tuple[Region, EventFd, EventFd], data_dir: str) -> Worker:
    shm, request, event = region
    config = WorkerConfig(
        index=0, instance=f"{os.getpid()}-00", regions=[shm.name], listen_fd=-1,
        request_fd=request.fileno(), event_fd=event.fileno(), alive_fd=-1, data_dir=data_dir,
    )
    return Worker(config, shm)


def test_a_data_dir_gives_the_worker_a_body_log_that_close_closes(
        region: tuple[Region, EventFd, EventFd], tmp_path: Path) -> None:
    fds_before = len(os.listdir("/proc/self/fd"))
    worker = _worker(region, str(tmp_path))
    assert worker.body_log is not None
    assert logfile.segments(tmp_path, 0) == [0]
    worker.close()
    assert worker.body_log is None
    assert len(os.listdir("/proc/self/fd")) == fds_before


def test_without_a_data_dir_there_is_no_body_log(
        region: tuple[Region, EventFd, EventFd]) -> None:
    worker = _worker(region, "")
    assert worker.body_log is None
    assert worker.store_body(0, 0, 0, 1) is None
    worker.close()


@pytest.fixture
def body_log(tmp_path: Path) -> Iterator[BodyLog]:
    log = BodyLog(tmp_path, 0)
    yield log
    log.close()


class Syncs:
    """Counts the syncs sync_bodies runs; each can be held in its thread until let go."""

    def __init__(self, *, hold: bool = False) -> None:
        self.files: list[list[int]] = []
        self.started = threading.Event()
        self.go = threading.Event()
        if not hold:
            self.go.set()

    def __call__(self, fds: list[int]) -> None:
        self.files.append(fds)
        self.started.set()
        self.go.wait(5)
        logfile.sync_files(fds)


async def _until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.001)


async def test_nothing_unsynced_means_no_sync(body_log: BodyLog,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    syncs = Syncs()
    monkeypatch.setattr(body_sync, "sync_files", syncs)
    bell = Doorbell()
    called: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sync_bodies, body_log, bell, lambda: called.append(body_log.synced))
        bell.ring()  # a ring without an append
        await trio.sleep(0.05)
        assert syncs.files == [] and called == []
        nursery.cancel_scope.cancel()


async def test_an_append_is_synced_then_announced(body_log: BodyLog,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    syncs = Syncs()
    monkeypatch.setattr(body_sync, "sync_files", syncs)
    bell = Doorbell()
    called: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sync_bodies, body_log, bell, lambda: called.append(body_log.synced))
        await trio.sleep(0.01)
        body_log.append(b"h", b"body")
        bell.ring()
        await _until(lambda: called)
        await trio.sleep(0.05)  # and then it sleeps: no further syncs
        assert called == [1] and len(syncs.files) == 1
        assert not body_log.unsynced
        nursery.cancel_scope.cancel()


async def test_appends_during_a_sync_are_covered_by_the_next_one(
        body_log: BodyLog, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs = Syncs(hold=True)
    monkeypatch.setattr(body_sync, "sync_files", syncs)
    bell = Doorbell()
    called: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sync_bodies, body_log, bell, lambda: called.append(body_log.synced))
        body_log.append(b"h", b"1")
        bell.ring()
        await trio.to_thread.run_sync(syncs.started.wait)  # the first sync is in its thread
        for n in (2, 3, 4):
            body_log.append(b"h", bytes([n]))
            bell.ring()
        assert called == []  # nothing announced before the sync is done
        syncs.go.set()
        await _until(lambda: len(called) == 2)
        await trio.sleep(0.05)
        assert called == [1, 4]  # one sync for the first append, one for the three after it
        assert len(syncs.files) == 2
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("host_busy", [True, False])
async def test_after_a_sync_that_covered_many_appends_the_next_one_waits_on_a_busy_host(
        body_log: BodyLog, monkeypatch: pytest.MonkeyPatch, host_busy: bool) -> None:
    """A sync covering BUSY_SYNC appends or more, on a host whose CPUs are busy, is followed by
    SYNC_GAP without one, so the next covers more; after a small sync, or with CPUs to spare
    (where the wait would only hold confirms back), the next starts at once. (SYNC_GAP is set
    far beyond the test.)"""
    syncs = Syncs()
    monkeypatch.setattr(body_sync, "sync_files", syncs)
    monkeypatch.setattr(logfile, "SYNC_GAP", 60.0)
    bell = Doorbell()
    called: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sync_bodies, body_log, bell, lambda: called.append(body_log.synced),
                           lambda: None, lambda: host_busy)
        body_log.append(b"h", b"small")
        bell.ring()
        await _until(lambda: called == [1])
        body_log.append(b"h", b"next")  # a small sync: the next starts at once
        bell.ring()
        await _until(lambda: called == [1, 2])
        for n in range(logfile.BUSY_SYNC):
            body_log.append(b"h", bytes([n]))
        bell.ring()
        await _until(lambda: called == [1, 2, 2 + logfile.BUSY_SYNC])
        body_log.append(b"h", b"after a busy one")
        bell.ring()
        if host_busy:
            await trio.sleep(0.2)
            assert len(syncs.files) == 3 and body_log.unsynced  # waits for the gap
        else:
            await _until(lambda: len(called) == 4)
            assert not body_log.unsynced
        nursery.cancel_scope.cancel()


async def test_a_failed_sync_ends_the_task(body_log: BodyLog,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(fds: list[int]) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(body_sync, "sync_files", failing)
    body_log.append(b"h", b"never confirmed")
    called: list[int] = []
    with pytest.raises(OSError):
        await sync_bodies(body_log, Doorbell(), lambda: called.append(1))
    assert called == [] and body_log.synced == 0


async def test_the_server_syncs_a_stored_body_and_tells_the_worker(
        region: tuple[Region, EventFd, EventFd], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Server._body_syncer: Worker.store_body rings it, Worker.body_synced follows the sync."""
    shm, request, event = region
    config = WorkerConfig(
        index=0, instance=f"{os.getpid()}-00", regions=[shm.name], listen_fd=-1,
        request_fd=request.fileno(), event_fd=event.fileno(), alive_fd=-1,
        data_dir=str(tmp_path),
    )
    srv = server.Server(config)
    worker = srv.worker
    told: list[int] = []
    monkeypatch.setattr(worker, "body_synced", lambda: told.append(worker.body_log.synced))
    head = header.ContentHeader(0, 4, commands.Basic.Properties(delivery_mode=2)).marshal()
    offset = worker.region.arena.alloc(len(head) + 4)
    assert offset is not None
    worker.region.arena.view(offset, len(head) + 4)[:] = head + b"body"
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(srv._body_syncer)
            await trio.sleep(0.01)
            assert worker.store_body(offset, len(head), 4, 1) is not None
            await _until(lambda: told)
            assert told == [1]
            nursery.cancel_scope.cancel()
    finally:
        worker.close()
        worker.region.close()


class _Handler:
    """What Worker.write_bodies uses of a connection handler."""

    def __init__(self) -> None:
        self.finished = False
        self.failed: list[int] = []

    def fail(self, exc: Exception) -> None:
        self.failed.append(getattr(exc, "reply_code", 0))

    def wake_writer(self) -> None:
        pass


def _stored(worker: Worker, conn: int, data: bytes) -> tuple[int, int, int]:
    head = header.ContentHeader(0, len(data), commands.Basic.Properties(delivery_mode=2)).marshal()
    offset = worker.region.arena.alloc(len(head) + len(data))
    assert offset is not None
    worker.region.arena.view(offset, len(head) + len(data))[:] = head + data
    where = worker.store_body(offset, len(head), len(data), conn)
    assert where is not None
    return where


def _size(tmp_path: Path, segment: int = 0) -> int:
    return logfile.segment_path(tmp_path, 0, segment).stat().st_size


def test_queued_bodies_are_written_before_the_records_go_to_the_ring(
        region: tuple[Region, EventFd, EventFd], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    worker = _worker(region, str(tmp_path))
    try:
        where = _stored(worker, 1, b"body")
        assert _size(tmp_path) == len(logfile.BODY_MAGIC)  # queued
        seen: list[int] = []
        ring = worker.region.request_ring

        class Watching:
            def put_many_nowait(self, records: list[bytes]) -> int:
                seen.append(_size(tmp_path))
                return ring.put_many_nowait(records)

        monkeypatch.setattr(worker.region, "request_ring", Watching())
        worker.send(r.Hello(1))
        assert worker.flush_requests()
        assert seen == [where[1] + where[2]]  # the frame was in the file before the ring write
    finally:
        worker.close()


def test_a_failed_body_write_fails_the_connections_of_its_batch_only(
        region: tuple[Region, EventFd, EventFd], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    worker = _worker(region, str(tmp_path))
    written, lost, other = _Handler(), _Handler(), _Handler()
    worker.handlers.update({1: written, 2: lost, 3: other})  # type: ignore[dict-item]
    try:
        _stored(worker, 1, b"written")
        assert worker.write_bodies()

        def full(fd: int, parts: object) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(logfile.os, "writev", full)
        _stored(worker, 2, b"lost")
        _stored(worker, 2, b"lost too")
        worker.send(r.Hello(1))
        assert worker.flush_requests()  # the records go all the same
        assert (written.failed, lost.failed, other.failed) == ([], [541], [])
        monkeypatch.undo()
        after = _stored(worker, 1, b"after")
        assert after[:2] == (1, len(logfile.BODY_MAGIC))  # a new segment
        assert worker.write_bodies()
        assert written.failed == []
    finally:
        worker.handlers.clear()
        worker.close()


def test_page_out_writes_at_once_and_a_failure_pages_nothing_out(
        region: tuple[Region, EventFd, EventFd], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    worker = _worker(region, str(tmp_path))
    try:
        persistent = _stored(worker, 1, b"persistent")  # queued before the page-out
        arena = worker.region.arena
        offset = arena.alloc(10)
        assert offset is not None
        arena.view(offset, 10)[:] = b"hhhhbodyyy"
        [(at, segment, position)] = worker.page_out([(offset, 4, 6)])
        assert (at, segment) == (offset, 0) and position == persistent[1] + persistent[2]
        assert _size(tmp_path) == position + logfile.BODY_OVERHEAD + 10  # written, both
        assert not worker.body_log.pending  # type: ignore[union-attr]

        def full(fd: int, parts: object) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(logfile.os, "writev", full)
        assert worker.page_out([(offset, 4, 6)]) == [(offset, -1, 0)]
    finally:
        worker.close()
