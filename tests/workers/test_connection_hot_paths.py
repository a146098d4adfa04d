"""AMQPConnection's hot paths: a basic.ack and a whole small publish each read in one step
(FrameBuffer.next_ack, next_publish), and big bodies received straight into their arena block
(place_bodies): each gives the events frame-by-frame reading gives, or declines."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, frame

from broker import errors
from tests.workers.connection_helpers import (
    assert_closing,
    body_frame,
    content_header,
    method,
    only_close,
    opened,
    publish,
    sent,
)
from workers.connection import AMQPConnection
from workers.connection_state import State
from workers.events import (
    AckReceived,
    MethodReceived,
    PublishReceived,
)

# -- the whole-publish fast path ---------------------------------------------


def _frame_by_frame(conn: AMQPConnection) -> AMQPConnection:
    conn._buffer.hot_paths = False
    return conn


def _comparable(events: list[Any]) -> list[Any]:
    return [
        (e.channel, e.exchange, e.routing_key, e.mandatory, bytes(e.header_payload), e.body_size,
         b"".join(bytes(c) for c in e.body)) if isinstance(e, PublishReceived)
        else (e.channel, e.method.name, sorted(vars(e.method).items())) if isinstance(e, MethodReceived)
        else _comparable([MethodReceived(e.channel, commands.Basic.Ack(e.delivery_tag, e.multiple))])[0]
        if isinstance(e, AckReceived)
        else e
        for e in events
    ]


# -- basic.ack on the hot path (FrameBuffer.next_ack) --------------------------------------

_ACK_STREAM = b"".join([
    method(1, commands.Basic.Ack(1)),
    method(2, commands.Basic.Ack(2**63 - 1, multiple=True)),
    publish(1, b"between"),
    method(1, commands.Basic.Ack(0, multiple=True)),
    method(2, commands.Basic.Nack(3)),  # not an ack: read frame by frame
    method(1, commands.Basic.Ack(4)),
])


def test_acks_on_the_hot_path_are_the_events_of_frame_by_frame_reading() -> None:
    """Each basic.ack comes out as an AckReceived saying what the frame-by-frame path's
    MethodReceived(Basic.Ack) says, in the same place among the other events."""
    fast, slow = opened(channels=(1, 2)), _frame_by_frame(opened(channels=(1, 2)))
    events = fast.receive_data(_ACK_STREAM)
    assert [e for e in events if isinstance(e, AckReceived)] == [
        AckReceived(1, 1, False), AckReceived(2, 2**63 - 1, True), AckReceived(1, 0, True),
        AckReceived(1, 4, False)]
    slow_events = slow.receive_data(_ACK_STREAM)
    assert not any(isinstance(e, AckReceived) for e in slow_events)
    assert _comparable(events) == _comparable(slow_events)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(_ACK_STREAM) - 1), max_size=6))
def test_acks_split_anywhere_give_the_same_events(cuts: list[int]) -> None:
    conn = opened(channels=(1, 2))
    events: list[Any] = []
    start = 0
    for cut in [*sorted(set(cuts)), len(_ACK_STREAM)]:
        events += conn.receive_data(_ACK_STREAM[start:cut])
        start = cut
    whole = opened(channels=(1, 2)).receive_data(_ACK_STREAM)
    assert _comparable(events) == _comparable(whole)


def test_an_ack_the_hot_path_declines_is_answered_as_frame_by_frame() -> None:
    """Inside a publish's content an ack is 505 on the hot path too; on a channel never opened
    it is 504; an ack whose payload is longer than its fields is read as any other ack."""
    conn = opened()
    conn.receive_data(method(1, commands.Basic.Publish(routing_key="q")) + content_header(1, 4)
                      + method(1, commands.Basic.Ack(1)))
    assert only_close(conn).reply_code == 505
    conn = opened()
    conn.receive_data(method(3, commands.Basic.Ack(1)))
    assert only_close(conn).reply_code == 504
    conn = opened()
    long_ack = frame.marshal(commands.Basic.Ack(5), 1)
    size = int.from_bytes(long_ack[3:7], "big")
    padded = long_ack[:3] + (size + 2).to_bytes(4, "big") + long_ack[7:-1] + b"\0\0" + long_ack[-1:]
    [event] = conn.receive_data(padded)
    assert isinstance(event, MethodReceived) and event.method.delivery_tag == 5


def test_an_ack_on_a_closing_channel_is_dropped() -> None:
    """After the server's channel.close only close and close-ok count (AMQP 0-9-1 §4.2.6)."""
    conn = opened(channels=(1, 2))
    conn.close_channel(1, 406, "PRECONDITION_FAILED - x")
    conn.data_to_send()
    assert conn.receive_data(method(1, commands.Basic.Ack(1)) + method(2, commands.Basic.Ack(2))) == [
        AckReceived(2, 2, False)]


