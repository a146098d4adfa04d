from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body, commands, frame, header

from workers.frame_buffer import (
    FRAME_BODY,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    FrameBuffer,
    FrameError,
)


def _frames(buffer: FrameBuffer) -> list[tuple[int, int, bytes]]:
    return [(f.type, f.channel, bytes(f.payload)) for f in buffer]


def _body_frame(channel: int, data: bytes) -> bytes:
    return frame.marshal(body.ContentBody(data), channel)


def test_complete_frames_are_yielded_in_order() -> None:
    """Every complete frame in the input comes out, in order, with its channel."""
    buffer = FrameBuffer(frame_max=4096)
    buffer.add_data(_body_frame(1, b"one") + _body_frame(7, b"two"))
    assert _frames(buffer) == [(FRAME_BODY, 1, b"one"), (FRAME_BODY, 7, b"two")]


def test_a_partial_frame_waits_for_the_rest() -> None:
    """A frame is parsed only once all of it, frame-end included, has arrived."""
    data = frame.marshal(commands.Basic.Qos(prefetch_count=5), 3)
    buffer = FrameBuffer()
    buffer.add_data(data[:-1])
    assert _frames(buffer) == []
    buffer.add_data(data[-1:])
    assert _frames(buffer) == [(FRAME_METHOD, 3, data[7:-1])]


def test_one_byte_at_a_time() -> None:
    """Frames split at every byte boundary reassemble exactly."""
    data = _body_frame(1, b"abc") + _body_frame(2, b"") + _body_frame(3, b"xyz" * 100)
    buffer = FrameBuffer()
    seen = []
    for i in range(len(data)):
        buffer.add_data(data[i : i + 1])
        seen += _frames(buffer)
    assert seen == [(FRAME_BODY, 1, b"abc"), (FRAME_BODY, 2, b""), (FRAME_BODY, 3, b"xyz" * 100)]


def test_payloads_stay_valid_after_more_data() -> None:
    """A payload handed out is not overwritten by later input (it may be kept)."""
    buffer = FrameBuffer()
    buffer.add_data(_body_frame(1, b"first") + _body_frame(1, b"sec"))
    kept = [f.payload for f in buffer]
    buffer.add_data(_body_frame(1, b"ond") + _body_frame(1, b"third")[:5])
    kept += [f.payload for f in buffer]
    buffer.add_data(_body_frame(1, b"third")[5:])
    kept += [f.payload for f in buffer]
    assert [bytes(p) for p in kept] == [b"first", b"sec", b"ond", b"third"]


def test_leftover_is_kept_when_iteration_stops_early() -> None:
    """Frames not read before the next add_data are still yielded, in order."""
    big = _body_frame(1, b"a" * 1000)
    buffer = FrameBuffer()
    buffer.add_data(big[:10])  # an incomplete frame that needs 1008 octets
    assert buffer.next_frame() is None
    buffer.add_data(big[10:] + _body_frame(1, b"b"))
    first = buffer.next_frame()
    assert first is not None and bytes(first.payload) == b"a" * 1000
    buffer.add_data(_body_frame(1, b"c"))
    assert [bytes(f.payload) for f in buffer] == [b"b", b"c"]


def test_bad_frame_end_is_a_frame_error() -> None:
    """The frame-end octet must be 0xCE, else 501 FRAME_ERROR."""
    data = bytearray(_body_frame(1, b"abc"))
    data[-1] = 0x00
    buffer = FrameBuffer()
    buffer.add_data(bytes(data))
    with pytest.raises(FrameError) as info:
        list(buffer)
    assert info.value.reply_code == 501


def test_frame_over_frame_max_is_rejected_from_its_header() -> None:
    """A frame larger than frame_max is a 501 as soon as its header arrives."""
    buffer = FrameBuffer(frame_max=4096)
    buffer.add_data(bytes([FRAME_BODY, 0, 1, 0, 0, 0x10, 0x01]))  # payload 4097, no payload yet
    with pytest.raises(FrameError):
        buffer.next_frame()


def test_frame_of_exactly_frame_max_payload_is_accepted() -> None:
    """RabbitMQ tolerates a payload of frame_max octets (its FRAME_SIZE_FUDGE)."""
    buffer = FrameBuffer(frame_max=4096)
    buffer.add_data(_body_frame(1, b"x" * 4096))
    assert len(_frames(buffer)[0][2]) == 4096


def test_unknown_frame_type_is_a_frame_error() -> None:
    """Frame types other than method, header, body and heartbeat are 501."""
    buffer = FrameBuffer()
    buffer.add_data(bytes([4, 0, 1, 0, 0, 0, 0, 0xCE]))
    with pytest.raises(FrameError):
        buffer.next_frame()


def test_heartbeat_with_payload_is_a_frame_error() -> None:
    """A heartbeat frame has an empty payload."""
    buffer = FrameBuffer()
    buffer.add_data(bytes([8, 0, 0, 0, 0, 0, 1, 0, 0xCE]))
    with pytest.raises(FrameError):
        buffer.next_frame()


