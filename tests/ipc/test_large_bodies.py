"""Large bodies: a segment of their own, named by their arena block (ipc.arena, "Large bodies")."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipc import segment
from ipc.arena import HEADER_BYTES, BlockState
from ipc.region import Region, region_name, sweep_stale

SHM = Path("/dev/shm")
ARENA = 1 << 20  # large_body: 64 KiB


@pytest.fixture
def region() -> Iterator[Region]:
    name = region_name(f"{os.getpid()}-{uuid.uuid4().hex[:8]}", 0)
    created = Region.create(name, ring_bytes=4096, slots=8, arena_bytes=ARENA)
    try:
        yield created
    finally:
        created.close()
        created.unlink()
        assert not list(SHM.glob(name[1:] + "*"))


def _segments(region: Region) -> list[str]:
    return sorted(p.name for p in SHM.glob(region.name[1:] + ".b*"))


def test_a_body_over_a_sixteenth_of_the_arena_gets_its_own_segment(region: Region) -> None:
    """The arena keeps a small LARGE block; the body lives in the segment that block names."""
    arena = region.arena
    assert arena.large_body == ARENA // 16
    at = arena.alloc(3 * ARENA)  # bigger than the whole arena
    assert at is not None
    block = next(b for b in arena.blocks() if b.payload == at)
    assert block.state is BlockState.LARGE and block.size == 32
    assert _segments(region) == [f"{region.name[1:]}.b{at}"]
    assert arena.alloc(arena.large_body) is not None  # the limit itself stays in the arena
    assert len(_segments(region)) == 1


def test_another_process_sees_the_body_through_the_same_offset(region: Region) -> None:
    """A peer attached to the region reads the body by its block offset, as any other body."""
    size = ARENA + 12345
    at = region.arena.alloc(size)
    assert at is not None
    body = os.urandom(size)
    view = region.arena.view(at, size)
    view[:] = body
    view.release()
    with Region.attach(region.name) as peer:
        got = peer.arena.view(at, size)
        assert got == body
        with pytest.raises(ValueError):
            peer.arena.view(at, size + 1)
        got.release()


def test_freeing_the_block_unlinks_the_segment_and_the_offset_is_reused(region: Region) -> None:
    """Any process frees it; the segment's name is gone before the block can be taken again."""
    arena = region.arena
    at = arena.alloc(ARENA)
    assert at is not None
    with Region.attach(region.name) as supervisor_side:
        supervisor_side.arena.free(at)
    assert _segments(region) == []
    again = arena.alloc(2 * ARENA)
    assert again is not None
    arena.view(again, 2 * ARENA)[-4:] = b"tail"
    assert _segments(region) == [f"{region.name[1:]}.b{again}"]


def test_sweep_unlinks_unfinished_large_bodies_and_keeps_live_ones(region: Region) -> None:
    """A dead worker's blocks that no queue references are swept, their segments with them."""
    arena = region.arena
    live, dead = arena.alloc(ARENA), arena.alloc(ARENA)
    assert live is not None and dead is not None
    assert arena.sweep({live}) == 1
    assert _segments(region) == [f"{region.name[1:]}.b{live}"]


def test_a_crash_before_the_segment_exists_leaves_a_block_sweep_can_free(region: Region) -> None:
    """The block is marked LARGE before its segment is created: a LARGE block without a
    segment (the owner died in between) is freed without error."""
    arena = region.arena
    at = arena.alloc(ARENA)
    assert at is not None
    segment.unlink(arena.segment_name(at))
    assert arena.sweep(set()) == 1
    assert all(b.state is BlockState.FREE for b in arena.blocks())


def test_no_room_in_dev_shm_is_no_room_in_the_arena(region: Region, monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment /dev/shm cannot hold makes alloc() answer None (the publisher waits for
    room) and leaves neither a block nor a segment behind."""
    def full(name: str, size: int) -> None:
        raise segment.NoSpace(name)

    monkeypatch.setattr(segment, "create", full)
    assert region.arena.alloc(ARENA) is None
    assert all(b.state is BlockState.FREE for b in region.arena.blocks())
    assert _segments(region) == []


def test_unlinking_the_region_removes_its_large_bodies(region: Region) -> None:
    """At shutdown the region's unlink takes every segment of its arena with it."""
    for _ in range(3):
        assert region.arena.alloc(ARENA) is not None
    assert len(_segments(region)) == 3
    region.unlink()
    assert _segments(region) == []


def test_sweep_stale_removes_a_dead_instances_large_bodies() -> None:
    """Segments of a supervisor that is gone are swept at the next start, large ones too;
    a live instance's are kept."""
    prefix = f"shoaltest{uuid.uuid4().hex[:8]}."
    dead_pid = 2 ** 22 + 7  # above pid_max's default: no such process
    dead = f"/{prefix}{dead_pid}-0badcafe.w0"
    live = f"/{prefix}{os.getpid()}-0badcafe.w0"
    names = [dead, f"{dead}.b{HEADER_BYTES}", live, f"{live}.b{HEADER_BYTES}"]
    try:
        for name in names:
            segment.create(name, 4096)
        assert sweep_stale(prefix) == names[:2]
        assert [n for n in names if (SHM / n[1:]).exists()] == names[2:]
    finally:
        for name in names:
            segment.unlink(name)
