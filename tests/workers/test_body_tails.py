"""Big body frames received into their arena block together with what follows them (the
worker's reader on a plain socket: ``recvmsg_into`` with the frame's room and a small second
buffer, ``AMQPConnection.received_into(size, tail)``): the same publishes come out as when
every read is handed over as bytes, each big body whole in its own block, however the reads
cut the stream, and a block is freed when its publish is abandoned mid-body."""

from __future__ import annotations

import functools
import socket
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body, commands, frame, header

from ipc import records as r
from ipc.arena import Arena, BlockState
from tests.workers.connection_helpers import assert_closing, method, opened, publish
from tests.workers.helpers import Harness
from tests.workers.test_connection_hot_paths import _comparable, _Placer, _placing
from workers.connection import AMQPConnection
from workers.connection_state import State
from workers.events import PublishReceived
from workers.frame_buffer import FRAME_BODY, FrameBuffer
from workers.socket_reader import PublishGates, SocketReader


def _feed_with_tails(conn: AMQPConnection, stream: bytes, sizes: list[int], head: int
                     ) -> tuple[list[Any], int, int]:
    """Feed ``stream`` as the worker's reader does on a plain socket: a read into a room takes
    up to ``head`` octets more after it (handed over as the tail), other reads are bytes; read
    sizes cycle through ``sizes`` (what the socket had), and a plain read right after a room
    read asks no more than ``head``. The events, the octets that went straight into a room,
    and the reads that brought a tail."""
    events: list[Any] = []
    pos = into = tails = k = 0
    after_room = False
    while pos < len(stream):
        have = sizes[k % len(sizes)]
        k += 1
        room = conn.receive_room()
        if room is None:
            take = min(have, head) if after_room else have
            events += conn.receive_data(stream[pos : pos + take])
            pos, after_room = pos + take, False
            continue
        after_room = True
        size = min(len(room) + head, have, len(stream) - pos)
        filled = min(size, len(room))
        room[:filled] = stream[pos : pos + filled]
        tail = stream[pos + filled : pos + size]
        events += conn.received_into(filled, tail) if tail else conn.received_into(filled)
        pos, into, tails = pos + size, into + filled, tails + bool(tail)
    return events, into, tails


def _bodies_and_rest(placer: _Placer, events: list[Any]) -> tuple[list[bytes], list[Any]]:
    got = [e for e in events if isinstance(e, PublishReceived)]
    whole = [e._replace(body=[placer.body(e)]) if e.placed >= 0 else e for e in got]
    return [b"".join(bytes(c) for c in e.body) for e in whole], _comparable(whole)


def test_a_stream_of_256_kib_bodies_goes_into_blocks_with_the_next_frames_as_tails() -> None:
    """The shape of S6: each body's frames are received into its block, what follows a frame
    (its frame end, the next frame's header and a few hundred octets of its payload) comes
    with it, and only those few hundred octets a frame are copied."""
    bodies = [bytes([n]) * (256 << 10) for n in range(1, 5)]
    stream = b"".join(publish(1, body, frame_max=131072) for body in bodies)
    placer = _Placer()
    conn = _placing(placer, frame_max=131072)
    events, into, tails = _feed_with_tails(conn, stream, [64 << 10] + [1 << 20] * 20, 1024)
    got, _ = _bodies_and_rest(placer, events)
    assert got == bodies
    # Copied: the first read (64 KiB, before anything is placed), then a head's worth a frame.
    assert into >= len(b"".join(bodies)) - (64 << 10) - 8 * 1024
    assert tails >= 7  # each frame's read but the last brought what follows it
    assert len(placer.live) == 4


