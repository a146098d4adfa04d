from __future__ import annotations

import random

import pytest

from ipc.arena import HEADER_BYTES, PAGE, TRIM_MIN, Arena, ArenaCorrupt, BlockState

F, U = BlockState.FREE, BlockState.USED


def layout(arena: Arena) -> list[tuple[int, int, BlockState]]:
    return [(b.offset, b.size, b.state) for b in arena.blocks()]


def test_init_makes_one_free_block_covering_the_arena() -> None:
    """A fresh arena is a single FREE block as big as the (16-aligned) buffer."""
    arena = Arena(bytearray(1000), init=True)
    assert arena.capacity == 992
    assert layout(arena) == [(0, 992, F)]


def test_alloc_splits_and_returns_the_payload_offset() -> None:
    """alloc(n) takes a 16-aligned block of n + header bytes, returns the offset just
    past the header, and leaves the rest as a FREE block."""
    arena = Arena(bytearray(256), init=True)
    a = arena.alloc(10)
    b = arena.alloc(16)
    assert (a, b) == (HEADER_BYTES, 32 + HEADER_BYTES)
    assert layout(arena) == [(0, 32, U), (32, 32, U), (64, 192, F)]


def test_zero_byte_alloc_takes_a_header_only_block() -> None:
    """An empty body still gets its own block (16 bytes: the header)."""
    arena = Arena(bytearray(64), init=True)
    assert arena.alloc(0) == HEADER_BYTES
    assert layout(arena) == [(0, 16, U), (16, 48, F)]


def test_view_is_zero_copy_and_bounded_by_the_block() -> None:
    """view() writes through to the buffer and refuses to reach past its block."""
    buf = bytearray(256)
    arena = Arena(buf, init=True)
    at = arena.alloc(5)
    assert at is not None
    arena.view(at, 5)[:] = b"hello"
    assert buf[at : at + 5] == b"hello"
    with pytest.raises(ValueError):
        arena.view(at, 17)  # block is 32 bytes: 16 of payload
    arena.free(at)
    with pytest.raises(ValueError):
        arena.view(at, 5)


def test_free_only_writes_the_state_byte() -> None:
    """free() changes the block's state byte and no other byte of the arena."""
    buf = bytearray(128)
    arena = Arena(buf, init=True)
    at = arena.alloc(20)
    assert at is not None
    before = bytearray(buf)
    arena.free(at)
    changed = [i for i in range(len(buf)) if buf[i] != before[i]]
    assert changed == [at - HEADER_BYTES + 8]


def test_double_free_and_wild_offsets_are_rejected() -> None:
    """Freeing a FREE block or an offset that is not a payload raises ValueError."""
    arena = Arena(bytearray(128), init=True)
    at = arena.alloc(8)
    assert at is not None
    arena.free(at)
    with pytest.raises(ValueError):
        arena.free(at)
    with pytest.raises(ValueError):
        arena.free(at + 3)
    with pytest.raises(ValueError):
        arena.free(0)


def test_consecutive_free_blocks_coalesce_to_fit_a_bigger_alloc() -> None:
    """A run of FREE blocks is merged into one when an allocation needs the room."""
    arena = Arena(bytearray(96), init=True)
    blocks = [arena.alloc(16) for _ in range(3)]  # 3 x 32 = all 96 bytes
    assert arena.alloc(0) is None
    for at in blocks:
        assert at is not None
        arena.free(at)
    big = arena.alloc(96 - HEADER_BYTES)  # needs all three blocks merged
    assert big == HEADER_BYTES
    assert layout(arena) == [(0, 96, U)]


def test_full_arena_returns_none_after_one_lap() -> None:
    """With no free run big enough anywhere, alloc returns None and changes nothing;
    a request that fits a hole still succeeds."""
    arena = Arena(bytearray(128), init=True)
    a, b, c = (arena.alloc(16) for _ in range(3))  # 3 x 32, 32 left at the end
    assert a is not None and b is not None and c is not None
    arena.free(b)  # a 32-byte hole
    before = layout(arena)
    assert arena.alloc(40) is None  # needs 64
    assert layout(arena) == before
    assert arena.alloc(16) is not None


