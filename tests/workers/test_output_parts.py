"""Big message bodies go to the socket from their arena blocks (``AMQPConnection.output_parts``,
``SocketWriter``), never copied in user space while nothing could free a block: what the socket
does not take, and what waits for a busy writer, keeps its views until written. Once they are
sealed (``ConnectionHandler.seal_held``: a record that may free a block is about to go), they
are copies, so a block freed and reused after that changes nothing on the wire."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from pamqp import commands, header

from tests.workers.connection_helpers import opened
from tests.workers.helpers import Harness, socket_pair
from workers import codec
from workers.codec import Buffer
from workers.connection import AMQPConnection
from workers.outgoing import Ack, BasicGetOk, DeclareOk, Deliveries, Method, Return
from workers.socket_writer import IOV_MAX, SocketWriter, send_parts, unsent

BIG = codec.ZEROCOPY_MIN


class Arena:
    """Message contents in one bytearray, as views (what workers.arenas hands channels)."""

    def __init__(self, size: int = 8 << 20) -> None:
        self.memory = bytearray(size)
        self.top = 0

    def content(self, size: int, fill: int = 0) -> tuple[Buffer, Buffer]:
        head = header.ContentHeader(0, size, commands.Basic.Properties()).marshal()
        data = head + bytes((fill + i) % 251 for i in range(size))
        offset = self.top
        self.memory[offset : offset + len(data)] = data
        self.top += len(data)
        view = memoryview(self.memory)[offset : offset + len(data)]
        return view[: len(head)], view[len(head) :]

    def scribble(self) -> None:
        """The blocks freed and reused: every byte changed."""
        self.memory[:] = b"\xa5" * len(self.memory)


def _events(arena: Arena, sizes: list[int]) -> list[Any]:
    """Deliveries of ``sizes`` (small, big, several frames) mixed with other output."""
    messages = [(tag, tag % 2 == 0, "ex", "rk", *arena.content(size, tag))
                for tag, size in enumerate(sizes, 1)]
    get_head, get_body = arena.content(3 * BIG + 5, 7)
    ret_head, ret_body = arena.content(2 * BIG, 9)
    return [
        Ack(1, 4, True),
        Deliveries(1, "ctag", messages[: len(messages) // 2]),
        Method(1, commands.Basic.QosOk()),
        BasicGetOk(1, 99, False, "ex", "rk", 3, get_head, get_body),
        Return(1, 312, "NO_ROUTE", "ex", "rk", ret_head, ret_body),
        Deliveries(1, "ctag", messages[len(messages) // 2 :]),
        DeclareOk(1, "q", 1, 2),
    ]


def _sizes(frame_max: int) -> list[int]:
    chunk = frame_max - 8
    return [0, 10, BIG - 1, BIG, BIG + 1, chunk, chunk + 1, 3 * chunk + 5, 100, 256 << 10]


def _queued(frame_max: int = 131072) -> tuple[AMQPConnection, AMQPConnection, Arena]:
    """Two connections with the same output queued, over the same arena."""
    arena = Arena()
    parts, joined = opened(frame_max=frame_max), opened(frame_max=frame_max)
    for event in _events(arena, _sizes(frame_max)):
        assert parts.send(event) and joined.send(event)
    return parts, joined, arena


# -- the protocol's output --------------------------------------------------------


@pytest.mark.parametrize("frame_max", [4096, 131072])
def test_parts_are_the_bytes_data_to_send_gives(frame_max: int) -> None:
    """Parts (views and all) make the very bytes the joined output is, counted the same."""
    parts, joined, _ = _queued(frame_max)
    assert parts.holds_views
    size = parts.unsent_bytes
    assert size == joined.unsent_bytes
    out = parts.output_parts()
    assert sum(len(p) for p in out) == size
    assert b"".join(out) == joined.data_to_send()
    assert parts.unsent_bytes == 0 and parts.bytes_sent == joined.bytes_sent
    assert not parts.holds_views and parts.output_parts() == []


def test_big_bodies_are_views_of_the_arena_small_ones_are_copied() -> None:
    """A body of ZEROCOPY_MIN octets or more is queued as views of its block; a smaller one
    is copied into its frames, and output of small ones only is one bytes."""
    arena = Arena()
    conn = opened()
    small = [(n, False, "", "q", *arena.content(BIG - 1, n)) for n in range(1, 4)]
    conn.send(Deliveries(1, "c", small))
    assert not conn.holds_views
    [data] = conn.output_parts()
    assert type(data) is bytes
    big = [(n, False, "", "q", *arena.content(BIG, n)) for n in range(1, 4)]
    conn.send(Deliveries(1, "c", small + big))
    assert conn.holds_views
    out = conn.output_parts()
    views = [p for p in out if isinstance(p, memoryview)]
    assert len(views) == 3 and all(v.obj is arena.memory for v in views)
    assert all(type(p) is bytes for p in out if not isinstance(p, memoryview))
    assert sum(len(v) for v in views) == 3 * BIG


def test_return_bodies_are_always_copied() -> None:
    """basic.return's block is freed as soon as it is queued (Worker._dispatch): copied."""
    arena = Arena()
    conn = opened()
    conn.send(Return(1, 312, "NO_ROUTE", "", "q", *arena.content(4 * BIG)))
    assert not conn.holds_views


