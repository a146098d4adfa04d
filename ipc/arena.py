"""The body arena: variable-size blocks in shared memory.

Theory of operation
-------------------
The arena is a run of blocks covering its whole buffer, each starting with a
16-byte header::

    0   size:  u64   the block's bytes, header included, a multiple of 16
    8   state: u8    FREE ('F') or USED ('U')
    9   padding

Every piece of allocator state is in those headers, in shared memory: there
is no free list. So a worker that crashes leaves a consistent arena behind
(each header change is one store, ordered so that a torn sequence only ever
leaves a block bigger or smaller than intended, never overlapping), and a
replacement worker attaches to it as it is.

Only the owning worker allocates. *Any* process frees, by storing FREE into
the block's state byte -- nothing else -- so freeing needs no message to the
owner. That is safe while the owner allocates concurrently because the two
never write the same byte: a free() only touches a USED block, and the
allocator only rewrites headers of FREE blocks (which nobody else writes,
since a FREE block becomes USED only through the allocator). The worst a
concurrent free can do is be missed by the scan in progress; the next one
sees it.

alloc() is next-fit from a rover (a process-local cursor, restarting at 0 on
attach): skip USED blocks, merge each run of FREE blocks into its first
block, take the first block big enough, split its tail off as a new FREE
block. One full lap without a fit means the arena is full; the caller applies
back-pressure and retries. Before roving, one cheap look at the first block:
if it is free and big enough, allocate there. In a publish -> consume
pipeline bodies are freed roughly in allocation order, so this keeps the
arena compact near its start instead of walking (and touching) every page.

Large bodies
------------
A body bigger than a sixteenth of the arena (``large_body``: 16 MiB of the
default 256 MiB) does not go into it: one such body would fragment the arena
and a few would fill it. It gets a shared-memory segment of its own
(ipc.segment), and the arena only a small LARGE block that stands for it::

    header (state 'L')   payload: size u64 -- the segment's bytes

The segment is named after that block (``<region name>.b<payload offset>``),
so the block's offset stays the body's whole handle: rings, queues and frees
carry it exactly as for a body in the arena, and :meth:`Arena.view` maps the
segment instead of slicing the arena. The owner marks the block LARGE
*before* creating the segment, and a free unlinks the segment *before* it
stores FREE, so a segment never outlives its block unnoticed and a reused
offset never meets its predecessor's segment: a crash at any point leaves a
LARGE block whose segment may or may not exist, which :meth:`Arena.sweep`
(a dead worker's unfinished publishes) and the region's unlink at shutdown
remove. An arena without a name (tests over a bytearray) has no segments and
refuses what it cannot hold.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Iterator
from enum import IntEnum
from typing import Final, NamedTuple

from ipc import segment

__all__ = ["ALIGN", "HEADER_BYTES", "LARGE_FRACTION", "Arena", "ArenaCorrupt", "Block", "BlockState"]

HEADER_BYTES: Final = 16
ALIGN: Final = 16
# How far allocation may run ahead before looking back at the start of the arena:
# keeps a steady pipeline in its first pages instead of cycling through all of them.
RECHECK_BYTES: Final = 1 << 20
# A body of more than capacity // LARGE_FRACTION bytes gets a segment of its own.
LARGE_FRACTION: Final = 16
# Arena.trim hands back the whole pages of a FREE run once they come to this much.
TRIM_MIN: Final = 64 << 10
PAGE: Final = mmap.PAGESIZE

_HEADER: Final = struct.Struct("<QB7x")
_SIZE: Final = struct.Struct("<Q")
_STATE_OFFSET: Final = 8


class BlockState(IntEnum):
    FREE = ord("F")
    USED = ord("U")
    LARGE = ord("L")  # in use; the body is in the block's own segment


_FREE: Final = BlockState.FREE.value
_USED: Final = BlockState.USED.value
_LARGE: Final = BlockState.LARGE.value


class ArenaCorrupt(Exception):
    """A block header is not one the allocator could have written."""


class Block(NamedTuple):
    """One block as seen by :meth:`Arena.blocks` (``offset`` is the header's)."""

    offset: int
    size: int
    state: BlockState

    @property
    def payload(self) -> int:
        return self.offset + HEADER_BYTES


def _byte_view(buf: memoryview | bytearray) -> memoryview:
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if view.readonly:
        raise ValueError("an arena needs a writable buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


class Arena:
    """Blocks over ``buf``; ``init=True`` (the creator) makes it one free block. ``name``
    (the region's segment name) lets bodies over ``large_body`` bytes have segments of
    their own; without it, an arena holds what fits it and refuses the rest."""

    __slots__ = ("_buf", "_busy_high", "_busy_low", "_capacity", "_name", "_recheck_at", "_rover",
                 "_spare_at", "_spare_size", "_trim_at", "_words", "large_body")

    def __init__(self, buf: memoryview | bytearray, *, init: bool, name: str | None = None) -> None:
        view = _byte_view(buf)
        capacity = len(view) - len(view) % ALIGN
        if capacity < HEADER_BYTES:
            raise ValueError(f"an arena needs at least {HEADER_BYTES} bytes")
        self._buf = view
        self._capacity = capacity
        self._words = view[:capacity].cast("Q")  # sizes, for trim()'s walk (headers are 8-aligned)
        self._rover = 0
        # The FREE run left by the last split: only this process allocates and
        # others only ever turn USED into FREE, so it stays free and can be
        # carved without reading headers. -1: unknown.
        self._spare_at = -1
        self._spare_size = 0
        self._recheck_at = 0  # past this offset, take the slow path (prefers the start)
        self._trim_at = 0  # the block trim() goes on from (a block boundary: see _coalesce)
        # The span allocated in since the last trim(), which leaves it be (it is in use).
        self._busy_low = capacity
        self._busy_high = 0
        self._name = name
        # Larger bodies get a segment (with a name) or are refused (without one).
        self.large_body = capacity // LARGE_FRACTION if name else capacity
        if init:
            self._write_header(0, capacity, _FREE)

    def release(self) -> None:
        """Let go of the views this arena made of its buffer (before the buffer is unmapped)."""
        self._words.release()

    @property
    def capacity(self) -> int:
        return self._capacity

    # ---------------------------------------------------------- allocation

    def alloc(self, n: int) -> int | None:
        """Reserve room for ``n`` payload bytes; return the payload offset, or
        None when no free run fits (the arena is full for now).

        Owning worker only. Raises ValueError if ``n`` could never fit. A body over
        ``large_body`` gets a segment of its own (None too when /dev/shm is full).
        """
        if n > self.large_body:
            return self._alloc_large(n)
        need = (n + HEADER_BYTES + ALIGN - 1) & -ALIGN
        at = self._spare_at
        if at >= 0 and at < self._recheck_at and n >= 0 and self._spare_size - need >= HEADER_BYTES:
            rest = self._spare_size - need
            self._write_header(at + need, rest, _FREE)  # first, as in _take
            self._write_header(at, need, _USED)
            self._spare_at = self._rover = at + need
            self._spare_size = rest
            if at < self._busy_low:
                self._busy_low = at
            if at + need > self._busy_high:
                self._busy_high = at + need
            return at + HEADER_BYTES
        self._spare_at = -1
        need = self._block_size(n)
        offset: int | None
        if self._rover != 0 and self._fits_at_start(need):
            offset = self._take(0, need)
        else:
            offset = self._next_fit(need)
        self._recheck_at = self._rover + min(RECHECK_BYTES, self._capacity // 128)
        return offset

    def _alloc_large(self, n: int) -> int | None:
        """A LARGE block for a body of ``n`` bytes and its segment (module docstring)."""
        if self._name is None:
            self._block_size(n)  # raises: it can never fit
        at = self.alloc(_SIZE.size)
        if at is None:
            return None
        _SIZE.pack_into(self._buf, at, n)
        self._buf[at - HEADER_BYTES + _STATE_OFFSET] = _LARGE  # first: sweep() finds it
        try:
            segment.create(self.segment_name(at), n)
        except BaseException as exc:
            self.free(at)  # and whatever part of the segment was made
            if isinstance(exc, segment.NoSpace):
                return None  # the caller waits for room, as for a full arena
            raise
        return at

    def segment_name(self, payload_offset: int) -> str:
        """The segment of the LARGE block at ``payload_offset``."""
        return f"{self._name}.b{payload_offset}"

    def _block_size(self, n: int) -> int:
        if n < 0:
            raise ValueError(f"negative allocation {n}")
        need = (n + HEADER_BYTES + ALIGN - 1) & -ALIGN
        if need > self._capacity:
            raise ValueError(f"{n} bytes can never fit an arena of {self._capacity}")
        return need

    def _fits_at_start(self, need: int) -> bool:
        size, state = self._header(0)
        return state == _FREE and self._coalesce(0, size) >= need

    def _next_fit(self, need: int) -> int | None:
        at = self._rover
        scanned = 0
        while scanned < self._capacity:
            size, state = self._header(at)
            if state == _FREE:
                size = self._coalesce(at, size)
                if size >= need:
                    return self._take(at, need)
            scanned += size
            at += size
            if at >= self._capacity:
                at = 0
        return None

    def _coalesce(self, at: int, size: int) -> int:
        """Merge the FREE blocks following the FREE block at ``at`` into it."""
        end = at + size
        while end < self._capacity:
            next_size, next_state = self._header(end)
            if next_state != _FREE:
                break
            if end == self._rover:  # its header is about to become payload
                self._rover = at
            if end == self._trim_at:
                self._trim_at = at
            end += next_size
        if end - at != size:
            _SIZE.pack_into(self._buf, at, end - at)
        return end - at

    def _take(self, at: int, need: int) -> int:
        """Mark the FREE block at ``at`` USED, splitting off what it does not need."""
        size = self._header(at)[0]
        rest = size - need
        if rest >= HEADER_BYTES:
            self._write_header(at + need, rest, _FREE)  # first: until the next
            size = need  # store the old, bigger FREE block still covers it
            self._spare_at, self._spare_size = at + need, rest
        self._write_header(at, size, _USED)
        self._rover = at + size if at + size < self._capacity else 0
        if at < self._busy_low:
            self._busy_low = at
        if at + size > self._busy_high:
            self._busy_high = at + size
        return at + HEADER_BYTES

    # ---------------------------------------------------------------- trim

    def trim(self, release: Callable[[int, int], object], steps: int) -> int:
        """Give memory back: look at up to ``steps`` blocks on from where the last call stopped
        (a call that reaches the end stops there; the next begins at the start), merge each
        run of FREE blocks into its first block, and hand the whole pages inside it past its
        header to ``release(offset, length)`` (the region punches them out of the segment:
        ``Region.release_arena_pages``) when they make TRIM_MIN bytes or more -- but not the
        span allocated in since the previous call, nor as much again past it (where the
        allocator goes next): memory the allocator is cycling through stays (giving it back
        would cost a zeroed page fault per page on its next use: 256 KiB bodies, 11 % more
        CPU), memory it left goes. Returns the bytes handed over. Owning worker only, as
        alloc(). A FREE run is one step whatever its size; a block in use is one step too
        (~70 ns compiled).

        Safe beside other processes' frees and reads for the reasons alloc() is: a FREE block
        is written by its owner only, a free() only stores into a USED block's header, and
        only a FREE run's inside (never a header that is still read) goes back; the allocator
        writes a header there before using it, onto a fresh zero page."""
        self._spare_at = -1  # its run may be merged here, which the fast path would not see
        keep_low, keep_high = self._busy_low, self._busy_high  # what stays (page-rounded out)
        if keep_high > keep_low:
            keep_low &= -PAGE
            keep_high = (2 * keep_high - keep_low + PAGE - 1) & -PAGE
        else:  # nothing allocated since the last call
            keep_low = keep_high = self._capacity
        self._busy_low, self._busy_high = self._capacity, 0
        at = self._trim_at
        released = 0
        buf, words, capacity = self._buf, self._words, self._capacity
        while steps > 0:
            steps -= 1
            size = words[at >> 3]  # the header's two fields, read as cheaply as they come
            state = buf[at + _STATE_OFFSET]
            if size < HEADER_BYTES or size % ALIGN or at + size > capacity:
                self._header(at)  # raises ArenaCorrupt, saying what is wrong
            if state == _FREE:
                size = self._coalesce(at, size)
                low = (at + HEADER_BYTES + PAGE - 1) & -PAGE
                high = (at + size) & -PAGE
                if high - low >= TRIM_MIN:
                    released += _release_outside(release, low, high, keep_low, keep_high)
            at += size
            if at >= self._capacity:
                at = 0
                break
        self._trim_at = at
        return released

    # ---------------------------------------------------------------- free

    def free(self, payload_offset: int) -> None:
        """Give a block back. Any process; one byte store, no round trip."""
        at = self._header_offset(payload_offset)
        state = self._buf[at + _STATE_OFFSET]
        if state != _USED:
            if state != _LARGE:
                raise ValueError(f"free of a block that is not in use at {payload_offset}")
            segment.unlink(self.segment_name(payload_offset))  # before the offset can be reused
        self._buf[at + _STATE_OFFSET] = _FREE

    def sweep(self, live: set[int]) -> int:
        """Free every USED block whose payload offset is not in ``live``; return
        how many. Only while no process allocates (a replaced worker is dead)."""
        count = 0
        for block in self.blocks():
            if block.state != BlockState.FREE and block.payload not in live:
                self.free(block.payload)
                count += 1
        return count

    # -------------------------------------------------------------- access

    def view(self, payload_offset: int, length: int) -> memoryview:
        """Zero-copy window on a USED block's first ``length`` payload bytes.
        Release it (``with`` or ``.release()``) before the region closes. A LARGE
        block's body is its segment, mapped for as long as the view lives."""
        at = self._header_offset(payload_offset)
        size, state = self._header(at)
        if state == _LARGE:
            return self._large_view(payload_offset, length)
        if state != _USED or not 0 <= length <= size - HEADER_BYTES:
            raise ValueError(
                f"no {length}-byte body at {payload_offset} (block of {size}, state {state})"
            )
        return self._buf[payload_offset : payload_offset + length]

    def _large_view(self, payload_offset: int, length: int) -> memoryview:
        body_size = _SIZE.unpack_from(self._buf, payload_offset)[0]
        if not 0 < length <= body_size:
            raise ValueError(f"no {length}-byte body at {payload_offset} (large, of {body_size})")
        return segment.open_view(self.segment_name(payload_offset), length)

    def blocks(self) -> Iterator[Block]:
        """Every block in address order (tests and debugging; racy while allocating)."""
        at = 0
        while at < self._capacity:
            size, state = self._header(at)
            yield Block(at, size, BlockState(state))
            at += size

    # ------------------------------------------------------------- headers

    def _header(self, at: int) -> tuple[int, int]:
        size, state = _HEADER.unpack_from(self._buf, at)
        if (
            size < HEADER_BYTES
            or size % ALIGN
            or at + size > self._capacity
            or (state != _FREE and state != _USED and state != _LARGE)
        ):
            raise ArenaCorrupt(f"block at {at}: size {size}, state {state}")
        return size, state

    def _write_header(self, at: int, size: int, state: int) -> None:
        _HEADER.pack_into(self._buf, at, size, state)

    def _header_offset(self, payload_offset: int) -> int:
        at = payload_offset - HEADER_BYTES
        if at < 0 or at % ALIGN or at >= self._capacity:
            raise ValueError(f"{payload_offset} is not a block payload offset")
        return at


def _release_outside(release: Callable[[int, int], object], low: int, high: int,
                     keep_low: int, keep_high: int) -> int:
    """Release the parts of [low, high) before ``keep_low`` and from ``keep_high`` on that
    make TRIM_MIN bytes or more (all four page multiples); returns the bytes released."""
    released = 0
    end = min(high, keep_low)
    if end - low >= TRIM_MIN:
        release(low, end - low)
        released += end - low
    start = max(low, keep_high)
    if high - start >= TRIM_MIN:
        release(start, high - start)
        released += high - start
    return released
