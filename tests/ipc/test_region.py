from __future__ import annotations

import contextlib
import os
import secrets
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import posix_ipc
import pytest
import trio

from ipc.region import (
    NOT_ACCEPTING,
    Region,
    RegionError,
    _owner_pid,
    new_instance_id,
    region_name,
    sweep_stale,
)
from ipc.wakeup import EventFd, wait_for_work, wake_if_sleeping

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"ring_bytes": 4096, "slots": 100, "arena_bytes": 1 << 16}


def unique_name(prefix: str = "shoaltest.", worker: int = 0) -> str:
    return f"/{prefix}{os.getpid()}-{secrets.token_hex(4)}.w{worker}"


def unlink_quietly(name: str) -> None:
    with contextlib.suppress(posix_ipc.ExistentialError):
        posix_ipc.unlink_shared_memory(name)


@pytest.fixture
def shm_name() -> Iterator[str]:
    name = unique_name()
    try:
        yield name
    finally:
        unlink_quietly(name)


@pytest.fixture
def region(shm_name: str) -> Iterator[Region]:
    region = Region.create(shm_name, **SMALL)
    try:
        yield region
    finally:
        region.close()
        region.unlink()


def shm_path(name: str) -> Path:
    return Path("/dev/shm") / name.lstrip("/")


# ---------------------------------------------------------------- naming


def test_region_name_carries_the_owner_pid() -> None:
    """Names are /shoal.<pid>-<hex>.w<k>, and the sweep reads the pid back from them."""
    instance = new_instance_id()
    name = region_name(instance, 3)
    assert name == f"/shoal.{instance}.w3"
    assert _owner_pid(name.lstrip("/"), "shoal.") == os.getpid()
    assert _owner_pid("shoal.notapid.w0", "shoal.") is None
    with pytest.raises(ValueError):
        region_name("no-pid", 0)


# ------------------------------------------------------------- lifecycle


def test_create_is_exclusive_private_and_sparse(region: Region) -> None:
    """A region is created O_EXCL with mode 0600, and its untouched pages take no memory."""
    info = shm_path(region.name).stat()
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_size == region.layout.total
    with pytest.raises(posix_ipc.ExistentialError):
        Region.create(region.name, **SMALL)
    big_name = unique_name()
    try:
        big = Region.create(big_name)  # the defaults: ~264 MiB
        big.close()
        assert shm_path(big_name).stat().st_blocks * 512 < (1 << 20)
    finally:
        unlink_quietly(big_name)


def mapped_rss_kb(name: str) -> int:
    """This process's resident kB of its mapping(s) of the segment ``name`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's first line
            inside = line.rstrip().endswith(name.lstrip("/"))
        elif inside and fields and fields[0] == "Rss:":
            total += int(fields[1])
    return total


def test_forget_arena_pages_drops_them_from_rss_and_keeps_their_content(shm_name: str) -> None:
    """The supervisor frees blocks in every arena; forget_arena_pages takes the pages it
    touched out of its RSS (MADV_DONTNEED), while the bytes stay in the segment for it and
    for every other process that maps it."""
    region = Region.create(shm_name, ring_bytes=4096, slots=100, arena_bytes=8 << 20)
    other = Region.attach(shm_name)  # a worker's view of the same region
    try:
        offsets = [region.arena.alloc(4000) for _ in range(1500)]  # ~6 MB of arena
        for i, at in enumerate(offsets):
            other.arena.view(at, 4000)[:8] = i.to_bytes(8, "little")
        for at in offsets[::2]:
            region.arena.free(at)
        before = mapped_rss_kb(shm_name)
        assert before > 4 << 10  # both mappings hold the written pages
        region.forget_arena_pages()
        after = mapped_rss_kb(shm_name)
        assert before - after > 2 << 10  # one of the two mappings' arena pages is gone
        for i, at in enumerate(offsets[1::2]):  # content kept: read through either mapping
            index = 2 * i + 1
            assert bytes(region.arena.view(at, 8)) == index.to_bytes(8, "little")
            assert bytes(other.arena.view(at, 8)) == index.to_bytes(8, "little")
        region.arena.free(offsets[1])  # and still usable for frees
        assert other.arena.alloc(3000) > 0
    finally:
        other.close()
        region.close()
        region.unlink()


def test_attach_reads_the_layout_and_shares_every_section(region: Region) -> None:
    """An attached region sees the creator's layout, rings, flags, slots, arena and pids."""
    region.request_ring.put_nowait(b"to supervisor")
    region.worker_sleeping.set_sleeping()
    region.set_slot(7)
    body = region.arena.alloc(4)
    assert body is not None
    with region.arena.view(body, 4) as view:
        view[:] = b"body"
    with Region.attach(region.name) as other:
        assert other.layout == region.layout
        assert other.supervisor_pid == os.getpid()
        assert other.request_ring.get_nowait() == b"to supervisor"
        assert other.worker_sleeping.is_sleeping()
        assert not other.supervisor_sleeping.is_sleeping()
        assert other.take_set_slots() == [7]
        with other.arena.view(body, 4) as view:
            assert view.tobytes() == b"body"
        other.arena.free(body)
        other.worker_pid = 4242
        other.event_ring.put_nowait(b"to worker")
    assert region.worker_pid == 4242
    assert region.event_ring.get_nowait() == b"to worker"
    assert not region.any_slot_set()
    assert all(b.state.name == "FREE" for b in region.arena.blocks())