@settings(max_examples=60, derandomize=True, database=None, deadline=None)
@given(st.lists(st.integers(1, 70_000), min_size=1, max_size=12), st.sampled_from([1, 7, 8, 9, 300, 1024]))
def test_tails_of_any_size_after_reads_cut_anywhere_give_the_same_publishes(sizes: list[int], head: int) -> None:
    """Reads cut anywhere (1-octet ones too) and tails of any size, from a lone frame-end octet
    up: the publishes, small ones between big ones included, are those of plain reads."""
    bodies = [bytes([n]) * 40_000 + bytes(range(256)) * (n * 300) for n in range(1, 4)]
    stream = b"".join(publish(1, body, frame_max=65536) + publish(1, b"s%d" % n)
                      for n, body in enumerate(bodies))
    expected = _comparable(opened(frame_max=65536).receive_data(stream))
    placer = _Placer()
    events, _, _ = _feed_with_tails(_placing(placer, frame_max=65536), stream, sizes, head)
    got, comparable = _bodies_and_rest(placer, events)
    assert got[0::2] == bodies
    assert comparable == expected
    assert sorted(e.placed for e in events if isinstance(e, PublishReceived) and e.placed >= 0) == sorted(
        placer.live)


def test_one_octet_reads_give_the_same_publishes() -> None:
    """A client whose bytes come one at a time: every room read takes one octet, no tail."""
    body = bytes(range(256)) * 160  # 40,960 octets: a placed body, in two frames of 32 KiB
    stream = publish(1, body, frame_max=32768) + publish(1, b"x")
    expected = _comparable(opened(frame_max=32768).receive_data(stream))
    placer = _Placer()
    events, into, tails = _feed_with_tails(_placing(placer, frame_max=32768), stream, [1], 1024)
    got, comparable = _bodies_and_rest(placer, events)
    assert got == [body, b"x"] and comparable == expected
    assert into > 0 and tails == 0