def test_protocol_header_waits_for_eight_bytes() -> None:
    """Before the handshake the buffer reads the 8-byte protocol header, then frames."""
    buffer = FrameBuffer()
    buffer.add_data(PROTOCOL_HEADER[:5])
    assert buffer.read_protocol_header() is None
    buffer.add_data(PROTOCOL_HEADER[5:] + _body_frame(1, b"z"))
    assert buffer.read_protocol_header() == PROTOCOL_HEADER
    assert _frames(buffer) == [(FRAME_BODY, 1, b"z")]


# -- big frames, assembled in a buffer of their own ----------------------------------------


def _big_stream() -> tuple[bytes, list[tuple[int, int, bytes]]]:
    big1, big2 = bytes(range(256)) * 400, b"z" * 30_000  # 102,400 and 30,000 octets
    expected = [(FRAME_BODY, 1, b"small"), (FRAME_BODY, 2, big1), (FRAME_BODY, 1, b"after"),
                (FRAME_BODY, 3, big2), (FRAME_BODY, 3, b"")]
    return b"".join(_body_frame(ch, payload) for _, ch, payload in expected), expected


@pytest.mark.parametrize("direct", [False, True], ids=["add_data", "big_frame_room"])
@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(st.lists(st.integers(1, 40_000), min_size=1, max_size=30))
def test_big_frames_split_anywhere_reassemble_exactly(direct: bool, sizes: list[int]) -> None:
    """However the reads cut the stream, every frame comes out once, whole, in order, and the
    payloads handed out stay valid while more data arrives; also when the rest of a big frame
    is received straight into ``big_frame_room`` (as the worker's ``recv_into`` does)."""
    data, expected = _big_stream()
    buffer = FrameBuffer(131072)
    kept = []
    pos, k = 0, 0
    while pos < len(data):
        size = sizes[k % len(sizes)]
        room = buffer.big_frame_room() if direct else None
        if room is None:
            buffer.add_data(data[pos : pos + size])
        else:
            size = min(size, len(room))
            room[:size] = data[pos : pos + size]
            buffer.big_frame_filled(size)
        kept += [(f.type, f.channel, f.payload) for f in buffer]
        pos, k = pos + size, k + 1
    assert [(t, c, bytes(p)) for t, c, p in kept] == expected


def test_what_follows_a_big_frame_is_kept_when_iteration_stops_early() -> None:
    data, expected = _big_stream()
    buffer = FrameBuffer(131072)
    buffer.add_data(data[:20_000])  # "small", then part of the 102,400-octet frame
    assert [bytes(f.payload) for f in buffer] == [b"small"]
    cut = len(data) - 10
    buffer.add_data(data[20_000:cut])  # completes it, and brings the rest but the last frame's end
    first = buffer.next_frame()
    assert first is not None and bytes(first.payload) == expected[1][2]
    buffer.add_data(data[cut:])  # iteration stopped after one frame: the rest must not be lost
    assert [(f.type, f.channel, bytes(f.payload)) for f in buffer] == expected[2:]


def test_a_big_frame_then_a_whole_publish_in_the_same_read() -> None:
    """The publish fast path also reads what followed a big frame."""
    publish = (frame.marshal(commands.Basic.Publish(exchange="", routing_key="q"), 1)
               + frame.marshal(header.ContentHeader(0, 3, commands.Basic.Properties()), 1)
               + _body_frame(1, b"abc"))
    big = _body_frame(2, b"b" * 50_000)
    buffer = FrameBuffer(131072)
    buffer.add_data(big[:1000])
    assert buffer.next_publish() is None and buffer.next_frame() is None
    buffer.add_data(big[1000:] + publish)
    assert buffer.next_publish() is None
    got = buffer.next_frame()
    assert got is not None and len(got.payload) == 50_000
    whole = buffer.next_publish()
    assert whole is not None
    channel, _, _head, payload, end = whole
    assert (channel, bytes(payload)) == (1, b"abc")
    buffer.skip_to(end)
    assert buffer.next_frame() is None


def test_a_big_frames_room_is_what_it_lacks() -> None:
    """The room is the missing part of a big frame being assembled, and nothing else: no room
    for small frames, nor while bytes that came with the frame's end are left to read."""
    data, expected = _big_stream()
    buffer = FrameBuffer(131072)
    assert buffer.big_frame_room() is None
    buffer.add_data(data[:20_000])  # "small", then the first part of the 102,400-octet frame
    assert buffer.big_frame_room() is None  # "small" is not read yet
    assert [bytes(f.payload) for f in buffer] == [b"small"]
    room = buffer.big_frame_room()
    frame_end = len(expected[0][2]) + 8 + len(expected[1][2]) + 8
    assert room is not None and len(room) == frame_end - 20_000
    room[:] = data[20_000:frame_end]
    buffer.big_frame_filled(len(room))
    assert buffer.big_frame_room() is None
    first = buffer.next_frame()
    assert first is not None and bytes(first.payload) == expected[1][2]


