"""A single-producer/single-consumer byte ring of length-prefixed records.

Theory of operation
-------------------
The ring lives entirely inside a caller-supplied writable buffer (a
``memoryview`` into an mmap shared by two processes, or a ``bytearray`` in
tests), so two :class:`Ring` objects over the same bytes -- one per process --
are the producer and the consumer. Layout::

    0    head: u64   total bytes ever written (only the producer stores it)
    64   tail: u64   total bytes ever read    (only the consumer stores it)
    128  data area   ``capacity`` bytes, used as a circle

Head and tail sit on separate 64-byte cache lines so the two sides do not
bounce one line between cores. Both only grow; ``head - tail`` is the number
of bytes in use and ``counter % capacity`` the position in the data area.

A record is a u32 little-endian payload length followed by the payload.
Records are packed back to back and a record may straddle the end of the data
area: both the length and the payload are then copied in two pieces (no skip
marker, so no space is wasted at the end).

A record of any size goes through (``put_many_nowait``): one bigger than a quarter
of the capacity is written as fragments of at most that size, each with the top
bit of its length set (``MORE``) but the last, as room frees up; the consumer
keeps the fragments it has read and hands the record over once the last is in.
(A pull of 128 dead-lettered messages whose headers are a few KiB each is a
record bigger than the smallest ring: written whole it could never fit.) The
producer remembers how far it got into a record (``_partial``, ``_sent``): the
next call must start with the same payload, as both users' outboxes do.

Publication order is what makes this safe without locks: the producer copies
the payload first and stores ``head`` last; the consumer reads ``head``
first, then the payload, then stores ``tail``. Each counter is one aligned
8-byte store through a ``'Q'`` memoryview (never ``struct.pack_into``, which
zeroes its destination first), and on x86-64 (TSO) stores become visible
in program order and loads are not reordered with other loads, so the
consumer never sees a head that covers bytes not yet written, and the
producer never overwrites bytes the consumer has not finished reading.

The ``*_nowait`` methods are the whole interface (trio's ``_channel.py``
shape): pure arithmetic over the buffer that raises :class:`RingFull` or
:class:`RingEmpty`. Waiting belongs to :mod:`ipc.wakeup`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

__all__ = [
    "HEADER_BYTES",
    "LENGTH_BYTES",
    "Ring",
    "RingCorrupt",
    "RingEmpty",
    "RingFull",
]

HEADER_BYTES: Final = 128
LENGTH_BYTES: Final = 4

_HEAD_OFFSET: Final = 0
_TAIL_OFFSET: Final = 64
# The counters are read and written through a memoryview cast to 'Q' (native
# order: little-endian on the x86-64 hosts this targets), never with struct:
# CPython's Struct.pack_into memsets its destination before writing the value,
# so a peer process could read a transient 0 (seen as a negative fill, or as
# room that is not there). Item assignment on a 'Q' view is one 8-byte copy.
_HEAD: Final = _HEAD_OFFSET // 8
_TAIL: Final = _TAIL_OFFSET // 8
_LEN = struct.Struct("<I")
# (Final: compiled, these are constants, not a module dictionary's items looked up per record.)
MORE: Final = 0x8000_0000  # in a length prefix: a fragment; the record goes on in the next one
_LENGTH_MASK: Final = 0x7FFF_FFFF  # the length itself: a record is at most 2 GiB - 1
_READ_CHUNK: Final = 32 << 10  # bytes get_all_nowait copies out of the ring at a time (at least a record)


class RingFull(Exception):
    """The record does not fit in the free space; nothing was written."""


class RingEmpty(Exception):
    """There is no record to read."""


class RingCorrupt(Exception):
    """The counters or a length prefix contradict each other (a peer wrote garbage)."""


def _byte_view(buf: memoryview | bytearray) -> memoryview:
    """A flat unsigned-byte view of ``buf``; an existing one is used as is so
    that whoever made it can release it (an mmap cannot close while views live)."""
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    if view.readonly:
        raise ValueError("a ring needs a writable buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


class Ring:
    """SPSC ring over ``buf``; ``init=True`` for the creator, ``False`` to attach."""

    __slots__ = ("_assembling", "_buf", "_capacity", "_counters", "_fragment", "_partial", "_sent")

    def __init__(self, buf: memoryview | bytearray, *, init: bool) -> None:
        view = _byte_view(buf)
        if len(view) <= HEADER_BYTES + LENGTH_BYTES:
            raise ValueError(f"a ring needs more than {HEADER_BYTES + LENGTH_BYTES} bytes")
        self._buf = view
        self._capacity = len(view) - HEADER_BYTES
        self._counters = view[:HEADER_BYTES].cast("Q")
        # Records bigger than this go in fragments of this size (module docstring).
        self._fragment = max(1, self._capacity // 4 - LENGTH_BYTES)
        self._partial: bytes | None = None  # producer: the record being written in fragments
        self._sent = 0  # producer: how much of it is written
        self._assembling: list[bytes] = []  # consumer: the fragments read of the next record
        if init:
            self.reset()

    def release(self) -> None:
        """Drop the counters' view (before the mapping under it is closed)."""
        self._counters.release()

    # ------------------------------------------------------------ counters

    @property
    def capacity(self) -> int:
        """Bytes in the data area (each record costs its payload plus 4)."""
        return self._capacity

    def _head(self) -> int:
        head: int = self._counters[_HEAD]
        return head

    def _tail(self) -> int:
        tail: int = self._counters[_TAIL]
        return tail

    def used(self) -> int:
        """Bytes written and not yet read (length prefixes included)."""
        return self._head() - self._tail()

    def free(self) -> int:
        """Bytes that can be written now (length prefixes included)."""
        return self._capacity - self.used()

    def is_empty(self) -> bool:
        return self._head() == self._tail()

    def reset(self) -> None:
        """Forget every record: head = tail = 0. Only while the peer is not running
        (at creation, or when a crashed peer is replaced). A record this side was writing
        or reading in fragments is forgotten too."""
        self._counters[_TAIL] = 0
        self._counters[_HEAD] = 0
        self._partial = None
        self._sent = 0
        self._assembling = []

    # ------------------------------------------------------------- producer

    def put_nowait(self, payload: bytes) -> None:
        """Append one record whole, or raise RingFull having written nothing (ValueError
        if it could never fit whole)."""
        self._check_size(payload)
        if self._partial is not None:
            raise ValueError("a record is being written in fragments (put_many_nowait)")
        head = self._head()
        if self._capacity - (head - self._tail()) < LENGTH_BYTES + len(payload):
            raise RingFull(f"{len(payload)}-byte record, {self.free()} bytes free")
        self._counters[_HEAD] = self._write_record(head, payload)

    def put_many_nowait(self, payloads: Sequence[bytes]) -> int:
        """Append as many records as fit, in order, publishing the head once.

        Returns how many were written whole (the first ``n`` of ``payloads``). A record
        bigger than a quarter of the capacity goes in fragments, as many as fit now; the
        next call must then start with the same payload, and goes on where this one
        stopped. The records and their length prefixes are joined and copied into the ring
        at once.
        """
        partial = self._partial
        if partial is not None and payloads and payloads[0] is not partial:
            raise ValueError("the record being written in fragments must come first")
        head = self._head()
        room = self._capacity - (head - self._tail())
        pack = _LEN.pack
        fragment = self._fragment
        parts: list[bytes | memoryview] = []
        written = 0
        for payload in payloads:
            size = len(payload)
            if size > fragment:
                if size > _LENGTH_MASK:
                    raise ValueError(f"a {size}-byte record is over the ring's 2 GiB limit")
                sent = self._sent if payload is partial else 0
                view = memoryview(payload)
                while sent < size:
                    n = min(fragment, size - sent)
                    if LENGTH_BYTES + n > room:
                        break
                    parts.append(pack(n if sent + n == size else n | MORE))
                    parts.append(view[sent : sent + n])
                    room -= LENGTH_BYTES + n
                    sent += n
                if sent < size:
                    self._partial, self._sent = payload, sent
                    break
                self._partial, self._sent = None, 0
                written += 1
                continue
            need = LENGTH_BYTES + size
            if need > room:
                break
            parts.append(pack(size))
            parts.append(payload)
            room -= need
            written += 1
        if parts:
            data = b"".join(parts)
            self._write_at(head, data)
            self._counters[_HEAD] = head + len(data)
        return written

    def _check_size(self, payload: bytes) -> None:
        if len(payload) > self._capacity - LENGTH_BYTES:
            raise ValueError(
                f"a {len(payload)}-byte record can never fit a ring of capacity "
                f"{self._capacity} (max {self._capacity - LENGTH_BYTES})"
            )

    def _write_record(self, head: int, payload: bytes) -> int:
        """Copy one record at ``head`` without publishing it; return the new head."""
        self._write_at(head, _LEN.pack(len(payload)))
        self._write_at(head + LENGTH_BYTES, payload)
        return head + LENGTH_BYTES + len(payload)

    def _write_at(self, counter: int, data: bytes) -> None:
        start = counter % self._capacity
        first = self._capacity - start
        at = HEADER_BYTES + start
        if len(data) <= first:
            self._buf[at : at + len(data)] = data
            return
        src = memoryview(data)
        self._buf[at : at + first] = src[:first]
        self._buf[HEADER_BYTES : HEADER_BYTES + len(data) - first] = src[first:]

    # ------------------------------------------------------------- consumer

    def get_nowait(self) -> bytes:
        """Remove and return the oldest record, or raise RingEmpty (also while only some
        fragments of it are in: those are kept)."""
        records = self.get_all_nowait(1)
        if not records:
            raise RingEmpty
        return records[0]

    def get_all_nowait(self, max_records: int | None = None) -> list[bytes]:
        """Remove and return every record present (at most ``max_records``),
        storing the tail once. An empty ring gives an empty list.

        The bytes in use are copied out a chunk (``_READ_CHUNK``, or one record
        bigger than that) at a time and the records sliced from the copy: two
        objects a record, where reading each length and each payload from the
        shared buffer made five. Fragments are kept until their record's last one is in."""
        tail = self._tail()
        available = self._head() - tail
        if not available:
            return []
        if available > self._capacity:
            raise RingCorrupt(f"{available} bytes in use in a ring of {self._capacity} "
                              f"(head {self._head()}, tail {tail})")
        limit = available if max_records is None else max_records
        unpack = _LEN.unpack_from
        records: list[bytes] = []
        assembling = self._assembling
        taken = 0  # bytes of the records taken so far
        while taken < available and len(records) < limit:
            left = available - taken
            if left < LENGTH_BYTES:
                raise RingCorrupt(f"{left} bytes left in use after the last whole record")
            size = left if left < _READ_CHUNK else _READ_CHUNK
            data = self._read_at(tail + taken, size)
            pos = 0
            while len(records) < limit and size - pos >= LENGTH_BYTES:
                (word,) = unpack(data, pos)
                length = word & _LENGTH_MASK
                end = pos + LENGTH_BYTES + length
                if end > size:
                    if taken + end > available:
                        raise RingCorrupt(f"record of {length} bytes but only "
                                          f"{available - taken - pos} in use")
                    if pos:
                        break  # it starts the next chunk
                    # One record bigger than a chunk: read it whole.
                    size = end
                    data = self._read_at(tail + taken, size)
                if word & MORE:
                    assembling.append(data[pos + LENGTH_BYTES : end])
                elif assembling:
                    assembling.append(data[pos + LENGTH_BYTES : end])
                    records.append(b"".join(assembling))
                    assembling.clear()
                else:
                    records.append(data[pos + LENGTH_BYTES : end])
                pos = end
            taken += pos
        self._counters[_TAIL] = tail + taken
        return records

    def _read_at(self, counter: int, length: int) -> bytes:
        start = counter % self._capacity
        at = HEADER_BYTES + start
        if start + length <= self._capacity:
            return self._buf[at : at + length].tobytes()
        first = self._capacity - start
        rest = length - first
        return (
            self._buf[at : at + first].tobytes()
            + self._buf[HEADER_BYTES : HEADER_BYTES + rest].tobytes()
        )