def test_sealed_output_holds_no_view() -> None:
    """seal_output copies the views: a block freed and reused after it changes nothing."""
    parts, joined, arena = _queued()
    size = parts.unsent_bytes
    parts.seal_output()
    assert not parts.holds_views and parts.unsent_bytes == size
    expected = joined.data_to_send()
    arena.scribble()
    out = parts.output_parts()
    assert not any(isinstance(p, memoryview) and p.obj is arena.memory for p in out)
    assert b"".join(out) == expected
    # Output queued after a seal is sealed on its own (what was copied is not copied again).
    arena2 = Arena()
    conn = opened()
    conn.send(Deliveries(1, "c", [(1, False, "", "q", *arena2.content(BIG))]))
    conn.seal_output()
    first = conn._out[-1]
    conn.send(Deliveries(1, "c", [(2, False, "", "q", *arena2.content(BIG))]))
    conn.seal_output()
    assert conn._out[0] is first and len(conn._out) == 2


# -- the socket writer ---------------------------------------------------------------


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket_pair(16384) as ends:
        yield ends


def _drain(sock: socket.socket) -> bytes:
    got = bytearray()
    while True:
        try:
            data = sock.recv(1 << 20)
        except BlockingIOError:
            return bytes(got)
        if not data:
            return bytes(got)
        got += data


def _handler_with_output(arena: Arena, count: int = 8) -> tuple[Harness, bytes]:
    """A connection handler with ``count`` 256 KiB deliveries queued; their bytes."""
    h = Harness()
    messages = [(n, False, "", "q", *arena.content(256 << 10, n)) for n in range(1, count + 1)]
    expected = b"".join(codec.encode_deliver(1, "c", *m, h.proto.frame_max) for m in messages)
    h.handler.send(Deliveries(1, "c", messages))
    assert h.proto.holds_views
    return h, expected


async def _read(sock: socket.socket, got: bytearray, total: int) -> None:
    """Read ``sock`` into ``got`` until it holds ``total`` octets."""
    peer = trio.socket.from_stdlib_socket(sock)
    while len(got) < total:
        got.extend(await peer.recv(1 << 16))


def _views_arena(parts: list[Any], arena: Arena) -> bool:
    return any(isinstance(p, memoryview) and p.obj is arena.memory for p in parts)