def test_whole_publish_gives_the_events_of_frame_by_frame_reading() -> None:
    """Publishes taken three frames at a time are the same events, in the same
    order, as when each frame is read on its own — small, empty, multi-frame
    and interleaved with other methods and channels."""
    stream = b"".join([
        publish(1, b"small", exchange="amq.direct", routing_key="k", mandatory=True),
        publish(1, b""),
        method(2, commands.Basic.Ack(delivery_tag=0, multiple=True)),
        publish(2, b"x" * 10_000, frame_max=4096),
        method(1, commands.Basic.Publish(routing_key="h"))
        + content_header(1, 4, commands.Basic.Properties(headers={"h": 1}))
        + body_frame(1, b"last"),
    ])
    fast, slow = opened(channels=(1, 2)), _frame_by_frame(opened(channels=(1, 2)))
    assert _comparable(fast.receive_data(stream)) == _comparable(slow.receive_data(stream))
    assert len([e for e in fast.receive_data(publish(1, b"z")) if isinstance(e, PublishReceived)]) == 1


def test_whole_publish_split_anywhere_gives_the_same_events() -> None:
    """A publish cut at any byte still comes out once and whole."""
    stream = publish(1, b"payload") * 2
    for cut in range(1, len(stream)):
        conn = opened()
        events = conn.receive_data(stream[:cut]) + conn.receive_data(stream[cut:])
        bodies = [b"".join(bytes(c) for c in e.body) for e in events if isinstance(e, PublishReceived)]
        assert bodies == [b"payload", b"payload"], cut


def test_whole_publish_declines_what_frame_by_frame_must_refuse() -> None:
    """An oversize body still gets 406 and an immediate publish 540: the fast
    path never answers differently from the frame-by-frame path."""
    conn = opened(max_body_size=3)
    conn.receive_data(publish(1, b"toolong"))
    assert any(isinstance(m, commands.Channel.Close) and m.reply_code == 406 for _, m in sent(conn))
    conn = opened()
    conn.receive_data(publish(1, b"x", immediate=True))
    assert only_close(conn).reply_code == 540


def test_a_big_body_received_into_its_frame_gives_the_same_events() -> None:
    """The worker receives the rest of a big body frame straight into the buffer the frame is
    assembled in (``receive_room`` / ``received_into``): the same publishes come out as when
    every read is handed over as bytes."""
    stream = publish(1, bytes(range(256)) * 1000, frame_max=131072) + publish(1, b"small")
    plain = opened()
    expected = _comparable(plain.receive_data(stream))
    direct = opened()
    events: list[Any] = []
    pos, into = 0, 0
    while pos < len(stream):
        room = direct.receive_room()
        if room is None:
            events += direct.receive_data(stream[pos : pos + 50_000])
            pos += 50_000
        else:
            size = min(len(room), 30_000)
            room[:size] = stream[pos : pos + size]
            events += direct.received_into(size)
            pos, into = pos + size, into + size
    assert into > 0  # the rest of the first body's frames went in directly
    assert _comparable(events) == expected
    assert len([e for e in events if isinstance(e, PublishReceived)]) == 2


# -- big bodies received where they are stored (place_bodies) ----------------


class _Placer:
    """A stand-in for the worker's arena: ``place`` takes a block of ``memory`` for a big
    publish and writes its header there (as ConnectionHandler.place_body does), ``release``
    frees one; what is live, what was freed and what was refused are kept to look at."""

    def __init__(self, refuse: int = 0) -> None:
        self.memory = bytearray(4 << 20)
        self.top = 0
        self.live: dict[int, int] = {}  # offset -> block size
        self.released: list[int] = []
        self.refuse = refuse  # how many place() calls to answer None first

    def place(self, header: bytes, body_size: int) -> tuple[memoryview, int, int] | None:
        if self.refuse:
            self.refuse -= 1
            return None
        offset, size = self.top, len(header) + body_size
        self.top += size
        self.live[offset] = size
        self.memory[offset : offset + len(header)] = header
        view = memoryview(self.memory)[offset : offset + size]
        return view[len(header) :], offset, len(header)

    def release(self, offset: int) -> None:
        del self.live[offset]
        self.released.append(offset)

    def body(self, event: PublishReceived) -> bytes:
        """A placed publish's body, read from its block (and its header checked there)."""
        start = event.placed + event.placed_header
        assert bytes(self.memory[event.placed : start]) == event.header_payload
        return bytes(self.memory[start : start + event.body_size])


def _placing(placer: _Placer, **kwargs: Any) -> AMQPConnection:
    conn = opened(**kwargs)
    conn.place_bodies(placer.place, placer.release)
    return conn


def _feed(conn: AMQPConnection, stream: bytes, sizes: list[int]) -> tuple[list[Any], int]:
    """Feed ``stream`` as the worker's reader does: into ``receive_room`` when there is one,
    else as bytes; read sizes cycle through ``sizes``. The events, and the octets that went
    straight into a room."""
    events: list[Any] = []
    pos = into = k = 0
    while pos < len(stream):
        want = sizes[k % len(sizes)]
        k += 1
        room = conn.receive_room()
        if room is None:
            events += conn.receive_data(stream[pos : pos + want])
            pos += want
        else:
            size = min(len(room), want)
            room[:size] = stream[pos : pos + size]
            events += conn.received_into(size)
            pos, into = pos + size, into + size
    return events, into


