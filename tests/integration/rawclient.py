"""A hand-driven AMQP 0-9-1 client for byte sequences no client library sends.

Used by the negative suite (`test_negative.py`) and the fuzz test (`test_fuzz.py`):

- frame builders (`method_frame`, `header_frame`, `body_frame`, `raw_frame`, `handshake_bytes`,
  `publish_frames`) that return the exact bytes to put on the wire, well-formed or not;
- `parse_frames`, which splits what the broker sent back into (channel, pamqp object) pairs and
  fails on anything that is not a well-formed frame;
- `RawClient`, one socket with bounded reads (`read_until`, `expect_connection_close`,
  `expect_eof`);
- `Bystanders`, healthy pika clients kept connected to every worker of a broker while a test
  misbehaves, with a message each queued beforehand, so a test can assert that nobody else was
  hurt and nothing was lost.

Every read here is bounded by a timeout; nothing waits forever.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Self

import pika
import pika.exceptions
import psutil
from pamqp import body as pamqp_body
from pamqp import commands, encode, frame, header
from pamqp import exceptions as pamqp_exceptions

from tests.integration.harness import HOST, Broker, close_quietly

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"
READ_TIMEOUT = 5.0

# Reply codes (AMQP 0-9-1 §1.2 / the spec's constants).
ACCESS_REFUSED = 403
NOT_FOUND = 404
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541
# The codes a connection.close from the broker may carry in answer to bad input.
ERROR_CLOSE_CODES = frozenset({320, 402, 403, 404, 405, 406, 501, 502, 503, 504, 505, 506, 530, 540, 541})


# --------------------------------------------------------------------------- frame builders


def raw_frame(frame_type: int, channel: int, payload: bytes, *, size: int | None = None,
              end: int = FRAME_END) -> bytes:
    """One frame with whatever header fields the caller wants (`size` defaults to the truth)."""
    length = len(payload) if size is None else size
    return struct.pack(">BHI", frame_type, channel, length) + payload + bytes([end])


def method_frame(channel: int, method: Any) -> bytes:
    return frame.marshal(method, channel)


def method_payload(class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    """A method frame payload for any (class, method) pair, known to the spec or not."""
    return struct.pack(">HH", class_id, method_id) + arguments


def header_frame(channel: int, body_size: int, properties: commands.Basic.Properties | None = None,
                 class_id: int = 60) -> bytes:
    content_header = header.ContentHeader(0, body_size, properties or commands.Basic.Properties())
    data = frame.marshal(content_header, channel)
    if class_id != 60:
        data = data[:7] + struct.pack(">H", class_id) + data[9:]
    return data


def body_frame(channel: int, data: bytes) -> bytes:
    return frame.marshal(pamqp_body.ContentBody(data), channel)


def publish_frames(channel: int, exchange: str, routing_key: str, body: bytes, *,
                   mandatory: bool = False, frame_max: int = 131072,
                   properties: commands.Basic.Properties | None = None) -> list[bytes]:
    """basic.publish, its content header and as many body frames as frame_max requires."""
    frames = [
        method_frame(channel, commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                     mandatory=mandatory)),
        header_frame(channel, len(body), properties),
    ]
    chunk = frame_max - 8
    frames += [body_frame(channel, body[i:i + chunk]) for i in range(0, len(body), chunk)]
    return frames


def start_ok(user: str = "guest", password: str = "guest", *, mechanism: str = "PLAIN",
             auth_failure_close: bool = True) -> bytes:
    if mechanism == "PLAIN":
        response = f"\0{user}\0{password}"
    else:  # AMQPLAIN: a field table without its length prefix
        table = encode.field_table({"LOGIN": user, "PASSWORD": password})
        response = table[4:].decode("latin-1")
    properties = {"product": "shoal-rawclient",
                  "capabilities": {"authentication_failure_close": auth_failure_close}}
    return method_frame(0, commands.Connection.StartOk(
        client_properties=properties, mechanism=mechanism, response=response))


def handshake_bytes(*, frame_max: int = 131072, channel_max: int = 0, heartbeat: int = 0,
                    user: str = "guest", password: str = "guest") -> list[bytes]:
    """Protocol header, start-ok, tune-ok and connection.open, pipelined (no waiting)."""
    return [
        PROTOCOL_HEADER,
        start_ok(user, password),
        method_frame(0, commands.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max,
                                                   heartbeat=heartbeat)),
        method_frame(0, commands.Connection.Open(virtual_host="/")),
    ]


# --------------------------------------------------------------------------- parsing


class MalformedReply(AssertionError):
    """The broker sent bytes that are not a well-formed AMQP 0-9-1 frame."""


@dataclass
class Received:
    channel: int
    value: Any  # a pamqp method, ContentHeader, ContentBody, Heartbeat or ProtocolHeader

    @property
    def name(self) -> str:
        return getattr(self.value, "name", type(self.value).__name__)


def _split_one(buffer: bytearray) -> Received | None:
    """Take one complete frame off the front of `buffer`; None if it is incomplete."""
    if buffer[:4] == b"AMQP":
        if len(buffer) < 8:
            return None
        raw = bytes(buffer[:8])
        del buffer[:8]
        return Received(0, raw)  # a protocol header, kept raw
    if len(buffer) < 7:
        return None
    frame_type, channel, size = struct.unpack_from(">BHI", buffer)
    if frame_type not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT):
        raise MalformedReply(f"broker sent a frame of unknown type {frame_type}: {bytes(buffer[:32])!r}")
    if len(buffer) < size + 8:
        return None
    if buffer[size + 7] != FRAME_END:
        raise MalformedReply(f"broker sent a frame with end octet {buffer[size + 7]:#x}")
    data = bytes(buffer[: size + 8])
    del buffer[: size + 8]
    try:
        _, channel, value = frame.unmarshal(data)
    except (pamqp_exceptions.UnmarshalingException, ValueError, struct.error) as exc:
        raise MalformedReply(f"broker sent an undecodable frame {data[:64]!r}: {exc!r}") from exc
    return Received(channel, value)


def parse_frames(data: bytes) -> tuple[list[Received], bytes]:
    """Every complete frame in `data`, and the incomplete tail."""
    buffer = bytearray(data)
    frames = []
    while (item := _split_one(buffer)) is not None:
        frames.append(item)
    return frames, bytes(buffer)


# --------------------------------------------------------------------------- the client


class RawClient:
    """One TCP connection to the broker, written byte by byte."""

    def __init__(self, port: int, timeout: float = READ_TIMEOUT):
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()
        self.received: list[Received] = []  # everything read so far, in order
        self.eof = False
        self.start: commands.Connection.Start | None = None
        self.tune: commands.Connection.Tune | None = None

    # ---- set-up

    @classmethod
    def opened(cls, port: int, *, channel: int | None = 1, frame_max: int = 131072) -> RawClient:
        """A client past connection.open-ok (and channel.open-ok on `channel`, unless None)."""
        client = cls(port)
        try:
            client.handshake(frame_max=frame_max)
            if channel is not None:
                client.open_channel(channel)
        except BaseException:
            client.close()
            raise
        return client

    def handshake(self, *, frame_max: int = 131072) -> None:
        self.send(PROTOCOL_HEADER)
        self.start = self.read_until(commands.Connection.Start)
        self.send(start_ok())
        self.tune = self.read_until(commands.Connection.Tune)
        self.send(method_frame(0, commands.Connection.TuneOk(
            channel_max=self.tune.channel_max, frame_max=frame_max, heartbeat=0)))
        self.send(method_frame(0, commands.Connection.Open(virtual_host="/")))
        self.read_until(commands.Connection.OpenOk)

    def open_channel(self, channel: int) -> None:
        self.send(method_frame(channel, commands.Channel.Open()))
        self.read_until(commands.Channel.OpenOk, channel=channel)

    @property
    def worker(self) -> int:
        """The Shoal worker index this connection landed on (from connection.start)."""
        assert self.start is not None, "no connection.start read yet"
        return int(self.start.server_properties["shoal_worker"])

    # ---- output

    def send(self, *chunks: bytes) -> None:
        self.sock.sendall(b"".join(chunks))

    def send_method(self, channel: int, method: Any) -> None:
        self.send(method_frame(channel, method))

    def publish(self, channel: int, exchange: str, routing_key: str, body: bytes) -> None:
        self.send(*publish_frames(channel, exchange, routing_key, body))

    # ---- input

    def _fill(self, limit: float) -> bool:
        """Read once (bounded by `limit`, a monotonic time); False at EOF."""
        if self.eof:
            return False
        remaining = limit - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no answer from the broker in time")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError as exc:
            raise TimeoutError("no answer from the broker in time") from exc
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buffer += data
        return True

    def read_frame(self, timeout: float = READ_TIMEOUT) -> Received | None:
        """The next frame, or None once the broker has closed the socket."""
        limit = time.monotonic() + timeout
        while True:
            item = _split_one(self.buffer)
            if item is not None:
                self.received.append(item)
                return item
            if not self._fill(limit):
                if self.buffer:
                    raise MalformedReply(f"socket closed after a partial frame {bytes(self.buffer)[:64]!r}")
                return None

    def read_until(self, kind: type, timeout: float = READ_TIMEOUT, channel: int | None = None) -> Any:
        """Read (and keep in `received`) until a frame of type `kind` arrives; return its value."""
        limit = time.monotonic() + timeout
        while True:
            item = self.read_frame(max(limit - time.monotonic(), 0.001))
            if item is None:
                seen = ", ".join(r.name for r in self.received[-8:])
                raise AssertionError(f"socket closed while waiting for {kind.__name__}; last frames: {seen}")
            if isinstance(item.value, kind) and (channel is None or item.channel == channel):
                return item.value

    def expect_connection_close(self, timeout: float = READ_TIMEOUT, *, close_ok: bool = True) -> Any:
        """Wait for connection.close from the broker; answer close-ok; return the close method."""
        close = self.read_until(commands.Connection.Close, timeout)
        if close_ok:
            with contextlib.suppress(OSError):
                self.send_method(0, commands.Connection.CloseOk())
        return close

    def expect_eof(self, timeout: float = READ_TIMEOUT) -> list[Received]:
        """Read until the broker closes the socket (bounded); return the frames read on the way."""
        limit = time.monotonic() + timeout
        frames = []
        while True:
            item = self.read_frame(max(limit - time.monotonic(), 0.001))
            if item is None:
                return frames
            frames.append(item)

    def read_raw_until_eof(self, timeout: float = READ_TIMEOUT) -> bytes:
        """Every byte the broker sends until it closes the socket, unparsed (bounded)."""
        limit = time.monotonic() + timeout
        while self._fill(limit):
            pass
        data = bytes(self.buffer)
        self.buffer.clear()
        return data

    def quiet_for(self, seconds: float) -> list[Received]:
        """Frames that arrive within `seconds` (an observation window; EOF ends it early)."""
        limit = time.monotonic() + seconds
        frames = []
        while time.monotonic() < limit:
            try:
                item = self.read_frame(max(limit - time.monotonic(), 0.001))
            except TimeoutError:
                break
            if item is None:
                break
            frames.append(item)
        return frames

    def close_connection(self) -> None:
        """connection.close 200 and wait (bounded) for close-ok and the closed socket."""
        self.send_method(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        self.read_until(commands.Connection.CloseOk)
        self.expect_eof()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- bystanders


@dataclass
class _Bystander:
    index: int
    connection: pika.BlockingConnection
    queue: str
    sentinel: bytes


@dataclass
class Bystanders:
    """A healthy pika client on every worker, each with one message queued before the test.

    `check()` proves each client still works (a confirmed publish and a basic.get round trip)
    and that its queued message is still there; `check_pids()` that no broker process was
    replaced; `finish()` takes the queued messages and compares them.
    """

    broker: Broker
    members: list[_Bystander] = field(default_factory=list)
    supervisor_pid: int = 0
    worker_pids: tuple[int, ...] = ()

    @classmethod
    def start(cls, broker: Broker) -> Bystanders:
        group = cls(broker, supervisor_pid=broker.pid, worker_pids=broker.worker_pids)
        connections = broker.connections_on_workers(range(broker.workers))
        for index, connection in sorted(connections.items()):
            channel = connection.channel()
            channel.confirm_delivery()
            queue = f"bystander.{uuid.uuid4().hex[:12]}"
            channel.queue_declare(queue, auto_delete=False)
            sentinel = f"queued before the bad client, worker {index}".encode()
            channel.basic_publish("", queue, sentinel)
            group.members.append(_Bystander(index, connection, queue, sentinel))
        return group

    def covers(self, worker_index: int) -> bool:
        return any(member.index == worker_index for member in self.members)

    def check_pids(self) -> None:
        """No broker process died or was replaced (checked on the processes themselves: the ready
        file names a replacement only once it is up)."""
        assert self.broker.popen.poll() is None, "the supervisor exited"
        dead = [pid for pid in (self.supervisor_pid, *self.worker_pids) if not process_alive(pid)]
        assert not dead, f"broker process(es) {dead} died"
        assert self.broker.worker_pids == self.worker_pids, (
            f"a worker was replaced: {self.worker_pids} -> {self.broker.worker_pids}"
        )

    def check(self) -> None:
        """Every bystander still works and still has its queued message; no process replaced."""
        self.check_pids()
        try:
            self._check_members()
        except (AssertionError, pika.exceptions.AMQPError) as exc:
            # Say so if a broker process died (it may still have been exiting a moment ago).
            time.sleep(0.5)
            self.check_pids()
            raise AssertionError(f"a bystander failed: {exc!r}") from exc

    def _check_members(self) -> None:
        for member in self.members:
            assert member.connection.is_open, f"bystander on worker {member.index} was disconnected"
            channel = member.connection.channel()
            channel.confirm_delivery()
            probe = f"probe {uuid.uuid4().hex}".encode()
            scratch = channel.queue_declare("", exclusive=True).method.queue
            channel.basic_publish("", scratch, probe)
            method, _properties, body = channel.basic_get(scratch, auto_ack=True)
            assert method is not None and body == probe, f"bystander on worker {member.index}: round trip failed"
            depth = channel.queue_declare(member.queue, passive=True).method.message_count
            assert depth == 1, f"bystander queue {member.queue} has {depth} messages, expected 1"
            channel.close()

    def finish(self) -> None:
        """Check once more, then take every queued message and compare it with what was sent."""
        self.check()
        for member in self.members:
            channel = member.connection.channel()
            method, _properties, body = channel.basic_get(member.queue, auto_ack=True)
            assert method is not None and body == member.sentinel, (
                f"message queued on worker {member.index} before the test was lost or changed: {body!r}"
            )
            channel.queue_delete(member.queue)
            channel.close()

    def close(self) -> None:
        for member in self.members:
            close_quietly(member.connection)


def process_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def unique_name(label: str = "q") -> str:
    """An entity name made only of characters every client library accepts."""
    return f"shoal-test.{label}.{uuid.uuid4().hex[:12]}"


def worker_connection_count(process: psutil.Process, port: int) -> int:
    """TCP connections of a worker process on the broker's port (accepted, not yet closed)."""
    return sum(
        1 for conn in process.net_connections(kind="tcp")
        if conn.laddr and conn.laddr.port == port and conn.raddr
    )


def describe(frames: Iterable[Received]) -> str:
    return ", ".join(f"ch{r.channel}:{r.name}" for r in frames)


__all__ = [
    "Bystanders",
    "MalformedReply",
    "RawClient",
    "Received",
    "body_frame",
    "describe",
    "handshake_bytes",
    "header_frame",
    "method_frame",
    "method_payload",
    "parse_frames",
    "process_alive",
    "publish_frames",
    "raw_frame",
    "start_ok",
    "unique_name",
    "worker_connection_count",
]
