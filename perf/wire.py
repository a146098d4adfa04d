"""The load generator's AMQP 0-9-1 wire code: a blocking setup client, pre-encoded publish frames
and a cheap delivery parser.

Everything that happens once per connection (the handshake, declares, qos, consume) goes through
pamqp. Everything that happens once per message does not:

- `PublishBatch` marshals Basic.Publish + content header + body frame(s) once with pamqp, repeats
  that template `batch` times in one bytearray, and per message patches only the sequence number
  and the CLOCK_MONOTONIC timestamp into the body (`struct.pack_into`);
- `DeliveryParser.parse` walks received bytes with `struct.unpack_from`: Basic.Deliver gives the
  delivery tag, the first body frame gives (publisher, sequence, timestamp); everything else that
  is a method frame is handed to pamqp and queued for the caller (`other`).

The body of every message starts with `PAYLOAD` = magic, publisher id, sequence, send time:

    <H magic 0x5348 ("SH")> <H publisher> <Q sequence> <Q time.monotonic_ns() at send>

CLOCK_MONOTONIC is one clock for every process of the host, so the consumer's
`monotonic_ns() - timestamp` is the end-to-end latency.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from array import array
from typing import Any

from pamqp import commands, frame, header
from pamqp.body import ContentBody
from pamqp.common import FieldTable
from pamqp.heartbeat import Heartbeat

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = 0xCE
PAYLOAD = struct.Struct("<HHQQ")
PAYLOAD_SIZE = PAYLOAD.size  # 20
MAGIC = 0x5348
SEQ_TS = struct.Struct("<QQ")  # the patched part of PAYLOAD, at offset 4
FRAME_HEAD = struct.Struct(">BHI")
CLIENT_FRAME_MAX = 131072
_ACK = struct.Struct(">BHIHHQBB")  # method frame: Basic.Ack(tag, multiple)


class ProtocolError(Exception):
    """The peer sent something the load generator cannot continue after."""


class BrokerClosed(ProtocolError):
    """The broker closed the connection or the channel (Connection.Close / Channel.Close)."""


# --------------------------------------------------------------------------- frames


def split_frames(data: bytes | bytearray | memoryview) -> tuple[list[tuple[int, bytes]], int]:
    """Complete frames in `data` as (channel, raw frame bytes) and how many bytes they used."""
    out: list[tuple[int, bytes]] = []
    pos, end = 0, len(data)
    while end - pos >= 7:
        _ftype, channel, size = FRAME_HEAD.unpack_from(data, pos)
        fend = pos + 8 + size
        if fend > end:
            break
        if data[fend - 1] != FRAME_END:
            raise ProtocolError(f"frame without frame-end at offset {pos}")
        out.append((channel, bytes(data[pos:fend])))
        pos = fend
    return out, pos


def ack_frame(channel: int, delivery_tag: int, multiple: bool = True) -> bytes:
    """Basic.Ack as one method frame (13 byte payload)."""
    return _ACK.pack(1, channel, 13, 60, 80, delivery_tag, 1 if multiple else 0, FRAME_END)


def publish_template(
    exchange: str, routing_key: str, body_size: int, publisher: int, frame_max: int, channel: int = 1,
    *, delivery_mode: int | None = None,
) -> tuple[bytes, int]:
    """One message's frames (Basic.Publish, content header, body frames) and the offset in them of
    the 16 bytes (sequence, timestamp) to patch per message. ``delivery_mode`` 2: persistent."""
    if body_size < PAYLOAD_SIZE:
        raise ValueError(f"bodies must be at least {PAYLOAD_SIZE} bytes")
    body = bytearray(body_size)
    PAYLOAD.pack_into(body, 0, MAGIC, publisher, 0, 0)
    for i in range(PAYLOAD_SIZE, body_size):
        body[i] = 0x61 + i % 26
    parts = [
        frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel),
        frame.marshal(header.ContentHeader(
            0, body_size, commands.Basic.Properties(delivery_mode=delivery_mode)), channel),
    ]
    patch_at = len(parts[0]) + len(parts[1]) + 7 + 4
    chunk = frame_max - 8
    for start in range(0, body_size, chunk):
        parts.append(frame.marshal(ContentBody(bytes(body[start : start + chunk])), channel))
    return b"".join(parts), patch_at


class PublishBatch:
    """`capacity` copies of one message's frames; `fill(n, seq, ts)` stamps the first n."""

    def __init__(self, template: bytes, patch_at: int, capacity: int):
        self.message_size = len(template)
        self.capacity = max(1, capacity)
        self.buffer = bytearray(template * self.capacity)
        self.view = memoryview(self.buffer)
        self.offsets = [i * self.message_size + patch_at for i in range(self.capacity)]

    def fill(self, count: int, first_seq: int, timestamp_ns: int) -> memoryview:
        pack_into, buffer = SEQ_TS.pack_into, self.buffer
        seq = first_seq
        for offset in self.offsets[:count]:
            pack_into(buffer, offset, seq, timestamp_ns)
            seq += 1
        return self.view[: count * self.message_size]


