"""A read is parsed PARSE_EVENTS events at a time (``AMQPConnection.parse_limit``): the rest
waits in the protocol's buffer, parsed in order before the socket is read again, and only while
the connection is within its bounds. So a client that pipelines small methods and never reads
its replies is stopped partway through a read once its unsent output passes the bound, and
what parsing builds at once is bounded too (issue 38: memory per connection)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import trio
import trio.testing
from pamqp import commands

from tests.workers.connection_helpers import method, opened
from tests.workers.helpers import Harness, decode, socket_pair
from workers import events as ev
from workers import socket_reader
from workers.socket_reader import PARSE_EVENTS, PublishGates, SocketReader
from workers.socket_writer import SocketWriter

CHANNELS = tuple(range(1, 9))
QOS_OK = len(method(1, commands.Basic.QosOk()))


def _qos_flood(count: int) -> bytes:
    """``count`` basic.qos, on channels 1..8 in turn: the order of their replies shows."""
    return b"".join(method(CHANNELS[n % len(CHANNELS)], commands.Basic.Qos(prefetch_count=n))
                    for n in range(count))


def test_parsing_stops_at_the_limit_and_goes_on_in_order() -> None:
    """A read with more frames than ``parse_limit`` gives that many events; ``parse_more``
    gives the rest in order, then ``unparsed`` is off."""
    conn = opened(CHANNELS)
    conn.parse_limit = 4
    first = conn.receive_data(_qos_flood(10))
    assert len(first) == 4 and conn.unparsed
    second = conn.parse_more()
    assert len(second) == 4 and conn.unparsed
    third = conn.parse_more()
    assert len(third) == 2 and not conn.unparsed
    methods = [e for e in first + second + third if isinstance(e, ev.MethodReceived)]
    assert [m.method.prefetch_count for m in methods] == list(range(10))
    assert [m.channel for m in methods] == [CHANNELS[n % 8] for n in range(10)]
    assert conn.parse_more() == [] and not conn.unparsed


def test_more_input_after_a_stopped_parse_comes_after_its_rest() -> None:
    """Input received while a parse's rest waits (the runtime parses the rest first, but the
    protocol does not rely on it) is parsed after that rest, a frame split across both too."""
    conn = opened(CHANNELS)
    conn.parse_limit = 3
    flood = _qos_flood(9)
    events = conn.receive_data(flood[:-5])
    assert conn.unparsed
    conn.parse_limit = 1 << 62
    events += conn.receive_data(flood[-5:])
    assert [e.method.prefetch_count for e in events] == list(range(9))


def test_unlimited_by_default() -> None:
    conn = opened(CHANNELS)
    assert len(conn.receive_data(_qos_flood(500))) == 500 and not conn.unparsed


# -- the reader: stops partway through a read at the output bound ---------------------


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket_pair(4096) as ends:
        yield ends


def _runtime(sock: socket.socket, bound: int) -> tuple[Harness, SocketReader, SocketWriter]:
    """A handler with channels 1..8 open, its output bound ``bound``, with the worker's
    reader and writer on ``sock``; the fake worker wakes dirty writers as Worker does."""
    h = Harness(channels=CHANNELS)
    h.handler.output_bound = bound
    worker = h.worker

    def after_batch() -> None:
        dirty, worker.dirty = worker.dirty, set()
        for handler in dirty:
            handler.wake_writer()

    worker.after_batch = after_batch  # type: ignore[method-assign]
    writer = SocketWriter(sock, h.handler, after_batch)
    reader = SocketReader(sock, h.handler, worker, PublishGates())  # type: ignore[arg-type]
    return h, reader, writer


async def _receive(sock: socket.socket, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        await trio.lowlevel.wait_readable(sock)
        data = sock.recv(1 << 16)
        if not data:
            break
        got += data
    return bytes(got)


async def test_a_read_past_the_output_bound_is_parsed_after_the_writer_drains(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """One read of 2,000 basic.qos whose replies the client does not read: the reader stops
    parsing partway once the unsent output passes the bound (the rest of the read waits,
    unparsed); once the client reads, the writer drains, the rest is parsed, and every reply
    arrives, in the order of the requests."""
    a, b = pair
    count = 2000
    bound = 4096
    h, reader, writer = _runtime(a, bound)
    b.sendall(_qos_flood(count))  # 38,000 octets: one read (RECEIVE_SMALL asks 64 KiB)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            nursery.start_soon(reader.run)
            await trio.testing.wait_all_tasks_blocked()
            assert h.handler.reading_stop == "output"
            assert h.proto.unparsed  # stopped partway through the read
            replies = (h.handler.taken_bytes + h.proto.unsent_bytes) // QOS_OK
            # What was parsed is the bound's worth of replies and what the socket took, at
            # most one parse more: far from the read's 2,000.
            assert replies < count // 2
            assert h.proto.unsent_cost + h.handler.in_flight <= bound + PARSE_EVENTS * 2 * QOS_OK
            got = await _receive(b, count * QOS_OK)
            nursery.cancel_scope.cancel()
    frames = decode(got)
    assert all(isinstance(f, commands.Basic.QosOk) for _, f in frames)
    assert [channel for channel, _ in frames] == [CHANNELS[n % 8] for n in range(count)]
    assert not h.proto.unparsed and h.handler.reading_stop is None


def test_the_heap_is_trimmed_at_most_once_an_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections stopped for unsent output one after the other trim the worker's heap
    once per TRIM_INTERVAL, not once each."""
    calls: list[int] = []
    monkeypatch.setattr(socket_reader, "_trim", calls.append)
    monkeypatch.setattr(socket_reader, "_trimmed_at", -socket_reader.TRIM_INTERVAL)
    for _ in range(5):
        socket_reader._trim_heap()
    assert calls == [0]
    monkeypatch.setattr(socket_reader, "_trimmed_at", -socket_reader.TRIM_INTERVAL)
    socket_reader._trim_heap()
    assert calls == [0, 0]