def test_alloc_larger_than_the_arena_is_a_value_error() -> None:
    """A request that could never fit raises ValueError instead of returning None."""
    arena = Arena(bytearray(128), init=True)
    with pytest.raises(ValueError):
        arena.alloc(128 - HEADER_BYTES + 1)
    assert arena.alloc(128 - HEADER_BYTES) == HEADER_BYTES


def test_next_fit_wraps_to_the_start() -> None:
    """A rover that finds no fit before the end wraps to the start and finds the
    hole there (the first block being USED, the start shortcut does not apply)."""
    arena = Arena(bytearray(192), init=True)
    _a, b, c, _d, _e = (arena.alloc(16) for _ in range(5))  # 5 x 32; a 32-byte tail
    assert b is not None and c is not None
    arena.free(b)
    arena.free(c)  # a 64-byte hole behind the rover
    assert arena.alloc(40) == b  # needs 64: not the tail, the merged hole
    assert layout(arena)[-1] == (160, 32, F)


def test_rover_continues_past_the_last_allocation() -> None:
    """Next-fit: a hole behind the rover is not reused while space lies ahead."""
    arena = Arena(bytearray(512), init=True)
    a = arena.alloc(16)
    b = arena.alloc(16)
    assert a is not None and b is not None
    arena.free(b)
    c = arena.alloc(16)
    assert c == b + 32  # the hole at b is behind the rover


def test_returns_to_the_start_when_the_first_block_is_free_and_big_enough() -> None:
    """If the first block is free and fits, alloc goes back there instead of roving on,
    keeping a publish-then-consume pipeline in the low pages."""
    arena = Arena(bytearray(4096), init=True)
    a = arena.alloc(40)
    b = arena.alloc(40)
    assert a is not None and b is not None
    arena.free(a)
    assert arena.alloc(40) == a
    arena.free(a)
    assert arena.alloc(100) == b + 64  # the first block is free but too small: rove on


def test_pipeline_stays_compact() -> None:
    """Allocating and freeing in FIFO order with a few bodies in flight never uses
    more than the first few blocks of a large arena."""
    arena = Arena(bytearray(1 << 16), init=True)
    in_flight: list[int] = []
    highest = 0
    for _ in range(1000):
        at = arena.alloc(100)
        assert at is not None
        highest = max(highest, at)
        in_flight.append(at)
        if len(in_flight) > 3:
            arena.free(in_flight.pop(0))
    assert highest < 8 * 128


def test_coalescing_over_the_rover_keeps_allocations_valid() -> None:
    """Merging a free run that swallows the rover's block never hands out
    overlapping blocks, and every block stays well-formed."""
    arena = Arena(bytearray(1024), init=True)
    live: dict[int, bytes] = {}
    sizes = [1, 30, 7, 100, 0, 64, 15, 200, 33]
    for i in range(2000):
        n = sizes[i % len(sizes)]
        at = arena.alloc(n)
        if at is None:
            victim = sorted(live)[(i * 7) % len(live)]
            assert arena.view(victim, len(live[victim])).tobytes() == live[victim]
            arena.free(victim)
            del live[victim]
            continue
        data = bytes([i % 256]) * n
        arena.view(at, n)[:] = data
        live[at] = data
        if i % 3 == 0:
            arena.free(at)
            del live[at]
    for at, data in live.items():
        assert arena.view(at, len(data)).tobytes() == data
    total = sum(b.size for b in arena.blocks())
    assert total == arena.capacity


def test_rover_swallowed_by_a_merge_moves_to_the_merged_block() -> None:
    """When a merge absorbs the block the rover points at, the rover moves to the merged
    block's start, so the next allocation is a real block, not a stale header."""
    arena = Arena(bytearray(192), init=True)
    _a, b, c, *_ = (arena.alloc(16) for _ in range(6))  # full; rover wrapped to 0
    assert b is not None and c is not None
    arena.free(b)
    arena.free(c)
    x = arena.alloc(16)  # takes b's place, splits c's block off; rover -> c's block
    assert x == b
    arena.free(x)
    assert arena.alloc(80) is None  # the lap merges b + c: the rover's block is swallowed
    y = arena.alloc(16)
    used = {blk.payload for blk in arena.blocks() if blk.state == U}
    assert y in used