def test_send_now_leaves_the_rest_to_the_writer_as_views(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """The socket takes part: the rest waits for the writer as it is, arena views and all
    (no copy), counted in flight; sealed, it is a copy: the blocks freed and reused after
    that change nothing that is sent."""
    a, b = pair
    arena = Arena()
    h, expected = _handler_with_output(arena)
    writer = SocketWriter(a, h.handler, lambda: None)
    writer.busy = False  # the writer task waits for its doorbell
    writer.send_now()
    pending = writer.pending
    assert pending is not None and writer.busy
    assert _views_arena(pending, arena)
    assert h.handler.in_flight == len(expected) and h.proto.unsent_bytes == 0
    assert not h.proto.holds_views and not h.proto.has_data_to_send
    h.handler.seal_held()  # as Worker.send does before a Settle naming one of them
    sealed = writer.pending
    assert sealed is not None and len(sealed) == 1 and type(sealed[0]) is bytes
    arena.scribble()
    got = _drain(b)
    assert 0 < len(got) < len(expected)
    assert got + sealed[0] == expected


def test_send_now_while_the_writer_is_busy_leaves_the_views_queued(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """The writer is sending: the output waits for it in the protocol's buffer, views and
    all; sealing copies them."""
    a, b = pair
    arena = Arena()
    h, expected = _handler_with_output(arena, 2)
    writer = SocketWriter(a, h.handler, lambda: None)
    assert writer.busy  # not started: as while sending
    writer.send_now()
    assert h.proto.holds_views and h.proto.unsent_bytes == len(expected)
    assert _drain(b) == b""
    h.handler.seal_held()
    assert not h.proto.holds_views
    arena.scribble()
    assert h.handler.take_output() == expected


def test_the_writer_task_sends_all_in_order(pair: tuple[socket.socket, socket.socket]) -> None:
    """Direct sends, their rests and output queued while the writer is busy reach the peer
    whole and in order, the views held until written, and every block reused as soon as the
    output is sealed (every other step: what the writer is sending is copied too)."""
    a, b = pair
    arena = Arena(32 << 20)
    h = Harness()
    writer = SocketWriter(a, h.handler, lambda: None)
    expected = bytearray()
    got = bytearray()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await trio.sleep(0)
            for batch in range(6):
                messages = [(n, False, "", "q", *arena.content(size, n))
                            for n, size in enumerate((300 << 10, 10, BIG, 70000), batch * 4)]
                expected.extend(b"".join(codec.encode_deliver(1, "c", *m, h.proto.frame_max)
                                         for m in messages))
                h.handler.send(Deliveries(1, "c", messages))
                writer.send_now()
                if batch % 2:
                    h.handler.seal_held()  # a Settle that may free these blocks goes next
                    assert not h.proto.holds_views
                    assert writer.sending is None or not _views_arena(writer.sending, arena)
                    assert writer.pending is None or not _views_arena(writer.pending, arena)
                    arena.scribble()  # freed and reused once sealed
                await trio.sleep(0)
            nursery.start_soon(_read, b, got, len(expected))
            with trio.fail_after(10):
                await writer.drain(10)
            assert writer.drained.is_set()

    trio.run(main)
    assert bytes(got) == bytes(expected)
    assert h.handler.in_flight == 0


def test_output_queued_before_the_writer_runs_is_sent_with_the_rest(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """A direct send leaves a rest and rings the writer; before the writer runs, more output
    is queued and rings again (one ring: the first is still pending). The writer sends the
    rest and then that output, with no further ring: nothing else is coming (the consumer's
    prefetch is spent, or its output bound reached) and the client waits for those frames."""
    a, b = pair
    arena = Arena(32 << 20)
    h, first = _handler_with_output(arena, 4)
    writer = SocketWriter(a, h.handler, lambda: None)
    got = bytearray()
    expected = bytearray(first)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            await trio.testing.wait_all_tasks_blocked()
            assert not writer.busy  # idle, waiting for its doorbell
            writer.send_now()  # the socket takes part: the rest is the writer's, rung
            assert writer.pending is not None and writer.busy
            messages = [(n, False, "", "q", *arena.content(256 << 10, n)) for n in range(5, 9)]
            expected.extend(b"".join(codec.encode_deliver(1, "c", *m, h.proto.frame_max)
                                     for m in messages))
            h.handler.send(Deliveries(1, "c", messages))
            writer.send_now()  # busy: queued, the bell rung again before the writer ran
            assert h.proto.has_data_to_send
            with trio.fail_after(10):  # a bound for a hang, not a timing
                await _read(b, got, len(expected))
            assert not h.proto.has_data_to_send and h.handler.in_flight == 0
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert bytes(got) == bytes(expected)


# -- helpers -----------------------------------------------------------------------


def test_send_parts_takes_more_than_iov_max_buffers() -> None:
    """More parts than one sendmsg takes go in several calls, in order."""
    a, b = socket.socketpair()
    try:
        a.setblocking(False)
        parts: list[Any] = [bytes([i % 256]) * (1 + i % 3) for i in range(3 * IOV_MAX + 7)]
        data = b"".join(parts)
        assert send_parts(a, parts, len(data)) == len(data)
        b.setblocking(False)
        assert _drain(b) == data
    finally:
        a.close()
        b.close()


def test_unsent() -> None:
    """What follows the octets sent, sliced, not copied."""
    block = bytearray(b"0123456789")
    parts: list[Any] = [b"ab", memoryview(block)[2:6], b"xyz"]
    assert b"".join(unsent(parts, 3)) == b"345xyz"
    rest = unsent(parts, 7)
    assert len(rest) == 1 and bytes(rest[0]) == b"yz" and rest[0].obj is parts[2]
    assert unsent(parts, 6) == [parts[2]]
    assert unsent(parts, 9) == []


def test_deliveries_that_cannot_be_encoded_queue_nothing() -> None:
    """An event whose last message fails to encode leaves no part of the others behind."""
    arena = Arena()
    conn = opened()
    good = (1, False, "", "q", *arena.content(BIG))
    bad = (2, False, "x" * 256, "q", *arena.content(10))  # not a short string
    with pytest.raises(ValueError):
        conn.send(Deliveries(1, "c", [good, bad]))
    assert conn.unsent_bytes == 0 and not conn.has_data_to_send and not conn.holds_views