def test_connection_count_starts_not_accepting_and_is_shared(region: Region) -> None:
    """A new region's worker takes no connections yet; the count the worker writes is what a
    peer attached to the same region reads."""
    assert region.connections == NOT_ACCEPTING
    with Region.attach(region.name) as peer:
        assert peer.connections == NOT_ACCEPTING
        region.connections = 3
        assert peer.connections == 3
        region.connections = 0
        assert peer.connections == 0


def test_sizes_are_configurable_and_page_aligned(shm_name: str) -> None:
    """Ring and arena sizes round up to whole pages; the slot count is exact."""
    with Region.create(shm_name, ring_bytes=5000, slots=10, arena_bytes=9000) as region:
        assert region.request_ring.capacity == region.event_ring.capacity == 8192 - 128
        assert len(region.slots) == 10
        assert region.arena.capacity == 12288


def test_attach_rejects_a_segment_that_is_not_a_region(shm_name: str) -> None:
    """A segment without the magic and layout version is refused with RegionError."""
    shm = posix_ipc.SharedMemory(shm_name, posix_ipc.O_CREX, mode=0o600, size=8192)
    shm.close_fd()
    with pytest.raises(RegionError):
        Region.attach(shm_name)


def test_close_tolerates_a_body_view_still_held(region: Region) -> None:
    """close() succeeds while someone still holds an arena view; the rings are unusable."""
    body = region.arena.alloc(10)
    assert body is not None
    held = region.arena.view(body, 10)
    region.close()
    held[:] = b"x" * 10  # the mapping stays until the view goes
    held.release()
    with pytest.raises(ValueError):
        region.request_ring.put_nowait(b"after close")


# ---------------------------------------------------------- notify slots


def test_setting_a_set_slot_coalesces(region: Region) -> None:
    """A burst of set_slot on one slot leaves one pending notification."""
    assert region.set_slot(5) is True
    assert [region.set_slot(5) for _ in range(10)] == [False] * 10
    assert region.take_set_slots() == [5]
    assert region.take_set_slots() == []


def test_take_set_slots_returns_each_set_slot_and_clears_it(region: Region) -> None:
    """take_set_slots gives every set slot in index order, clearing exactly those."""
    for i in (99, 0, 42, 43):
        region.set_slot(i)
    assert region.any_slot_set()
    assert region.take_set_slots() == [0, 42, 43, 99]
    assert not region.any_slot_set()
    assert not any(region.slots)
    region.set_slot(42)  # a set after the take is a new notification
    assert region.take_set_slots() == [42]


def test_slot_indices_are_bounded(region: Region) -> None:
    """A slot outside the region's slot count is an IndexError, not a stray write."""
    with pytest.raises(IndexError):
        region.set_slot(100)
    with pytest.raises(IndexError):
        region.set_slot(-1)


def test_clear_slots_drops_every_pending_notification(region: Region) -> None:
    """clear_slots() leaves no slot set."""
    for i in range(0, 100, 3):
        region.set_slot(i)
    region.clear_slots()
    assert not region.any_slot_set()
    assert region.take_set_slots() == []


# --------------------------------------------------------------- sweeping


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(child.stdout)


def test_sweep_removes_dead_instances_and_keeps_live_ones() -> None:
    """sweep_stale unlinks segments whose owner pid is gone and never touches a live
    instance's segment or a name it does not recognise."""
    prefix = f"shoaltest{secrets.token_hex(4)}."
    dead = f"/{prefix}{dead_pid()}-{secrets.token_hex(4)}.w0"
    live = f"/{prefix}{os.getpid()}-{secrets.token_hex(4)}.w1"
    other = f"/{prefix}unrelated"
    try:
        for name in (dead, live, other):
            Region.create(name, **SMALL).close()
        assert sweep_stale(prefix) == [dead]
        assert not shm_path(dead).exists()
        assert shm_path(live).exists() and shm_path(other).exists()
        assert sweep_stale(prefix) == []
    finally:
        for name in (dead, live, other):
            unlink_quietly(name)


# ----------------------------------------------------------- two processes