def test_sweep_frees_used_blocks_not_in_live() -> None:
    """sweep(live) frees exactly the USED blocks whose payload is not live, and counts them."""
    arena = Arena(bytearray(512), init=True)
    offsets = [arena.alloc(10) for _ in range(5)]
    assert all(o is not None for o in offsets)
    a, b, _c, d, _e = (o for o in offsets if o is not None)
    arena.free(b)
    assert arena.sweep({a, d}) == 2  # c and e
    used = {blk.payload for blk in arena.blocks() if blk.state == U}
    assert used == {a, d}
    assert arena.sweep({a, d}) == 0


def test_free_from_another_arena_object_is_seen_by_the_allocator() -> None:
    """A block freed through a second Arena over the same bytes (another process)
    is reusable by the owner, which keeps no free-list of its own."""
    buf = bytearray(96)
    owner = Arena(memoryview(buf), init=True)
    other = Arena(memoryview(buf), init=False)
    blocks = [owner.alloc(16) for _ in range(3)]
    assert owner.alloc(16) is None
    middle = blocks[1]
    assert middle is not None
    other.free(middle)
    assert owner.alloc(16) == middle


def test_attach_reads_the_blocks_left_by_the_creator() -> None:
    """init=False keeps existing blocks (a replacement worker inherits the arena)."""
    buf = bytearray(256)
    first = Arena(buf, init=True)
    at = first.alloc(20)
    second = Arena(buf, init=False)
    assert layout(second) == layout(first)
    assert at is not None
    second.free(at)
    assert [b.state for b in first.blocks()] == [F, F]


def test_corrupt_header_is_detected() -> None:
    """A header with an impossible size or state raises ArenaCorrupt, not a hang."""
    buf = bytearray(128)
    arena = Arena(buf, init=True)
    buf[0:8] = (0).to_bytes(8, "little")
    with pytest.raises(ArenaCorrupt):
        arena.alloc(8)


# ------------------------------------------------------------------ trim


class Punch:
    """A release callback over a bytearray arena: zeroes what it is given, as MADV_REMOVE
    leaves a punched page, and records it."""

    def __init__(self, buf: bytearray) -> None:
        self.buf = buf
        self.given: list[tuple[int, int]] = []

    def __call__(self, offset: int, length: int) -> None:
        self.buf[offset : offset + length] = bytes(length)
        self.given.append((offset, length))


def test_trim_gives_back_only_whole_pages_inside_free_runs_and_keeps_every_block() -> None:
    buf = bytearray(1 << 20)
    arena = Arena(buf, init=True)
    offsets = [arena.alloc(200) for _ in range(4000)]
    assert all(at is not None for at in offsets)
    data = {at: bytes([i % 251]) * 200 for i, at in enumerate(offsets) if at is not None}
    for at, body in data.items():
        arena.view(at, 200)[:] = body
    for at in offsets[500:1500]:  # one long free run (~216 KiB) in the middle
        assert at is not None
        arena.free(at)
        del data[at]
    free_runs_before = {(b.offset, b.offset + b.size) for b in arena.blocks() if b.state == F}
    punch = Punch(buf)
    arena.trim(punch, 1 << 30)  # the first leaves the span just allocated in ...
    punch.given.clear()
    given = arena.trim(punch, 1 << 30)  # ... which the next gives back
    assert given == sum(length for _, length in punch.given) > 0
    assert any(offset < offsets[1500] for offset, _ in punch.given)  # type: ignore[operator]
    runs = [(b.offset, b.offset + b.size) for b in arena.blocks() if b.state == F]
    for offset, length in punch.given:
        assert offset % PAGE == 0 and length % PAGE == 0 and length >= TRIM_MIN
        assert any(start + HEADER_BYTES <= offset and offset + length <= end for start, end in runs)
    assert len(runs) <= len(free_runs_before)  # merged, never split
    for at, body in data.items():  # nothing in use was touched
        assert arena.view(at, 200).tobytes() == body
    assert sum(b.size for b in arena.blocks()) == arena.capacity
    refill = [arena.alloc(200) for _ in range(1000)]  # the punched pages take blocks again
    for i, at in enumerate(refill):
        assert at is not None
        arena.view(at, 200)[:] = bytes([i % 7]) * 200
    for i, at in enumerate(refill):
        assert at is not None and arena.view(at, 200).tobytes() == bytes([i % 7]) * 200


