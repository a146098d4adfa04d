"""A connection's input from its socket: the reader task (the pair of ``socket_writer.py``).

The server makes one ``SocketReader`` per connection. Its task waits for the socket, reads
what came (into a new bytes, or straight into the arena block a big body goes to, with the
start of what follows it), hands it
to the sans-IO protocol (``AMQPConnection.receive_data``) and the events that come out to the
connection's handler, in order, PARSE_EVENTS at a time (the rest of the read waits in the
protocol, unparsed, for ``parse_more``). It stops reading, and parsing, and so lets the
client's TCP window fill, while the handler says so (credit flow, unsent output), while a
memory alarm is on (for publishers) and while a publish waits for room in the worker's arena
(``PublishGates``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import socket
import time
from collections.abc import Callable, Iterator

import trio

from broker import errors
from ipc import records as r
from workers import events as ev
from workers.connection_handler import ConnectionHandler
from workers.tls_socket import TLSSocket
from workers.worker import Worker

log = logging.getLogger("shoal.worker")

RECEIVE_SIZE = 256 << 10
# What a read asks for after one that did not fill its ask (a client between messages): a bytes
# this size comes from malloc's heap. One of RECEIVE_SIZE is over glibc's mmap threshold, and
# as recv shrinks it to what came, it is never reused: an mmap, an mremap and a munmap per read.
RECEIVE_SMALL = 64 << 10
# A client streaming big messages (a full read of at least BIG_EVENT octets per event) is read
# RECEIVE_BIG at a time, a few messages a read, so that each of the worker's turns and each
# wake-up of the supervisor takes several (perf/README.md has the figures). Small messages stay
# at RECEIVE_SIZE: a read is then thousands of publishes, and a bigger one only lets more of
# them in past credit flow.
RECEIVE_BIG = 1 << 20
BIG_EVENT = 32 << 10
# A read into a big body frame's arena block takes up to this much of what follows the frame
# with it (recvmsg_into: a second buffer), and a plain read after one asks no more: the frame
# end, the next frame's header (another body frame's, or the next publish's method and content
# header and its first body frame's header) and the first few hundred octets of that body,
# copied; the rest of that body frame is again received into its block, not copied.
RECEIVE_HEAD = 1 << 10
# The most client events one parse of a connection's input makes (AMQPConnection.parse_limit);
# what a read holds past them waits, unparsed, for the next turn of its reader, which first
# checks the connection's bounds. Handled between two checkpoints of the reader, and what
# parsing builds is bounded: a 256 KiB read of pipelined basic.qos is 13,797 events, 2 MiB of
# objects built at once (and RSS kept) where the replies they make cost 165 KiB.
PARSE_EVENTS = 64
EAGER_READS = 4  # reads a connection's reader may make in a row without waiting (see run)
# A publish waiting for arena room is woken by ArenaFreed; it also looks again this often,
# for room freed while its ArenaWait was on the way (the supervisor did not count that).
ARENA_RECHECK = 0.25
# A connection stopped for unsent output leaves its worker's heap with the free room its reads'
# parsing used (glibc keeps it resident): the worker hands it back to the system (malloc_trim),
# at most this often. One client pipelining basic.qos unread grew a worker by 15.7 MiB, 7.3 with
# it: its 8 MiB of replies (perf/flood_memory.py, docs/flow-control.md).
TRIM_INTERVAL = 1.0


class PublishGates:
    """What a worker's publishes may have to wait for, shared by its readers: the end of a
    resource alarm (``unblocked``) and room freed in its arena (``arena_freed``). The worker
    calls ``blocked`` and ``on_arena_freed`` (``Worker.on_blocked``, ``on_arena_freed``)."""

    def __init__(self) -> None:
        self.unblocked = trio.Event()
        self.unblocked.set()
        self.arena_freed = trio.Event()

    def blocked(self, active: bool) -> None:
        if active and self.unblocked.is_set():
            self.unblocked = trio.Event()
        elif not active:
            self.unblocked.set()

    def on_arena_freed(self) -> None:
        self.arena_freed.set()
        self.arena_freed = trio.Event()


class SocketReader:
    """One connection's input: read from ``sock`` (non-blocking, waited on with trio), fed to
    ``handler``'s protocol, its events to ``handler``."""

    __slots__ = ("_gates", "_handler", "_sock", "_worker")

    def __init__(self, sock: socket.socket | TLSSocket, handler: ConnectionHandler, worker: Worker,
                 gates: PublishGates) -> None:
        self._sock = sock
        self._handler = handler
        self._worker = worker
        self._gates = gates
        handler.proto.parse_limit = PARSE_EVENTS

    async def run(self) -> None:
        """Read until the protocol closes or the client does (EOF, a socket error)."""
        handler = self._handler
        proto = handler.proto
        sock = self._sock
        recv = sock.recv
        recv_into = sock.recv_into
        # Plain TCP: a read into a frame's room takes what follows it into ``head`` too.
        recvmsg_into = sock.recvmsg_into if isinstance(sock, socket.socket) else None
        head = bytearray(RECEIVE_HEAD)
        head_view = memoryview(head)
        rooms = [head_view, head_view]
        # TLS: records already received may be waiting to be decrypted (TLSSocket.wait_readable)
        wait_readable = sock.wait_readable if isinstance(sock, TLSSocket) else trio.lowlevel.wait_readable
        eager = 0  # reads that may still go without waiting first
        streak = 0  # octets read into rooms since the last wait, less those counted as reads
        ask = RECEIVE_SMALL  # the next read's size: more after one that filled its ask
        while not proto.closed:
            if proto.unparsed:
                # The last read's frames past PARSE_EVENTS wait in the protocol's buffer:
                # parsed (in order) before the socket is read again, and only while the
                # connection's unsent output is within its bound. Credit flow stops reading
                # between reads, as it did before reads were parsed in parts.
                if handler.reading_stop == "output":
                    await self._stop_reading()
                await self._handle(proto.parse_more())
                continue
            if handler.reading_stop is not None:
                await self._stop_reading()
            # Wait, then read: what trio's receive_some does, less its two checkpoints and
            # the failed recv it tries first (a client is mostly quiet between messages).
            # A read that filled what it asked for is likely followed by more: the next read
            # goes first, without the wait (at most EAGER_READS in a row, so a client that
            # never pauses cannot hog the worker; reads into rooms count one per RECEIVE_BIG
            # octets, as the plain reads of big messages they stand for). A big body frame's
            # payload is received straight into the arena block its publish goes to
            # (AMQPConnection.place_bodies), the rest of another big frame where it is being
            # assembled: no copy either way. On plain TCP the same read takes up to
            # RECEIVE_HEAD octets of what follows the frame into ``head`` (recvmsg_into).
            try:
                waited = not eager
                if waited:
                    await wait_readable(sock)
                # Asked after the wait: meanwhile another task may have closed the channel
                # whose publish the room was in, and freed its block.
                room = proto.receive_room()
                if room is None:
                    want = ask
                    data = recv(want)
                    size = len(data)
                elif recvmsg_into is not None:
                    want = len(room) + RECEIVE_HEAD
                    rooms[0] = room
                    try:
                        size = recvmsg_into(rooms)[0]
                    finally:
                        rooms[0] = head_view  # the block may be freed: no view of it kept
                else:
                    want = len(room)
                    size = recv_into(room)
            except BlockingIOError:
                eager = 0
                room = None
                continue
            except (OSError, trio.ClosedResourceError):
                return
            if not size:
                return
            if size != want:
                eager = 0
            elif waited:
                eager, streak = EAGER_READS, 0
            elif room is None:
                eager -= 1
            else:  # reads into rooms count as one per RECEIVE_BIG octets
                streak += size
                if streak >= RECEIVE_BIG:
                    eager, streak = eager - 1, streak - RECEIVE_BIG
            try:
                if room is None:
                    events = proto.receive_data(data)
                elif size > len(room):
                    events = proto.received_into(len(room), bytes(head_view[: size - len(room)]))
                else:
                    events = proto.received_into(size)
            except Exception:  # one connection's bug must not end the worker
                log.exception("connection %d: internal error", handler.conn_id)
                handler.fail(errors.InternalError("internal error"))
                events = []
            if room is None:
                ask = _next_ask(want, size, len(events), proto.unparsed)
                # The protocol holds what it still needs of the read; this task, waiting for
                # the next one, must not keep all of it (up to 1 MiB an idle connection).
                data = b""
            else:
                if recvmsg_into is not None:
                    ask = RECEIVE_HEAD  # a big frame's end: the next one's header, not its body
                room = None
            await self._handle(events)

    async def _handle(self, events: list[ev.Event]) -> None:
        """Hand one parse's events (PARSE_EVENTS at most) to the handler, in order; then
        the writers and the supervisor get what they produced, and after a full batch (the
        read may hold more) the worker's other connections a turn."""
        handler = self._handler
        worker = self._worker
        arena = worker.region.arena
        try:
            for event in events:
                if isinstance(event, ev.PublishReceived):
                    if worker.blocked or handler.publish_at_once(event, arena):
                        await self._publish(event)
                else:
                    handler.handle(event)
        except Exception:  # one connection's bug must not end the worker
            log.exception("connection %d: internal error", handler.conn_id)
            handler.fail(errors.InternalError("internal error"))
        events.clear()  # the protocol's list too: an idle connection keeps none of its events
        if handler.proto_has_output():  # publishes alone give the writer nothing to do
            worker.dirty.add(handler)
        worker.after_batch()
        if handler.proto.unparsed:
            # One read can hold a few thousand publishes (tens of ms of work): what we
            # have went to the supervisor; the worker's other connections and the event
            # ring have a turn.
            await trio.lowlevel.checkpoint()

    async def _stop_reading(self) -> None:
        """Credit flow and bounded output: leave the socket unread (the client's TCP
        window fills and its writes stop, as RabbitMQ's reader does) until the
        supervisor gives credit back or the writer has sent enough."""
        handler = self._handler
        with _not_reading(handler):
            try:
                while (why := handler.reading_stop) is not None:
                    # Unsent output is the client's doing, not ours: its heartbeats are then
                    # looked for in the socket's queues (ConnectionHandler.heartbeat_tick).
                    handler.proto.reading_paused = why == "flow"
                    if why == "output":
                        _trim_heap()
                    resume = trio.Event()
                    handler.wake_reader = resume.set
                    self._worker.after_batch()
                    await resume.wait()
            finally:
                handler.wake_reader = _nothing

    async def _publish(self, event: ev.PublishReceived) -> None:
        """A publish that waits: while a memory alarm is on, and for room in this worker's
        arena (the client is back-pressured by our not reading its socket). The rest take
        ``ConnectionHandler.publish_at_once`` without a coroutine."""
        handler = self._handler
        worker = self._worker
        if worker.blocked:  # memory alarm: stop reading publishers (RabbitMQ does)
            handler.publishes = True
            with _not_reading(handler):
                while worker.blocked:
                    handler.set_blocked(True, worker.block_reason)
                    worker.after_batch()
                    await self._gates.unblocked.wait()
        arena = worker.region.arena
        while needed := handler.publish_at_once(event, arena):
            await self._wait_for_room(needed)

    async def _wait_for_room(self, size: int) -> None:
        """The arena has no block of ``size``: tell our publishers connection.blocked and
        wait until the supervisor has freed that much here (ArenaFreed), not polling."""
        worker = self._worker
        arena = worker.region.arena
        with _not_reading(self._handler):
            while True:
                worker.set_arena_full(True)
                worker.send(r.ArenaWait(size))
                worker.after_batch()
                with trio.move_on_after(ARENA_RECHECK):
                    await self._gates.arena_freed.wait()
                offset = arena.alloc(size)
                if offset is not None:  # room: the caller allocates it again, with nothing between
                    arena.free(offset)
                    worker.set_arena_full(False)
                    return