@settings(max_examples=30, derandomize=True, database=None, deadline=None)
@given(st.sampled_from([-9, -8, -7, -1, 0, 1, 7, 8, 9]), st.integers(1, 3))
def test_bodies_around_frame_max_boundaries(delta: int, frames: int) -> None:
    """Bodies that fill their last frame exactly, miss it by a few octets or spill a few into
    one more (frame_max 16 KiB, a frame's payload 16,376 octets), read in 20,000-octet reads
    with 9-octet tails: the same publishes as plain reads."""
    frame_max = 16384
    size = frames * (frame_max - 8) + delta + 32768  # at least PLACE_MIN
    body = bytes(range(251)) * (size // 251) + b"t" * (size % 251)
    stream = publish(1, body, frame_max=frame_max) + publish(1, body[::-1], frame_max=frame_max)
    expected = _comparable(opened(frame_max=frame_max).receive_data(stream))
    placer = _Placer()
    events, into, _ = _feed_with_tails(_placing(placer, frame_max=frame_max), stream, [20_000], 9)
    got, comparable = _bodies_and_rest(placer, events)
    assert got == [body, body[::-1]] and comparable == expected
    assert into > 0


def test_a_connection_closed_mid_body_after_a_tail_frees_the_block() -> None:
    """A tail brought the next body frame's header (its frame is then received into the block)
    and the connection ends before the frame is whole: the block is freed, nothing is live."""
    placer = _Placer()
    conn = _placing(placer)
    stream = publish(1, b"b" * 200_000)  # body frames of 131,064 and 68,936 octets
    _feed_with_tails(conn, stream[:-30_000], [70_000], 1024)
    assert list(placer.live) == [0]
    assert conn.receive_room() is not None  # the second frame is being received into the block
    conn.release_bodies()
    assert placer.released == [0] and placer.live == {}


def test_a_method_in_a_tail_where_a_body_frame_belongs_closes_and_frees() -> None:
    """The tail after a body frame holds a method frame where the rest of the body belongs:
    505 (as from plain reads); close-ok ends the connection and frees the block."""
    placer = _Placer()
    conn = _placing(placer)
    whole = publish(1, b"b" * 200_000)
    first = whole[: len(whole) - (68_936 + 8)]
    stream = first + method(1, commands.Basic.Qos(prefetch_count=1))
    _feed_with_tails(conn, stream, [70_000], 1024)
    assert_closing(conn, 505, "UNEXPECTED_FRAME - expected content body, got non content body "
                   "frame instead", 60, 40)
    conn.receive_data(method(0, commands.Connection.CloseOk()))
    assert conn.state is State.CLOSED and placer.released == [0] and placer.live == {}


def test_frame_buffer_tail_after_a_frame_assembled_in_its_own_buffer() -> None:
    """A big frame that is not placed (no sink) is assembled in a buffer of its size; a tail
    received with its last octets is parsed after it, as what followed it in a plain read."""
    payload = bytes(range(256)) * 64  # 16 KiB
    frame = bytes([FRAME_BODY, 0, 1]) + len(payload).to_bytes(4, "big") + payload + b"\xce"
    following = bytes([FRAME_BODY, 0, 2, 0, 0, 0, 3]) + b"abc\xce"
    buffer = FrameBuffer(frame_max=65536)
    buffer.add_data(frame[:1000])
    assert buffer.next_frame() is None
    room = buffer.big_frame_room()
    assert room is not None and len(room) == len(frame) - 1000
    room[:] = frame[1000:]
    buffer.big_frame_filled(len(room), following[:5])
    first = buffer.next_frame()
    assert first is not None and bytes(first.payload) == payload and first.channel == 1
    assert buffer.next_frame() is None
    buffer.add_data(following[5:])
    second = buffer.next_frame()
    assert second is not None and bytes(second.payload) == b"abc" and second.channel == 2


# -- the worker's reader on a socket -------------------------------------------------------


def _big_publishes(bodies: list[bytes]) -> bytes:
    out = b""
    for data in bodies:
        out += (frame.marshal(commands.Basic.Publish(routing_key="q"), 1)
                + frame.marshal(header.ContentHeader(0, len(data), commands.Basic.Properties()), 1))
        for at in range(0, len(data), 131064):
            out += frame.marshal(body.ContentBody(data[at : at + 131064]), 1)
    return out


class _CountingSocket(socket.socket):
    """A socket that keeps what each of its ``recvmsg_into`` calls received."""

    __slots__ = ("calls",)

    def recvmsg_into(self, buffers: Any, *args: Any) -> Any:
        result = super().recvmsg_into(buffers, *args)
        if not hasattr(self, "calls"):
            self.calls: list[int] = []
        self.calls.append(result[0])
        return result


@pytest.mark.parametrize("chunk", [1 << 20, 131072 + 8, 65536, 7919])
async def test_the_reader_receives_big_bodies_into_their_blocks_with_their_tails(chunk: int) -> None:
    """The worker's reader on a socket, a client sending 256 KiB publishes in pieces of
    ``chunk`` octets: each body lands whole in its block of the arena (the reader's
    ``recvmsg_into`` takes the frames' tails), its publish names that block, and no block is
    left over."""
    bodies = [bytes([n]) * 1000 + bytes(range(256)) * 1020 for n in range(1, 4)]  # 262,120 octets
    stream = _big_publishes(bodies)
    h = Harness(arena_size=4 << 20)
    arena = Arena(bytearray(4 << 20), init=True)
    h.proto.place_bodies(functools.partial(h.handler.place_body, arena), h.handler.release_body)
    h.worker.region.arena = arena  # what the reader publishes into (the compiled handler's type)
    pair = socket.socketpair()
    a, b = _CountingSocket(fileno=pair[0].detach()), pair[1]
    try:
        a.setblocking(False)
        reader = SocketReader(a, h.handler, h.worker, PublishGates())  # type: ignore[arg-type]

        def send() -> None:  # the client, blocking, in a thread of its own
            for at in range(0, len(stream), chunk):
                b.sendall(stream[at : at + chunk])
            b.shutdown(socket.SHUT_WR)

        async def client() -> None:
            await trio.to_thread.run_sync(send)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client)
                nursery.start_soon(reader.run)
    finally:
        a.close()
        b.close()
    pubs = [rec for rec in h.take() if isinstance(rec, r.Publish)]
    stored = [bytes(arena.view(p.offset, p.header_len + p.body_len)[p.header_len :]) for p in pubs]
    assert stored == bodies
    used = sorted(blk.payload for blk in arena.blocks() if blk.state is not BlockState.FREE)
    assert used == sorted(p.offset for p in pubs)  # a block each, none left over
    calls = getattr(a, "calls", [])
    assert sum(calls) > len(stream) // 2  # most of it went straight into the blocks
