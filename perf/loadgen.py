"""Load generator processes: raw-socket AMQP publishers, consumers and idle connections.

Each runs in its own process (multiprocessing, 'spawn'), is handed its job as a plain dict plus a
few shared objects, and reports back one dict on a Pipe. None of them waits without a bound:

- a **publisher** sends pre-encoded frames (`perf.wire.PublishBatch`) as fast as it may: at most
  `window` messages ahead of the slowest queue it feeds (consumers publish their progress in
  `multiprocessing.RawValue`s), or paced at `rate` msg/s; it stops at `count` messages or after
  `seconds`, whichever is first;
- a **consumer** sets prefetch, consumes with manual acks, acks `multiple=True` every `ack_every`
  deliveries (and whatever is pending when the socket goes quiet) or, with `ack_single`, sends
  one `multiple=false` ack per delivery (the overload scenarios' shape), and parses deliveries with
  `perf.wire.DeliveryParser`; it stops when the orchestrator sets `stop` (or at `hard_deadline`);
- **idle** opens `connections` connections with channel 1 open and holds them until `stop`.

Every process measures its own CPU (`resource.getrusage`) over its active window; the orchestrator
flags a run where any of them used more than 80 % of a core as generator-bound.
"""

from __future__ import annotations

import resource
import select
import socket
import struct
import time
import traceback
from typing import Any

from pamqp import commands, frame

from perf.wire import (
    BrokerClosed,
    Client,
    DeliveryParser,
    ProtocolError,
    PublishBatch,
    ack_frame,
    publish_template,
    split_frames,
    worker_of,
)

SEND_CHUNK = 64 * 1024  # a publisher writes about this much per send
RECV_BUFFER = 4 * 1024 * 1024
POLL = 0.1  # socket timeout between checks of `stop`
READY_WAIT = 60.0  # how long a client waits for `go`
_METHOD_ACK = struct.Struct(">HHQB")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, ProtocolError | TimeoutError | OSError):
        return f"{type(exc).__name__}: {exc}"
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


# --------------------------------------------------------------------------- publisher


class _Incoming:
    """What a publisher reads: confirms (Basic.Ack/Nack, fast path) and anything fatal."""

    def __init__(self, sock: socket.socket, initial: bytes):
        self.sock = sock
        self.buf = bytearray(initial)
        self.confirmed = 0  # highest delivery tag confirmed (multiple acks make it a count)
        self.nacked = 0
        self.other: list[Any] = []

    def poll(self) -> None:
        """Read whatever is there without blocking; raise BrokerClosed on Connection/Channel.Close."""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:
                raise ProtocolError("the broker closed the socket")
            self.buf += chunk
            if len(chunk) < 65536:
                break
        if not self.buf:
            return
        frames, used = split_frames(self.buf)
        del self.buf[:used]
        for _channel, raw in frames:
            if raw[0] == 1 and len(raw) == 21 and raw[7:11] in (b"\x00<\x00P", b"\x00<\x00x"):
                _cls, method, tag, _bits = _METHOD_ACK.unpack_from(raw, 7)
                if method == 120:
                    self.nacked += 1
                self.confirmed = max(self.confirmed, tag)
                continue
            if raw[0] == 8:
                continue
            value = frame.unmarshal(raw)[2]
            if isinstance(value, commands.Connection.Close | commands.Channel.Close):
                raise BrokerClosed(f"{type(value).__name__} {value.reply_code} {value.reply_text}")
            self.other.append(value)


def _send(sock: socket.socket, view: memoryview, incoming: _Incoming, hard_deadline: float) -> None:
    """Write all of `view` to the non-blocking socket, reading what arrives meanwhile."""
    while view:
        try:
            sent = sock.send(view)
        except (BlockingIOError, InterruptedError):
            if time.monotonic() > hard_deadline:
                raise TimeoutError("the broker stopped reading (send blocked past the deadline)") from None
            readable, _w, _x = select.select([sock], [sock], [], POLL)
            if readable:
                incoming.poll()
            continue
        view = view[sent:]


