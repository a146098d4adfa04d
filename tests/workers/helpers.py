"""What the worker tests share: server properties for a test connection, and the harness
that drives a connection handler over an opened AMQPConnection (model: h2's tests/helpers.py)."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import msgspec
from pamqp import base, body, commands, frame, header

from ipc import records as r
from ipc.logfile import BodyLog
from ipc.region import Region
from ipc.wakeup import EventFd
from ipc.worker_config import WorkerConfig
from workers import events as ev
from workers.channel import Channel
from workers.channel_config import ChannelResources
from workers.confirm_gate import BodySyncGate
from workers.connection import AMQPConnection
from workers.connection_handler import ConnectionHandler
from workers.consumer_target import ConsumerTarget, ConsumerTargets
from workers.frame_buffer import PROTOCOL_HEADER
from workers.worker import Worker


def default_server_properties() -> dict[str, Any]:
    """Server properties as RabbitMQ shapes them (capabilities included)."""
    return {
        "capabilities": {
            "publisher_confirms": True,
            "exchange_exchange_bindings": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "connection.blocked": True,
            "consumer_priorities": True,
            "authentication_failure_close": True,
            "per_consumer_qos": True,
            "direct_reply_to": True,
        },
        "product": "Shoal",
        "version": "0.1.0",
        "platform": "Python",
        "information": "An AMQP 0-9-1 broker",
    }


CONN = 7


# -- the harness --------------------------------------------------------------


class FakeArena:
    """A bump allocator over one fixed bytearray (never resized: views stay valid)."""

    def __init__(self, size: int) -> None:
        self.memory = bytearray(size)
        self.top = 0
        self.freed: list[int] = []

    def store(self, data: bytes | bytearray | memoryview) -> int:
        offset = self.top
        self.memory[offset : offset + len(data)] = data
        self.top += len(data)
        return offset

    def alloc(self, size: int) -> int | None:
        if self.top + size > len(self.memory):
            return None
        offset, self.top = self.top, self.top + size
        return offset

    def view(self, offset: int, size: int) -> memoryview:
        return memoryview(self.memory)[offset : offset + size]

    def free(self, offset: int) -> None:
        self.freed.append(offset)


class FakeArenas:
    """``workers.arenas.Arenas`` over one FakeArena: every delivery's body is in it, but a
    paged-out one (``stored``), which cannot be read back (no body log)."""

    def __init__(self, arena: FakeArena) -> None:
        self.arena = arena

    def body(self, d: r.Delivery) -> tuple[memoryview, memoryview] | None:
        if d.stored is not None:
            return None
        return self.own_body(d.offset, d.header_len, d.body_len)

    def own_body(self, offset: int, header_len: int, body_len: int) -> tuple[memoryview, memoryview]:
        view = self.arena.view(offset, header_len + body_len)
        return view[:header_len], view[header_len:]

    def free(self, offset: int) -> None:
        self.arena.free(offset)


class FakeWorker:
    """What ConnectionHandler uses of ``workers.worker.Worker``, and what it lends channels
    (real consumer targets, a fake arena); records requests."""

    def __init__(self, arena_size: int = 1 << 20, body_log: BodyLog | None = None) -> None:
        self.index = 0
        self.requests: list[Any] = []
        self.dirty: set[ConnectionHandler] = set()
        self.handlers: dict[int, ConnectionHandler] = {}
        self.targets = ConsumerTargets(64)
        self.region = SimpleNamespace(arena=FakeArena(arena_size))
        self.arenas = FakeArenas(self.region.arena)
        self.blocked = False
        self.arena_full = False
        self.trace = None
        self.body_log = body_log  # with --data-dir
        self.confirm_waiters: set[BodySyncGate] = set()
        self.body_sync_wanted = 0  # times a persistent publish asked the sync task for a sync
        self._sync_waiters: list[tuple[int, Any]] = []
        self._body_conns: set[int] = set()
        self.want_after_batch = self.after_batch
        self.channel_resources = ChannelResources(
            self.arenas, self.targets, self.body_log, self.confirm_waiters, self.trace)

    # The real worker's: what a persistent publish and a body log sync do.
    store_body = Worker.store_body
    write_bodies = Worker.write_bodies
    body_synced = Worker.body_synced
    after_body_sync = Worker.after_body_sync

    def want_body_sync(self) -> None:
        self.body_sync_wanted += 1

    def after_batch(self) -> None:
        pass  # the harness takes the output itself (Harness.frames)

    @property
    def alarmed(self) -> bool:
        return self.blocked or self.arena_full

    def send(self, rec: Any) -> None:
        self.requests.append(rec)

    def own_body(self, offset: int, header_len: int, body_len: int) -> tuple[memoryview, memoryview]:
        return self.arenas.own_body(offset, header_len, body_len)


class Harness:
    """A ConnectionHandler over an opened AMQPConnection with ``channels`` open, output drained."""

    def __init__(self, channels: tuple[int, ...] = (1,), arena_size: int = 1 << 20,
                 capabilities: dict[str, Any] | None = None,
                 body_log: BodyLog | None = None) -> None:
        self.worker = FakeWorker(arena_size, body_log)
        self.proto = AMQPConnection(server_properties=default_server_properties())
        self.handler = ConnectionHandler(self.worker, CONN, self.proto)  # type: ignore[arg-type]
        self.worker.handlers[CONN] = self.handler
        props = {"product": "test", "capabilities": capabilities or {}}
        self.feed(PROTOCOL_HEADER)
        self.client(0, commands.Connection.StartOk(props, "PLAIN", "\0guest\0guest"))  # type: ignore[arg-type]
        self.client(0, commands.Connection.TuneOk(2047, 131072, 60))
        self.client(0, commands.Connection.Open("/"))
        for n in channels:
            self.client(n, commands.Channel.Open())
        self.frames()
        self.take()

    # client → worker
    def feed(self, data: bytes) -> None:
        for event in self.proto.receive_data(data):
            if isinstance(event, ev.PublishReceived):  # as workers.server._publish does
                payload = bytes(event.header_payload) + b"".join(bytes(c) for c in event.body)
                offset = self.worker.region.arena.store(payload)
                self.handler.publish(event, offset, len(event.header_payload), None)
            else:
                self.handler.handle(event)

    def client(self, channel: int, method: base.Frame) -> None:
        self.feed(frame.marshal(method, channel))

    def publish(self, channel: int, data: bytes = b"m",
                properties: commands.Basic.Properties | None = None, **kwargs: Any) -> None:
        props = properties or commands.Basic.Properties()
        self.feed(frame.marshal(commands.Basic.Publish(**kwargs), channel)
                  + frame.marshal(header.ContentHeader(0, len(data), props), channel)
                  + frame.marshal(body.ContentBody(data), channel))

    # supervisor → worker
    def supervisor(self, *events: Any) -> None:
        """One batch of events, routed as Worker.handle_events routes them."""
        for event in events:
            if isinstance(event, (r.Pulled, r.Cancelled)):
                target = self.worker.targets.get(event.consumer)
                handler = self.worker.handlers.get(target.conn) if target is not None else None
                if target is None or handler is None:
                    continue
                if isinstance(event, r.Pulled):
                    if not event.seq:  # the supervisor had applied every pull sent so far
                        event = msgspec.structs.replace(event, seq=target.pull_seq)
                    handler.on_pulled(target, event)
                else:
                    handler.on_cancelled(target)
            else:
                handler = self.worker.handlers.get(event.conn)
                if handler is not None:
                    handler.on_event(event)
        self.handler.flush_confirms()

    def notify(self, *targets: ConsumerTarget) -> None:
        """seed: notifyWork, i.e. the targets' notify slots were found set in one batch, routed
        as Worker.handle_events routes them."""
        known = [target.slot for target in targets if target.id in self.worker.targets]
        Worker.notify_slots(self.worker, known)  # type: ignore[arg-type]

    def refresh(self) -> None:
        """Credit may have come back for every consumer (as after the output was written)."""
        self.handler.refresh_all()

    def delivery(self, entry: int, data: bytes = b"body", redelivered: bool = False) -> r.Delivery:
        """A message body in the arena and the Delivery record that names it."""
        head = header.ContentHeader(0, len(data), commands.Basic.Properties()).marshal()
        offset = self.worker.region.arena.store(head + data)
        return r.Delivery(entry, redelivered, "", "q", 0, offset, len(head), len(data))

    # worker → observed
    def take(self) -> list[Any]:
        """The request records sent since the last call (the body log's queued frames written
        first, as Worker.flush_requests does before the ring)."""
        if self.worker.body_log is not None:
            self.worker.write_bodies()
        out, self.worker.requests = self.worker.requests, []
        return out

    def frames(self) -> list[tuple[int, Any]]:
        """What the handler wrote (the writer took it and the socket accepted it)."""
        data = self.handler.take_output()
        self.handler.sent(len(data))
        self.handler.written()
        return decode(data)

    def channel(self, n: int = 1) -> Channel:
        return self.handler.channels[n]


def decode(data: bytes) -> list[tuple[int, Any]]:
    out = []
    while data:
        used, channel, value = frame.unmarshal(data)
        out.append((channel, value))
        data = data[used:]
    return out


def methods(frames: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """Method frames only (no content headers or bodies)."""
    return [(n, f) for n, f in frames if isinstance(f, base.Frame)]


def consumer(h: Harness, ch: int = 1, tag: str = "c1", queue: str = "q", *,
             no_ack: bool = False) -> ConsumerTarget:
    """A consumer whose consume-ok was sent; requests and frames drained."""
    h.client(ch, commands.Basic.Consume(queue=queue, consumer_tag=tag, no_ack=no_ack))
    h.supervisor(r.Reply(CONN, ch, "consume"))
    h.take()
    h.frames()
    return h.channel(ch).consumers[tag]


def pulls(records: list[Any]) -> list[r.Pull]:
    return [rec for rec in records if isinstance(rec, r.Pull)]


def interests(records: list[Any]) -> list[r.Interest]:
    return [rec for rec in records if isinstance(rec, r.Interest)]


@contextlib.contextmanager
def worker_region() -> Iterator[tuple[WorkerConfig, Region]]:
    """A worker's small region and eventfds, and the config that names them (removed after)."""
    name = f"/shoaltest.{os.getpid()}-{secrets.token_hex(4)}.w0"
    region = Region.create(name, ring_bytes=1 << 16, slots=64, arena_bytes=1 << 16)
    request, event = EventFd(), EventFd()
    try:
        yield WorkerConfig(
            index=0, instance=f"{os.getpid()}-00", regions=[name], listen_fd=-1,
            request_fd=request.fileno(), event_fd=event.fileno(), alive_fd=-1,
        ), region
    finally:
        region.close()
        region.unlink()
        request.close()
        event.close()


@contextlib.contextmanager
def socket_pair(buffer: int) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A non-blocking socket pair: the worker's end sends through ``buffer`` octets of send
    buffer, the client's receives into as many; both closed after."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    a.setblocking(False)
    b.setblocking(False)
    try:
        yield a, b
    finally:
        a.close()
        b.close()