WORKER = """
import os, sys
from ipc.region import Region
from ipc.wakeup import EventFd, wake_if_sleeping

region = Region.attach(sys.argv[1])
to_worker, to_supervisor = EventFd(fd=int(sys.argv[2])), EventFd(fd=int(sys.argv[3]))
region.worker_pid = os.getpid()
stop = False
while not stop:
    records = region.event_ring.get_all_nowait()
    records += [b"slot %d" % i for i in region.take_set_slots()]
    if not records:
        region.worker_sleeping.set_sleeping()
        if region.event_ring.is_empty() and not region.any_slot_set():
            to_worker.wait_blocking(60)
        region.worker_sleeping.clear()
        continue
    replies = []
    for record in records:
        if record == b"stop":
            stop = True
            continue
        body = region.arena.alloc(len(record))
        with region.arena.view(body, len(record)) as view:
            view[:] = record.upper()
        replies.append(b"%d %d" % (body, len(record)))
    assert region.request_ring.put_many_nowait(replies) == len(replies)
    wake_if_sleeping(region.supervisor_sleeping, to_supervisor)
region.close()
"""


async def test_two_processes_exchange_records_bodies_and_wakeups(
    region: Region, tmp_path: Path
) -> None:
    """A worker process attached to the region answers every record sent on the event
    ring, through the request ring and the arena, woken only by eventfds, across
    many ring laps; the supervisor side frees the bodies the worker allocated."""
    to_worker, to_supervisor = EventFd(), EventFd()
    fds = (to_worker.fileno(), to_supervisor.fileno())
    errors = tmp_path / "worker.err"
    argv = [sys.executable, "-c", WORKER, region.name, *map(str, fds)]
    with errors.open("wb") as err:
        proc = await trio.lowlevel.open_process(argv, pass_fds=fds, cwd=ROOT, stderr=err)
    try:
        with trio.fail_after(60):  # a hang guard, not a timing assertion
            for rnd in range(40):  # ~40 x 600 bytes through a 3968-byte ring
                batch = [b"round %d record %d" % (rnd, i) for i in range(30)]
                assert region.event_ring.put_many_nowait(batch) == len(batch)
                if rnd % 10 == 0:
                    region.set_slot(rnd)
                    batch.append(b"slot %d" % rnd)
                wake_if_sleeping(region.worker_sleeping, to_worker)
                replies = await receive(region, to_supervisor, len(batch))
                answers = [read_body(region, reply) for reply in replies]
                in_ring_order = [a for a in answers if not a.startswith(b"SLOT")]
                assert in_ring_order == [r.upper() for r in batch if not r.startswith(b"slot")]
                assert sorted(answers) == sorted(r.upper() for r in batch)
            region.event_ring.put_nowait(b"stop")
            wake_if_sleeping(region.worker_sleeping, to_worker)
            assert await proc.wait() == 0, errors.read_text()
        assert region.worker_pid == proc.pid
        assert all(b.state.name == "FREE" for b in region.arena.blocks())
        assert region.event_ring.is_empty() and region.request_ring.is_empty()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        to_worker.close()
        to_supervisor.close()


async def receive(region: Region, efd: EventFd, count: int) -> list[bytes]:
    """Supervisor side: collect ``count`` replies, sleeping on the eventfd between."""
    got: list[bytes] = []
    ring = region.request_ring
    while len(got) < count:
        got += ring.get_all_nowait()
        if len(got) < count:
            await wait_for_work(region.supervisor_sleeping, efd, lambda: not ring.is_empty())
    return got


def read_body(region: Region, reply: bytes) -> bytes:
    offset, length = map(int, reply.split())
    with region.arena.view(offset, length) as view:
        body = view.tobytes()
    region.arena.free(offset)
    return body


def test_released_arena_pages_leave_the_segment_and_the_arena_stays_usable(shm_name: str) -> None:
    """Arena.trim with the region's release_arena_pages: a free run's pages go back to the
    system (the segment's allocated blocks shrink), live bodies stay, and the run serves
    allocations again."""
    region = Region.create(shm_name, ring_bytes=4096, slots=16, arena_bytes=16 << 20)
    try:
        arena = region.arena
        offsets = [arena.alloc(8000) for _ in range(1500)]  # ~12 MB
        assert all(at is not None for at in offsets)
        for i, at in enumerate(offsets):
            arena.view(at, 8000)[:] = bytes([i % 200 + 1]) * 8000  # type: ignore[index]
        arena.trim(region.release_arena_pages, 1 << 20)  # the allocations are old news now
        for at in offsets[100:]:
            arena.free(at)  # type: ignore[arg-type]
        before = shm_path(shm_name).stat().st_blocks * 512
        assert arena.trim(region.release_arena_pages, 1 << 20) > 10 << 20
        after = shm_path(shm_name).stat().st_blocks * 512
        assert before - after > 10 << 20
        for i, at in enumerate(offsets[:100]):
            assert bytes(arena.view(at, 8000)) == bytes([i % 200 + 1]) * 8000  # type: ignore[arg-type]
        again = [arena.alloc(8000) for _ in range(1000)]
        assert all(at is not None for at in again)
    finally:
        region.close()
        region.unlink()