def test_a_placed_body_frame_is_received_into_the_sinks_view_and_checked_for_its_end() -> None:
    """``sink`` gives the view a big body frame's payload goes to: what of it came with the
    header is copied there, the rest is the room, the frame's payload is that very view, and
    a wrong frame-end octet after it is still a frame error."""
    payload = bytes(range(256)) * 100  # 25,600 octets
    data = _body_frame(5, payload)
    target = bytearray(len(payload))
    asked: list[tuple[int, int]] = []

    def sink(channel: int, size: int) -> memoryview | None:
        asked.append((channel, size))
        return memoryview(target)

    buffer = FrameBuffer(131072)
    buffer.sink = sink
    buffer.add_data(data[:1000])
    assert buffer.next_frame() is None and asked == [(5, len(payload))]
    room = buffer.big_frame_room()
    assert room is not None and len(room) == len(payload) - (1000 - 7)
    room[:] = data[1000:-1]
    buffer.big_frame_filled(len(room))
    assert buffer.big_frame_room() is None and buffer.next_frame() is None  # its end is not here
    buffer.add_data(data[-1:] + _body_frame(5, b"next"))
    placed = buffer.next_frame()
    assert placed is not None and placed.channel == 5 and placed.payload.obj is target
    assert bytes(target) == payload
    after = buffer.next_frame()
    assert after is not None and bytes(after.payload) == b"next"

    bad = FrameBuffer(131072)
    bad.sink = sink
    bad.add_data(data[:-1] + b"\x00")
    with pytest.raises(FrameError, match="invalid frame end marker"):
        bad.next_frame()


def test_small_body_frames_and_other_frames_are_never_offered_to_the_sink() -> None:
    """Only body frames of at least 8 KiB that are not all here yet go to ``sink``."""
    asked: list[int] = []
    buffer = FrameBuffer(131072)
    buffer.sink = lambda channel, size: asked.append(size)  # type: ignore[assignment,func-returns-value]
    buffer.add_data(_body_frame(1, b"s" * 100)[:50])  # a small body frame, not all here
    assert list(buffer) == []
    buffer2 = FrameBuffer(131072)
    buffer2.sink = buffer.sink
    buffer2.add_data(frame.marshal(commands.Basic.Publish(routing_key="x" * 200), 1)[:20])
    assert list(buffer2) == []
    whole = _body_frame(1, b"w" * 20_000)
    buffer3 = FrameBuffer(131072)
    buffer3.sink = buffer.sink
    buffer3.add_data(whole)  # a big body frame all here: read in place as any other
    assert [len(f.payload) for f in buffer3] == [20_000]
    assert asked == []


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=12),
       sizes=st.lists(st.integers(min_value=0, max_value=9000), min_size=1, max_size=30))
def test_small_frames_split_anywhere_come_out_whole_and_in_order(
        cuts: list[int], sizes: list[int]) -> None:
    """A frame a read ends partway through is completed from the next read (into a buffer
    of its own; the rest of that read is parsed where it is): every frame comes out, in
    order, whatever the reads' sizes, small and big frames mixed."""
    stream = b"".join(_body_frame(n % 5 + 1, bytes([n % 251]) * size) for n, size in enumerate(sizes))
    buffer = FrameBuffer(frame_max=16384)
    got: list[tuple[int, int, bytes]] = []
    pos = 0
    for cut in cuts * (len(stream) // max(1, sum(cuts)) + 1):
        if pos >= len(stream):
            break
        buffer.add_data(stream[pos : pos + cut])
        pos += cut
        got += _frames(buffer)
    if pos < len(stream):
        buffer.add_data(stream[pos:])
        got += _frames(buffer)
    assert got == [(FRAME_BODY, n % 5 + 1, bytes([n % 251]) * size) for n, size in enumerate(sizes)]


def test_a_read_that_completes_a_small_frame_is_not_copied() -> None:
    """Pipelined small frames end most reads partway through one: the next read completes
    it, and the frames after it are views of that read's bytes (no copy of the read)."""
    frames = b"".join(_body_frame(1, b"x%03d" % n) for n in range(100))
    buffer = FrameBuffer(frame_max=4096)
    buffer.add_data(frames[:1000])
    first = _frames(buffer)
    second_read = frames[1000:]
    buffer.add_data(second_read)
    rest = list(buffer)
    assert bytes(rest[0].payload) == b"x%03d" % len(first)  # the frame split across both
    assert rest[0].payload.obj is not second_read
    assert all(f.payload.obj is second_read for f in rest[1:])
    assert [bytes(f.payload) for f in rest] == [b"x%03d" % n for n in range(len(first), 100)]