def test_a_big_body_goes_straight_into_its_block() -> None:
    """A body of at least PLACE_MIN octets is assembled in the block ``place`` gave when its
    content header came: the publish names that block (``placed``), carries no chunks, the
    block holds the header and every body octet, and most of them were received straight
    into it. Small publishes around it are unchanged."""
    big = bytes(range(256)) * 1000  # 256,000 octets: two full body frames and a short one
    stream = publish(1, b"before") + publish(1, big, routing_key="k") + publish(1, b"after")
    placer = _Placer()
    events, into = _feed(_placing(placer), stream, [50_000])
    publishes = [e for e in events if isinstance(e, PublishReceived)]
    assert [p.body_size for p in publishes] == [6, len(big), 5]
    small1, placed, small2 = publishes
    assert small1.placed == small2.placed == -1
    assert b"".join(bytes(c) for c in small2.body) == b"after"
    assert placed.placed == 0 and placed.body == [] and placed.routing_key == "k"
    assert placer.body(placed) == big
    assert into > len(big) // 2
    assert placer.released == []  # the block is the publish's now


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(st.lists(st.integers(1, 70_000), min_size=1, max_size=20))
def test_placed_bodies_split_anywhere_come_out_whole(sizes: list[int]) -> None:
    """However the reads cut the stream (into rooms or as bytes), each big body lands whole in
    its own block and the publishes come out as when nothing is placed."""
    bodies = [bytes([n]) * 40_000 + bytes(range(256)) * (n * 300) for n in range(1, 4)]
    stream = b"".join(publish(1, body, frame_max=65536) for body in bodies) + publish(1, b"z")
    expected = _comparable(opened(frame_max=65536).receive_data(stream))
    placer = _Placer()
    events, _ = _feed(_placing(placer, frame_max=65536), stream, sizes)
    got = [e for e in events if isinstance(e, PublishReceived)]
    assert [placer.body(e) for e in got[:3]] == bodies
    assert [e.placed for e in got] == [*sorted(placer.live), -1]  # a block each, in order
    unplaced = [e._replace(body=[placer.body(e)]) if e.placed >= 0 else e for e in got]
    assert _comparable(unplaced) == [e for e in expected if isinstance(e, tuple)]


def test_a_body_that_cannot_be_placed_is_assembled_as_before() -> None:
    """When ``place`` answers None (the arena is full, publishers are blocked) the body is
    assembled in pieces, as without placing."""
    big = b"q" * 100_000
    placer = _Placer(refuse=1)
    events, _ = _feed(_placing(placer), publish(1, big), [30_000])
    [event] = [e for e in events if isinstance(e, PublishReceived)]
    assert event.placed == -1 and b"".join(bytes(c) for c in event.body) == big
    assert placer.live == {}


def test_a_closed_connection_frees_the_block_of_a_body_half_here() -> None:
    """A connection that ends mid-body (a method between two body frames: 505, then close-ok)
    frees the block its publish had."""
    placer = _Placer()
    conn = _placing(placer)
    stream = publish(1, b"b" * 200_000)  # body frames of 131,064 and 68,936 octets
    first_frame_end = len(stream) - (68_936 + 8)
    _feed(conn, stream[:first_frame_end], [60_000])
    assert list(placer.live) == [0]
    conn.receive_data(method(1, commands.Basic.Qos(prefetch_count=1)))
    assert_closing(conn, 505, "UNEXPECTED_FRAME - expected content body, got non content body "
                   "frame instead", 60, 40)
    conn.receive_data(method(0, commands.Connection.CloseOk()))
    assert conn.state is State.CLOSED and placer.released == [0] and placer.live == {}


def test_release_bodies_frees_what_the_runtime_abandons() -> None:
    """The socket went (the protocol never saw a close): ``release_bodies`` frees the block,
    and a room handed out before no longer points into it."""
    placer = _Placer()
    conn = _placing(placer)
    stream = publish(1, b"c" * 100_000)
    _feed(conn, stream[:60_000], [60_000])
    room = conn.receive_room()
    assert room is not None
    conn.release_bodies()
    assert placer.released == [0]
    again = conn.receive_room()
    assert again is not None and again.obj is not placer.memory


def test_a_channel_closed_by_the_server_mid_body_frees_the_block_and_stops_writing_it() -> None:
    """The server closes the channel (an error on an earlier publish, say) while a body frame
    is being received into its block: the block is freed at once, the rest of that frame goes
    elsewhere (the freed block may be someone else's by then), and the channel discards it."""
    placer = _Placer()
    conn = _placing(placer)
    stream = publish(1, b"d" * 100_000) + publish(1, b"e" * 100_000)
    events, _ = _feed(conn, stream[:60_000], [60_000])
    conn.handle_error(errors.NotFound("no exchange 'x' in vhost '/'", 60, 40), 1)
    assert placer.released == [0]
    before = bytes(placer.memory[:200_000])
    events, _ = _feed(conn, stream[60_000:], [30_000])
    assert bytes(placer.memory[:200_000]) == before  # nothing written there after the free
    assert not [e for e in events if isinstance(e, PublishReceived)]  # the channel is closing
    assert placer.live == {}
