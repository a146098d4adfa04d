"""Split the bytes a client sends into AMQP 0-9-1 frames.

Modelled on h2's ``frame_buffer``: a frame is parsed only once all of it is
here, its size is checked against the negotiated maximum as soon as its 7-byte
header is (so a peer can never make us buffer more than one frame), and the
bytes of complete frames are handed out as zero-copy ``memoryview`` slices of
a buffer that is never written again, which stay valid however long the caller
keeps them.

A large frame that arrives in pieces (a 128 KiB body frame comes in tens of
socket reads) is assembled in a ``bytearray`` of exactly its size, allocated
once its header is here: each piece is copied once, where growing a buffer
piece by piece copied the frame again at every reallocation. What came after
the frame in the read that completed it is parsed next (``_rest``). A big body
frame whose publish is assembled where it will be stored goes instead into
the view ``sink`` gives (an arena block): received there, never copied.

Frame layout (AMQP 0-9-1 §2.3.5, §4.2.3)::

    type:octet  channel:short  size:long  payload:size octets  frame-end:0xCE
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Final

from broker.errors import (
    FrameError,  # malformed frames: connection.close 501 FRAME_ERROR
)

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
PROTOCOL_HEADER_SIZE: Final = 8

FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE
FRAME_HEADER_SIZE: Final = 7
# 7 octets of header plus the frame-end octet.
FRAME_OVERHEAD: Final = 8
# AMQP 0-9-1 §4.2.3: frame-min-size; also the limit before tuning completes.
FRAME_MIN_SIZE: Final = 4096

_KNOWN_TYPES: Final = frozenset((FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT))
_FRAME_HEADER: Final = struct.Struct(">BHI")
_unpack_header = _FRAME_HEADER.unpack_from
_BODY_SIZE: Final = struct.Struct(">Q")
_PUBLISH_IDS: Final = b"\x00\x3c\x00\x28"  # basic.publish: class 60, method 40
_PUBLISH_MIN: Final = 9  # ids, ticket, two empty short strings, bits
_HEADER_MIN: Final = 14  # class, weight, body size, property flags
# A frame at least this long that is not all here yet is assembled in its own buffer.
_BIG_FRAME: Final = 8192
# basic.ack as a client sends it: type 1, channel, size 13, class 60, method 80, delivery tag,
# bits, frame end (21 octets).
_ACK_FRAME: Final = struct.Struct(">BHIHHQBB")
_ACK_SIZE: Final = _ACK_FRAME.size


class Frame:
    """One complete frame; ``payload`` excludes the header and frame-end octets. A plain class
    (compiled, its attributes are C fields)."""

    __slots__ = ("channel", "payload", "type")

    def __init__(self, type: int, channel: int, payload: memoryview) -> None:
        self.type = type
        self.channel = channel
        self.payload = payload

    def __repr__(self) -> str:
        return f"Frame(type={self.type}, channel={self.channel}, payload={bytes(self.payload)!r})"


class FrameBuffer:
    """Accumulates received bytes and yields complete frames.

    ``add_data`` then iterate.  Iteration stops when the rest of the input is
    an incomplete frame; that tail is kept for the next ``add_data``.
    """

    def __init__(self, frame_max: int = FRAME_MIN_SIZE) -> None:
        self.frame_max = frame_max
        # The hot paths, next_publish and next_ack; False: they always decline (every frame is
        # read on its own; tests compare both).
        self.hot_paths = True
        # Bytes being parsed (immutable, so payload views of it stay valid).
        self._data: bytes | bytearray | memoryview = b""
        self._view = memoryview(self._data)
        self._pos = 0
        # An incomplete frame waiting for more bytes, and how many it needs.
        self._pending = bytearray()
        self._needed = 0
        # A big incomplete frame: its buffer (exactly its size) and how much of it is here.
        self._frame: bytearray | None = None
        self._filled = 0
        # What followed a big frame in the read that completed it; parsed after the frame.
        self._rest: memoryview | None = None
        # Body frames received in place: ``sink(channel, payload size)`` gives the view (of
        # the arena block its publish is assembled in) a big body frame's payload goes to, or
        # None. While one is coming: that view, and how much of it is here.
        self.sink: Callable[[int, int], memoryview | None] | None = None
        self._placed: memoryview | None = None
        self._placed_filled = 0
        self._placed_channel = 0

    def add_data(self, data: bytes) -> None:
        """Append received bytes."""
        if self._pos < len(self._data) or self._rest is not None:
            # The caller stopped iterating early: keep what it did not read.
            self._pending += self._view[self._pos :]
            if self._rest is not None:
                self._pending += self._rest
                self._rest = None
            self._needed = 0
            self._set_data(b"")
        placed = self._placed
        if placed is not None:
            filled, size = self._placed_filled, len(data)
            missing = len(placed) - filled
            if missing:
                take = size if size < missing else missing
                placed[filled : filled + take] = memoryview(data)[:take]
                self._placed_filled = filled + take
                if size == take:
                    return
                data = bytes(data) if type(data) is not bytes else data
                self._set_data(memoryview(data)[take:])
                return
        frame = self._frame
        if frame is not None:
            filled, size = self._filled, len(data)
            missing = len(frame) - filled
            if size < missing:
                frame[filled : filled + size] = data
                self._filled = filled + size
                return
            if type(data) is not bytes:
                data = bytes(data)
            view = memoryview(data)
            frame[filled:] = view[:missing]
            self._frame = None
            self._set_data(frame)  # never written again: payload views of it stay valid
            if size > missing:
                self._rest = view[missing:]
            return
        if self._pending:
            if self._head_from(data):
                return
            self._pending += data
            if len(self._pending) < self._needed:
                self._set_data(b"")
                return
            data = bytes(self._pending)
            self._pending.clear()
        self._set_data(data if type(data) is bytes else bytes(data))

    def _head_from(self, data: bytes) -> bool:
        """The incomplete small frame waiting (``_pending``) completed from the start of
        ``data`` into a bytes of its own, parsed first, then the rest of ``data`` in place
        (``_rest``); False where that does not apply (too little came, a big frame, the
        protocol header), for add_data to join them. A client pipelining small frames ends
        most reads partway through one: the read is then not copied (it was twice)."""
        pending = self._pending
        needed = self._needed
        here = len(pending)
        if needed == FRAME_HEADER_SIZE and here + len(data) >= needed:  # the size is in sight
            size = _unpack_header(bytes(pending) + bytes(data[: needed - here]))[2]
            needed = FRAME_OVERHEAD + size if size < _BIG_FRAME else 0
        take = needed - here
        if needed < FRAME_OVERHEAD or needed >= _BIG_FRAME or take > len(data):
            return False
        view = memoryview(data if type(data) is bytes else bytes(data))
        pending += view[:take]
        head = bytes(pending)
        pending.clear()
        self._set_data(head)  # never written again: payload views of it stay valid
        if take < len(view):
            self._rest = view[take:]
        return True

    def big_frame_room(self) -> memoryview | None:
        """Where the rest of a big frame being assembled goes, to receive it there directly
        (``socket.recv_into``: no bytes object, no copy out of it); None unless one is. A
        body frame's payload being received in place goes where ``sink`` said."""
        placed = self._placed
        if placed is not None:
            filled = self._placed_filled
            return placed[filled:] if filled < len(placed) else None
        frame = self._frame
        if frame is None or self._rest is not None or self._pos < len(self._data):
            return None
        return memoryview(frame)[self._filled :]

    def unplace(self, room: memoryview) -> None:
        """``room`` (a view ``sink`` gave) is no longer to be written: its publish was dropped
        and its block freed. The rest of the frame being received into it, if any, goes to a
        scratch buffer instead, and the frame is then read as usual (its channel discards it)."""
        if self._placed is room:
            self._placed = memoryview(bytearray(len(room)))

    def big_frame_filled(self, size: int, tail: bytes = b"") -> None:
        """``size`` bytes were received into :meth:`big_frame_room`, and ``tail`` after them
        in the same read (only once the room is full): what follows the frame."""
        if self._placed is not None:
            self._placed_filled += size
            if tail:
                self.add_data(tail)
            return
        frame = self._frame
        assert frame is not None
        self._filled += size
        if self._filled == len(frame):
            self._frame = None
            self._set_data(frame)  # never written again: payload views of it stay valid
            if tail:
                self._rest = memoryview(tail)

    def read_protocol_header(self) -> bytes | None:
        """The 8-byte protocol header, once all of it has arrived (§4.2.2)."""
        if len(self._data) - self._pos < PROTOCOL_HEADER_SIZE:
            self._stash(PROTOCOL_HEADER_SIZE)
            return None
        start = self._pos
        self._pos += PROTOCOL_HEADER_SIZE
        return bytes(self._data[start : self._pos])

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None until more bytes arrive.

        Raises FrameError for an unknown frame type, a frame larger than
        ``frame_max`` or a bad frame-end octet.
        """
        pos = self._pos
        if self._placed is not None:
            return self._placed_frame()
        if len(self._data) - pos < FRAME_HEADER_SIZE:
            if self._to_rest():
                return self.next_frame()
            self._stash(FRAME_HEADER_SIZE)
            return None
        frame_type, channel, size = _unpack_header(self._data, pos)
        if size > self.frame_max or frame_type not in _KNOWN_TYPES or frame_type == FRAME_HEARTBEAT:
            self._check_header(frame_type, size)
        end = pos + FRAME_HEADER_SIZE + size
        if end >= len(self._data):
            if frame_type == FRAME_BODY and size >= _BIG_FRAME and self.sink is not None:
                room = self.sink(channel, size)
                if room is not None:
                    self._place(room, channel, pos + FRAME_HEADER_SIZE)
                    return None
            self._stash(end + 1 - pos)
            return None
        if self._data[end] != FRAME_END:
            raise FrameError(f"type {frame_type}, invalid frame end marker {self._data[end]}")
        self._pos = end + 1
        return Frame(frame_type, channel, self._view[pos + FRAME_HEADER_SIZE : end])

    def _place(self, room: memoryview, channel: int, payload_at: int) -> None:
        """Receive the rest of a big body frame into ``room``, what of it is here copied."""
        here = self._view[payload_at:]
        room[: len(here)] = here
        self._placed = room
        self._placed_filled = len(here)
        self._placed_channel = channel
        self._set_data(b"")

    def _placed_frame(self) -> Frame | None:
        """The body frame received in place, once its payload and frame-end octet are here:
        its payload is the view ``sink`` gave (the assembler sees its bytes are in place)."""
        placed = self._placed
        assert placed is not None
        pos = self._pos
        if self._placed_filled < len(placed) or pos >= len(self._data):
            return None
        if self._data[pos] != FRAME_END:
            raise FrameError(f"type {FRAME_BODY}, invalid frame end marker {self._data[pos]}")
        self._pos = pos + 1
        self._placed = None
        return Frame(FRAME_BODY, self._placed_channel, placed)

    def next_publish(self) -> tuple[int, memoryview, memoryview, memoryview, int] | None:
        """A whole small publish at the read position, or None.

        The hot path: when a basic.publish method frame, its content header
        and at most one body frame holding the whole body are all here,
        well-formed and on one channel, return ``(channel, method payload,
        header payload, body, end)`` without moving the read position (the
        caller calls ``skip_to(end)`` once it accepts them). Anything else —
        incomplete, malformed, split bodies — is None, and is then read frame
        by frame with every check and error of ``next_frame``.
        """
        if not self.hot_paths or self._placed is not None:
            return None
        data, pos = self._data, self._pos
        if len(data) - pos < 2 * FRAME_OVERHEAD + _PUBLISH_MIN:
            if self._to_rest():
                return self.next_publish()
            return None
        kind, channel, size = _unpack_header(data, pos)
        if kind != FRAME_METHOD or size > self.frame_max or data[pos + 7 : pos + 11] != _PUBLISH_IDS:
            return None
        end1 = pos + FRAME_HEADER_SIZE + size  # the method frame's frame-end octet
        if end1 + FRAME_OVERHEAD + _HEADER_MIN >= len(data) or data[end1] != FRAME_END:
            return None
        kind, ch, size = _unpack_header(data, end1 + 1)
        header_at = end1 + 1 + FRAME_HEADER_SIZE
        if kind != FRAME_HEADER or ch != channel or size > self.frame_max or size < _HEADER_MIN:
            return None
        end2 = header_at + size
        if end2 >= len(data) or data[end2] != FRAME_END or data[header_at : header_at + 2] != b"\x00\x3c":
            return None
        body_size = _BODY_SIZE.unpack_from(data, header_at + 4)[0]
        view = self._view
        if not body_size:
            return channel, view[pos + 7 : end1], view[header_at:end2], view[end2:end2], end2 + 1
        if end2 + FRAME_OVERHEAD >= len(data):
            return None
        kind, ch, size = _unpack_header(data, end2 + 1)
        if kind != FRAME_BODY or ch != channel or size != body_size or size > self.frame_max:
            return None
        end3 = end2 + FRAME_OVERHEAD + size
        if end3 >= len(data) or data[end3] != FRAME_END:
            return None
        return channel, view[pos + 7 : end1], view[header_at:end2], view[end2 + 8 : end3], end3 + 1

    def next_ack(self) -> tuple[int, int, bool, int] | None:
        """A basic.ack method frame at the read position, whole, or None.

        The consumer's hot path (a consumer acking each message sends one per delivery): the
        frame as every client sends it (a 13-octet payload, frame end in place) gives
        ``(channel, delivery tag, multiple, end)`` without a ``Frame`` or a decoded method, and
        without moving the read position (the caller calls ``skip_to(end)`` once it accepts
        it). Anything else is None, and is read by ``next_frame`` with its every check.
        """
        if not self.hot_paths or self._placed is not None:
            return None
        data, pos = self._data, self._pos
        if len(data) - pos < _ACK_SIZE or data[pos] != FRAME_METHOD:
            return None
        _, channel, size, class_id, method_id, tag, bits, end = _ACK_FRAME.unpack_from(data, pos)
        if size != 13 or class_id != 60 or method_id != 80 or end != FRAME_END or not channel:
            return None
        return channel, tag, bool(bits & 1), pos + _ACK_SIZE

    def skip_to(self, end: int) -> None:
        """Consume everything before ``end`` (an offset ``next_publish`` or ``next_ack``
        returned)."""
        self._pos = end

    def __iter__(self) -> Iterator[Frame]:
        while (frame := self.next_frame()) is not None:
            yield frame

    def _check_header(self, frame_type: int, size: int) -> None:
        if frame_type not in _KNOWN_TYPES:
            raise FrameError(f"unknown frame type {frame_type}")
        if frame_type == FRAME_HEARTBEAT and size:
            raise FrameError(f"heartbeat frame with a {size}-octet payload")
        # RabbitMQ tolerates payloads up to frame_max (not frame_max - 8):
        # "quite a few [clients] get it wrong" (rabbit_reader FRAME_SIZE_FUDGE).
        if size > self.frame_max:
            raise FrameError(
                f"type {frame_type}, frame too large: payload of {size} octets, "
                f"negotiated frame_max is {self.frame_max}"
            )

    def _to_rest(self) -> bool:
        """Once a big frame's buffer is read to its end, go on to what followed it."""
        if self._rest is None or self._pos != len(self._data):
            return False
        self._set_data(self._rest)
        self._rest = None
        return True

    def _set_data(self, data: bytes | bytearray | memoryview) -> None:
        self._data = data
        self._view = memoryview(data)
        self._pos = 0

    def _stash(self, needed: int) -> None:
        """Keep the unparsed tail until ``needed`` bytes of it are here."""
        if needed >= _BIG_FRAME and not self._pending:
            tail = self._view[self._pos :]
            frame = self._frame = bytearray(needed)
            frame[: len(tail)] = tail
            self._filled = len(tail)
        elif self._pos < len(self._data):
            self._pending += self._view[self._pos :]
        self._needed = needed
        self._set_data(b"")