def publisher_main(job: dict[str, Any], shared: dict[str, Any], pipe: Any) -> None:
    result: dict[str, Any] = {"role": "publisher", "id": job["id"], "published": 0, "error": None}
    published = shared["published"]
    client: Client | None = None
    try:
        client = Client(job["port"])
        result["worker"] = worker_of(client.server_properties)
        if job.get("confirm"):
            client.confirm_select()
        template, patch_at = publish_template(
            job["exchange"], job["routing_key"], job["body_size"], job["id"], client.frame_max
        )
        rate = float(job.get("rate") or 0)
        capacity = 1 if rate else max(1, min(job.get("batch", 256), SEND_CHUNK // len(template)))
        batch = PublishBatch(template, patch_at, capacity)
        sock = client.sock
        sock.setblocking(False)
        incoming = _Incoming(sock, client.take_buffered())
        window = int(job.get("window") or 0)
        watch = shared.get("watch") or []  # per queue fed: the RawValues of that queue's consumers
        count = int(job["count"])
        shared["ready"].set()
        if not shared["go"].wait(READY_WAIT):
            raise TimeoutError("no go signal")
        stop = shared["stop"]
        cpu0, started = _cpu_seconds(), time.monotonic()
        deadline = started + float(job["seconds"])
        hard_deadline = deadline + float(job.get("grace", 30.0))
        sent = 0
        rounds = 0
        monotonic, monotonic_ns, sleep = time.monotonic, time.monotonic_ns, time.sleep
        while sent < count:
            now = monotonic()
            if now >= deadline:
                break
            rounds += 1
            if rounds & 15 == 0:
                if stop.is_set():
                    break
                incoming.poll()
            n = min(capacity, count - sent)
            if rate:
                due = started + sent / rate
                if due > now:
                    sleep(due - now)
            elif window:
                if watch:
                    behind = min(sum(v.value for v in group) for group in watch)
                else:  # no consumers to follow: stay within `window` unconfirmed messages
                    behind = incoming.confirmed if job.get("confirm") else sent
                room = window - (sent - behind)
                if room <= 0:
                    incoming.poll()
                    sleep(0.0005)
                    continue
                n = min(n, room)
            _send(sock, batch.fill(n, sent, monotonic_ns()), incoming, hard_deadline)
            sent += n
            published.value = sent
        finished = time.monotonic()
        cpu = _cpu_seconds() - cpu0
        result.update(published=sent, wall_s=finished - started, cpu_s=cpu, started=started, finished=finished)
        shared["done"].value = 1
        if job.get("confirm"):
            limit = time.monotonic() + 10.0
            while incoming.confirmed < sent and time.monotonic() < limit:
                select.select([sock], [], [], POLL)
                incoming.poll()
            result["confirmed"] = incoming.confirmed
            result["nacked"] = incoming.nacked
        # Hold the connection until the orchestrator has seen the consumers drain.
        while not stop.wait(POLL):
            incoming.poll()
            if time.monotonic() > hard_deadline + 60:
                break
    except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
        result["error"] = _error_text(exc)
        result["published"] = published.value
    finally:
        shared["done"].value = 1
        if client is not None:
            try:
                client.sock.setblocking(True)
            except OSError:
                pass
            client.close()
        pipe.send(result)
        pipe.close()


# --------------------------------------------------------------------------- consumer


def consumer_main(job: dict[str, Any], shared: dict[str, Any], pipe: Any) -> None:
    """Consume job["queue"]; report counts, per-publisher arrival marks and latencies."""
    parser = DeliveryParser(job["capacities"])
    result: dict[str, Any] = {"role": "consumer", "name": job["name"], "queue": job["queue"], "error": None}
    received_value = shared["received"]
    client: Client | None = None
    first_ns = last_ns = 0
    cpu0 = started = None
    try:
        client = Client(job["port"])
        result["worker"] = worker_of(client.server_properties)
        client.qos(int(job["prefetch"]), bool(job.get("global_qos")))
        queues = job["queue"].split(",")  # several: a consumer on each, on the one channel
        for i, queue in enumerate(queues):
            client.consume(queue, tag=job["name"] if len(queues) == 1 else f"{job['name']}.{i}")
        sock = client.sock
        sock.settimeout(POLL)
        buf = bytearray(RECV_BUFFER)
        view = memoryview(buf)
        leftover = client.take_buffered()
        buf[: len(leftover)] = leftover
        pos, end = 0, len(leftover)
        ack_every = max(1, int(job["ack_every"]))
        ack_single = bool(job.get("ack_single"))  # basic.ack multiple=false for every delivery
        ack_rate = float(job.get("ack_rate") or 0.0)
        acked = 0
        acked_tag = 0
        shared["ready"].set()
        if not shared["go"].wait(READY_WAIT):
            raise TimeoutError("no go signal")
        stop = shared["stop"]
        cpu0, started = _cpu_seconds(), time.monotonic()
        hard_deadline = started + float(job["hard_seconds"])
        monotonic_ns = time.monotonic_ns
        sendall = sock.sendall
        parse = parser.parse
        capacity = len(buf)
        rounds = 0
        while True:
            try:
                n = sock.recv_into(view[end:])
            except TimeoutError:
                if parser.received > acked:
                    sendall(ack_frame(1, parser.last_tag))
                    acked = parser.received
                if stop.is_set() or time.monotonic() > hard_deadline:
                    break
                continue
            if not n:
                raise ProtocolError("the broker closed the socket")
            now = monotonic_ns()
            end += n
            before = parser.received
            pos = parse(buf, pos, end, now)
            if parser.received != before:
                if not first_ns:
                    first_ns = now
                last_ns = now
                received_value.value = parser.received
                if ack_rate:  # a slow application: each delivery takes 1/ack_rate s, then its ack
                    for t in range(acked_tag + 1, parser.last_tag + 1):
                        time.sleep(max(0.0, started + t / ack_rate - time.monotonic()))
                        sendall(ack_frame(1, t, multiple=False))
                    acked_tag = parser.last_tag
                    acked = parser.received
                elif ack_single:
                    tag = parser.last_tag
                    if tag > acked_tag:  # delivery tags of a channel run 1, 2, 3, ...: one ack each
                        sendall(b"".join(ack_frame(1, t, multiple=False) for t in range(acked_tag + 1, tag + 1)))
                        acked_tag = tag
                    acked = parser.received  # so the multiple=true acks below never fire
                elif parser.received - acked >= ack_every:
                    sendall(ack_frame(1, parser.last_tag))
                    acked = parser.received
            if parser.other:
                for value in parser.other:
                    if isinstance(value, commands.Connection.Close | commands.Channel.Close):
                        raise BrokerClosed(f"{type(value).__name__} {value.reply_code} {value.reply_text}")
                    if isinstance(value, commands.Basic.Cancel):
                        raise BrokerClosed("the broker cancelled the consumer (Basic.Cancel)")
                parser.other.clear()
            if pos == end:
                pos = end = 0
            elif capacity - end < 262144:
                buf[: end - pos] = buf[pos:end]
                end -= pos
                pos = 0
            rounds += 1
            if rounds & 63 == 0 and (stop.is_set() or time.monotonic() > hard_deadline):
                break
        if parser.received > acked:
            sendall(ack_frame(1, parser.last_tag))
    except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
        result["error"] = _error_text(exc)
    finally:
        finished = time.monotonic()
        if cpu0 is not None and started is not None:
            active_end = last_ns / 1e9 if last_ns else finished
            result["cpu_s"] = _cpu_seconds() - cpu0
            result["wall_s"] = max(active_end - started, 1e-6)
            result["started"] = started
        result.update(
            received=parser.received,
            duplicates=parser.duplicates,
            reordered=parser.reordered,
            redelivered=parser.redelivered,
            foreign=parser.foreign,
            first_ns=first_ns,
            last_ns=last_ns,
            longest_gap_ns=parser.longest_gap_ns,
            seen=[bytes(marks) for marks in parser.seen],
            latencies_us=parser.latencies_us.tobytes(),
        )
        received_value.value = parser.received
        if client is not None:
            try:
                client.sock.settimeout(2.0)
            except OSError:
                pass
            client.close()
        pipe.send(result)
        pipe.close()


# --------------------------------------------------------------------------- idle connections


def idle_main(job: dict[str, Any], shared: dict[str, Any], pipe: Any) -> None:
    """Open job["connections"] connections (handshake + channel 1), hold them until `stop`."""
    result: dict[str, Any] = {"role": "idle", "opened": 0, "error": None, "workers": {}}
    clients: list[Client] = []
    close = frame.marshal(commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0)
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = job["connections"] + 64
        if soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, want), hard))
        limit = time.monotonic() + float(job.get("open_seconds", 120))
        for _ in range(job["connections"]):
            if time.monotonic() > limit:
                raise TimeoutError(f"opened only {len(clients)} connections in time")
            client = Client(job["port"])
            clients.append(client)
            worker = worker_of(client.server_properties)
            result["workers"][worker] = result["workers"].get(worker, 0) + 1
            shared["received"].value = len(clients)
    except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
        result["error"] = _error_text(exc)
    result["opened"] = len(clients)
    try:
        shared["ready"].set()
        shared["stop"].wait(float(job.get("hold_seconds", 600)))
        for client in clients:  # Connection.Close on every one, then the sockets
            try:
                client.sock.sendall(close)
            except OSError:
                pass
        time.sleep(0.2)
    finally:
        for client in clients:
            try:
                client.sock.close()
            except OSError:
                pass
        pipe.send(result)
        pipe.close()