def test_trim_in_slices_beside_allocation_and_frees_never_reads_a_punched_header() -> None:
    """Small trim budgets leave the cursor inside runs the allocator later merges (and
    carves); every block stays well-formed and every live body intact."""
    rnd = random.Random(11)
    buf = bytearray(1 << 20)
    arena = Arena(buf, init=True)
    punch = Punch(buf)
    live: dict[int, bytes] = {}
    for i in range(30_000):
        roll = rnd.random()
        if roll < 0.5:
            n = rnd.choice([0, 30, 200, 1000, 9000, 40_000])
            at = arena.alloc(n)
            if at is not None:
                body = bytes([i % 253]) * n
                arena.view(at, n)[:] = body
                live[at] = body
        elif roll < 0.95 and live:
            at = rnd.choice(list(live))
            arena.free(at)
            del live[at]
        else:
            arena.trim(punch, rnd.choice([1, 2, 5, 20, 1000]))
    assert punch.given  # it did give pages back on the way
    for at, body in live.items():
        assert arena.view(at, len(body)).tobytes() == body
    assert sum(b.size for b in arena.blocks()) == arena.capacity


def test_trim_of_an_arena_in_use_gives_nothing_back() -> None:
    buf = bytearray(1 << 20)
    arena = Arena(buf, init=True)
    while arena.alloc(1000) is not None:
        pass
    punch = Punch(buf)
    assert arena.trim(punch, 1 << 30) == 0 and punch.given == []


def test_trim_forgets_the_spare_run_it_may_merge_past() -> None:
    """alloc()'s fast path carves the run left by its last split without reading headers;
    after a trim merged that run with the block behind it (whose header went with the
    punched pages), the next alloc must read the merged header instead."""
    buf = bytearray(1 << 20)
    arena = Arena(buf, init=True)
    a, b = arena.alloc(200_000), arena.alloc(200_000)
    c = arena.alloc(arena.capacity - 2 * (200_000 + HEADER_BYTES) - HEADER_BYTES)  # the rest
    assert a is not None and b is not None and c is not None
    arena.trim(Punch(buf), 1 << 30)  # the allocations so far are old news for the next trim
    arena.free(a)
    first = arena.alloc(100)  # takes a's place: the rest of a's block is the spare run
    assert first == a
    arena.free(b)  # the block right behind the spare run
    punch = Punch(buf)
    assert arena.trim(punch, 1 << 30) > 0
    for _ in range(3):
        assert arena.alloc(100) is not None
    assert sum(blk.size for blk in arena.blocks()) == arena.capacity


def test_trim_leaves_the_span_the_allocator_is_cycling_through() -> None:
    """Runs the allocator used since the previous trim are in use in all but name (a
    pipeline's blocks come and go there): giving them back would only make it fault fresh
    zero pages; a run it has left goes at the next trim."""
    buf = bytearray(1 << 20)
    arena = Arena(buf, init=True)
    punch = Punch(buf)
    arena.trim(punch, 1 << 30)  # an empty arena: its one run goes
    punch.given.clear()
    span = 0
    for _ in range(50):  # a pipeline: blocks come and go near the start
        at = arena.alloc(8000)
        assert at is not None
        span = max(span, at + 8000)
        arena.free(at)
    arena.trim(punch, 1 << 30)
    assert punch.given and all(offset >= span for offset, _ in punch.given)
    arena.trim(punch, 1 << 30)  # it stopped: the rest of the run goes
    assert any(offset < span for offset, _ in punch.given[1:])