# --------------------------------------------------------------------------- the delivery parser


class DeliveryParser:
    """Finds Basic.Deliver / content header / body frames with struct and keeps the accounting.

    Per publisher (ids 0..len(capacities)-1) a bytearray with one byte per possible sequence
    number marks what arrived; a sequence seen twice is a duplicate, a sequence below the highest
    one already seen from that publisher (and not a duplicate) is a reordering. A message counts
    (`received`, `last_tag`: what the consumer may ack) once its last body frame is in, as a
    client library hands it over; its latency (microseconds, `now_ns` given per parse call, the
    sender's stamp from its first body frame) goes to `latencies_us`. `longest_gap_ns` is the
    longest time between two parse calls that completed messages: a stall in the broker (a lost
    wake-up, a timer) shows there before it moves a percentile.
    """

    def __init__(self, capacities: list[int]):
        self.seen = [bytearray(c) for c in capacities]
        self.highest = [-1] * len(capacities)
        self.received = 0
        self.duplicates = 0
        self.reordered = 0
        self.redelivered = 0
        self.foreign = 0  # bodies without our payload, or with an unknown publisher/sequence
        self.last_tag = 0
        self.latencies_us = array("q")
        self.longest_gap_ns = 0
        self._last_arrival_ns = 0  # the last parse call that completed a message
        self.other: list[Any] = []  # pamqp objects of any other method frame
        self._body_left = 0
        self._first_body = False
        self._tag = 0  # the delivery tag of the message whose content is coming
        self._stamp: tuple[int, int, int, int] | None = None  # its first body frame's payload

    def parse(self, buf: bytearray | memoryview, pos: int, end: int, now_ns: int) -> int:
        """Consume complete frames of buf[pos:end]; return the offset of the first incomplete one."""
        unpack_head = FRAME_HEAD.unpack_from
        unpack_payload = PAYLOAD.unpack_from
        unpack_q = struct.unpack_from
        seen, highest, lat_append = self.seen, self.highest, self.latencies_us.append
        npub = len(seen)
        received = self.received
        while end - pos >= 7:
            ftype, _ch, size = unpack_head(buf, pos)
            fend = pos + 8 + size
            if fend > end:
                break
            if buf[fend - 1] != FRAME_END:
                raise ProtocolError(f"frame without frame-end (type {ftype}, size {size})")
            p = pos + 7
            if ftype == 3:
                if self._first_body:
                    self._first_body = False
                    self._stamp = unpack_payload(buf, p) if size >= 20 else None
                self._body_left -= size
                if self._body_left <= 0:
                    self.received += 1
                    self.last_tag = self._tag
                    stamp = self._stamp
                    if stamp is not None and stamp[0] == MAGIC and stamp[1] < npub \
                            and stamp[2] < len(seen[stamp[1]]):
                        _magic, pub, seq, ts = stamp
                        marks = seen[pub]
                        if marks[seq]:
                            self.duplicates += 1
                        else:
                            marks[seq] = 1
                            if seq < highest[pub]:
                                self.reordered += 1
                            else:
                                highest[pub] = seq
                        lat_append((now_ns - ts) // 1000)
                    else:
                        self.foreign += 1
            elif ftype == 1:
                if buf[p + 1] == 60 and buf[p + 3] == 60:  # Basic.Deliver (60, 60)
                    tag_at = p + 5 + buf[p + 4]
                    self._tag = unpack_q(">Q", buf, tag_at)[0]
                    if buf[tag_at + 8] & 1:
                        self.redelivered += 1
                else:
                    self.other.append(frame.unmarshal(bytes(buf[pos:fend]))[2])
            elif ftype == 2:
                size_left = unpack_q(">Q", buf, p + 4)[0]
                self._body_left = size_left
                self._first_body = size_left > 0
                if not size_left:
                    self.received += 1
                    self.last_tag = self._tag
                    self.foreign += 1
            elif ftype != 8:
                raise ProtocolError(f"unknown frame type {ftype}")
            pos = fend
        if self.received != received:
            if self._last_arrival_ns and now_ns - self._last_arrival_ns > self.longest_gap_ns:
                self.longest_gap_ns = now_ns - self._last_arrival_ns
            self._last_arrival_ns = now_ns
        return pos


# --------------------------------------------------------------------------- the setup client


class Client:
    """A blocking AMQP connection for everything that is not per-message: the handshake
    (PLAIN guest/guest, heartbeat 0, channel 1), declares, bindings, qos, consume, confirm.select.
    The hot loops take `sock` over afterwards."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0, channel: bool = True):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self._buf = bytearray()
        self.frame_max = CLIENT_FRAME_MAX
        self.server_properties: dict[str, Any] = {}
        self.sock.sendall(PROTOCOL_HEADER)
        start = self.expect(commands.Connection.Start, channel=0)
        self.server_properties = dict(start.server_properties or {})
        self.send(
            commands.Connection.StartOk(
                client_properties=FieldTable(product="shoal-perf", capabilities={}),
                mechanism="PLAIN",
                response="\0guest\0guest",
                locale="en_US",
            ),
            channel=0,
        )
        tune = self.expect(commands.Connection.Tune, channel=0)
        if tune.frame_max:
            self.frame_max = min(tune.frame_max, CLIENT_FRAME_MAX)
        self.send(
            commands.Connection.TuneOk(channel_max=tune.channel_max or 2047, frame_max=self.frame_max, heartbeat=0),
            channel=0,
        )
        self.call(commands.Connection.Open(virtual_host="/"), commands.Connection.OpenOk, channel=0)
        if channel:
            self.call(commands.Channel.Open(), commands.Channel.OpenOk)

    # ---- raw frames

    def send(self, method: Any, channel: int = 1) -> None:
        self.sock.sendall(frame.marshal(method, channel))

    def read_frame(self) -> tuple[int, Any]:
        limit = time.monotonic() + self.timeout
        while True:
            frames, _used = split_frames(self._buf)
            if frames:
                channel, raw = frames[0]
                del self._buf[: len(raw)]
                return channel, frame.unmarshal(raw)[2]
            if time.monotonic() > limit:
                raise TimeoutError("no frame from the broker")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ProtocolError("the broker closed the socket")
            self._buf += chunk

    def expect(self, kind: type, channel: int = 1) -> Any:
        while True:
            ch, value = self.read_frame()
            if isinstance(value, Heartbeat):
                continue
            if isinstance(value, commands.Connection.Close):
                raise BrokerClosed(f"connection closed: {value.reply_code} {value.reply_text}")
            if isinstance(value, commands.Channel.Close):
                raise BrokerClosed(f"channel closed: {value.reply_code} {value.reply_text}")
            if isinstance(value, kind) and ch == channel:
                return value
            raise ProtocolError(f"expected {kind.__name__} on channel {channel}, got {value!r} on {ch}")

    def call(self, method: Any, reply: type, channel: int = 1) -> Any:
        self.send(method, channel)
        return self.expect(reply, channel)

    def take_buffered(self) -> bytes:
        """Bytes read past the last frame `expect` returned (the hot loop continues from them)."""
        data, self._buf = bytes(self._buf), bytearray()
        return data

    # ---- AMQP conveniences

    def queue_declare(self, name: str, passive: bool = False, durable: bool = False) -> int:
        ok = self.call(commands.Queue.Declare(queue=name, passive=passive, durable=durable),
                       commands.Queue.DeclareOk)
        return int(ok.message_count)

    def queue_delete(self, name: str) -> None:
        self.call(commands.Queue.Delete(queue=name), commands.Queue.DeleteOk)

    def exchange_declare(self, name: str, kind: str) -> None:
        self.call(commands.Exchange.Declare(exchange=name, exchange_type=kind), commands.Exchange.DeclareOk)

    def exchange_delete(self, name: str) -> None:
        self.call(commands.Exchange.Delete(exchange=name), commands.Exchange.DeleteOk)

    def queue_bind(self, queue: str, exchange: str, routing_key: str = "") -> None:
        self.call(
            commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=routing_key), commands.Queue.BindOk
        )

    def qos(self, prefetch: int, global_: bool = False) -> None:
        """basic.qos; ``global_``: the channel's consumers share the prefetch (RabbitMQ's
        reading of global=true, which celery asks for)."""
        self.call(commands.Basic.Qos(prefetch_count=prefetch, global_=global_), commands.Basic.QosOk)

    def consume(self, queue: str, tag: str = "perf") -> None:
        self.call(commands.Basic.Consume(queue=queue, consumer_tag=tag), commands.Basic.ConsumeOk)

    def confirm_select(self) -> None:
        self.call(commands.Confirm.Select(), commands.Confirm.SelectOk)

    def close(self, timeout: float = 2.0) -> None:
        """Connection.Close, wait (bounded) for Close-Ok, close the socket; never raises."""
        try:
            self.sock.settimeout(timeout)
            self.timeout = timeout
            self.send(commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), channel=0)
            limit = time.monotonic() + timeout
            while time.monotonic() < limit:
                _ch, value = self.read_frame()
                if isinstance(value, commands.Connection.CloseOk | commands.Connection.Close):
                    break
        except Exception:  # noqa: BLE001, S110 - closing is best effort
            pass
        finally:
            with contextlib.suppress(OSError):
                self.sock.close()


def worker_of(properties: dict[str, Any]) -> int | None:
    """Shoal's `shoal_worker` server property (which worker took the connection), if any."""
    value = properties.get("shoal_worker")
    return int(value) if value is not None else None


__all__ = [
    "MAGIC",
    "PAYLOAD",
    "PAYLOAD_SIZE",
    "BrokerClosed",
    "Client",
    "DeliveryParser",
    "ProtocolError",
    "PublishBatch",
    "ack_frame",
    "publish_template",
    "split_frames",
    "worker_of",
]