def _nothing() -> None:
    pass


def _malloc_trim() -> Callable[[int], object] | None:
    """glibc's malloc_trim, or None (another C library)."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_trim = _malloc_trim()
_trimmed_at = -TRIM_INTERVAL


def _trim_heap() -> None:
    """Give the worker's free heap pages back to the system, unless that was done less than
    TRIM_INTERVAL ago (it walks the heap: about a millisecond for a few tens of MiB)."""
    global _trimmed_at
    now = time.monotonic()
    if _trim is not None and now - _trimmed_at >= TRIM_INTERVAL:
        _trimmed_at = now
        _trim(0)


def _next_ask(asked: int, got: int, events: int, unparsed: bool = False) -> int:
    """What a connection's next plain read asks for, after one that asked ``asked`` octets
    and got ``got``, which made ``events`` (and maybe more, ``unparsed``: parsing stopped at
    PARSE_EVENTS): RECEIVE_SMALL after a short read (the client paused), else RECEIVE_SIZE,
    or RECEIVE_BIG once a full read of at least that much came to BIG_EVENT octets an event
    or more (big messages)."""
    if got < asked:
        return RECEIVE_SMALL
    if got >= RECEIVE_SIZE and not unparsed and got >= BIG_EVENT * events:
        return RECEIVE_BIG
    return RECEIVE_SIZE


@contextlib.contextmanager
def _not_reading(handler: ConnectionHandler) -> Iterator[None]:
    """While the broker leaves a connection's socket unread (credit flow, unsent output, an
    alarm, no arena room), the client's silence is ours: no missed-heartbeat timeout."""
    handler.proto.reading_paused = True
    try:
        yield
    finally:
        handler.proto.reading_paused = False
