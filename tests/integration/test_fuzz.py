"""Property-based fuzzing of a worker's input (hypothesis): random and mutated frame streams.

Each example opens a raw TCP connection, writes one byte stream and either half-closes (then
reads whatever the broker answers until it closes the socket, bounded) or resets the connection
at once. The streams are

- mutations of valid sessions (handshake, channel.open, declares, publishes with their content
  frames, consume / get / ack / nack, confirms, close): bytes flipped, a frame's size, type or
  channel rewritten, frames dropped, duplicated, swapped or truncated, garbage inserted;
- well-formed sessions of random client methods with random arguments on channels 1-3
  (declares with random x-arguments, queue and exchange binds, deletes, qos, consume / cancel,
  get, ack / nack / reject with made-up delivery tags, publishes with random properties and body
  sizes, confirms, transactions, flow, direct reply-to, channel open / close),
  with names drawn from a small pool so the commands run into each other;
- random bytes, bare or after a valid protocol header or a complete handshake.

Properties, checked after every example:
- the broker never crashes: the supervisor and both worker PIDs are the ones from the start
  (`Bystanders.check_pids` looks at the processes themselves, not only at the ready file);
- what the broker wrote back is well-formed AMQP (the 0-9-1 protocol header, or whole frames that
  pamqp decodes), and any connection.close it sent carries an error code;
- a healthy pika client on every worker keeps working (confirmed publish + basic.get), and the
  message each had queued before the fuzzing started is still there;
and once at the end:
- no leak: each worker's count of TCP connections on the broker port goes back to the
  bystanders' own, its open file descriptors stay within a small margin of where they started,
  and the queue the fuzz sessions consumed from has no consumer left.

Bounded: `MAX_EXAMPLES` examples, no shrinking (a crash would make every later example fail, so
shrinking could not find a smaller cause; the failing stream is printed in full instead),
`derandomize=True` so CI runs the same examples every time.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pika
import psutil
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pamqp import commands

from tests.integration.harness import HOST, Broker, wait_until
from tests.integration.pika_helpers import queue_exists
from tests.integration.rawclient import (
    ERROR_CLOSE_CODES,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    Bystanders,
    MalformedReply,
    handshake_bytes,
    method_frame,
    parse_frames,
    publish_frames,
    unique_name,
    worker_connection_count,
)

MAX_EXAMPLES = 200
EXAMPLE_DEADLINE = timedelta(seconds=8)
EOF_TIMEOUT = 5.0  # the broker must close a half-closed connection within this
FD_MARGIN = 8

# Names the seed sessions use; SHARED is declared by the test (not exclusive) so that fuzz
# sessions can consume from it and the test can check they all left.
SHARED = unique_name("fuzz-shared")
SCRATCH = "fuzz.scratch"


def _session(*frames: bytes) -> list[bytes]:
    return [*handshake_bytes(frame_max=4096), method_frame(1, commands.Channel.Open()), *frames]


def _close(channel: int = 1) -> list[bytes]:
    return [
        method_frame(channel, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)),
        method_frame(0, commands.Connection.Close(reply_code=200, reply_text="", class_id=0, method_id=0)),
    ]


# Valid sessions to mutate: together they use every method the broker implements today.
SEEDS: list[list[bytes]] = [
    _session(
        method_frame(1, commands.Confirm.Select()),
        *publish_frames(1, "", SHARED, b"fuzz message", frame_max=4096),
        *publish_frames(1, "amq.direct", "nowhere", b"returned", mandatory=True, frame_max=4096),
        *publish_frames(1, "", SHARED, b"b" * 5000, frame_max=4096),
        HEARTBEAT_FRAME,
        *_close(),
    ),
    _session(
        method_frame(1, commands.Basic.Qos(prefetch_count=2)),
        method_frame(1, commands.Basic.Consume(queue=SHARED, consumer_tag="fuzz")),
        method_frame(1, commands.Basic.Ack(delivery_tag=1)),
        method_frame(1, commands.Basic.Nack(delivery_tag=2, requeue=True)),
        method_frame(1, commands.Basic.Reject(delivery_tag=3, requeue=False)),
        method_frame(1, commands.Basic.Cancel(consumer_tag="fuzz")),
        method_frame(1, commands.Basic.Recover(requeue=True)),
        *_close(),
    ),
    _session(
        method_frame(1, commands.Queue.Declare(queue="", exclusive=True)),
        method_frame(1, commands.Queue.Bind(queue="", exchange="amq.topic", routing_key="fuzz.#")),
        *publish_frames(1, "amq.topic", "fuzz.a.b", b"topic", frame_max=4096),
        method_frame(1, commands.Basic.Get(queue="", no_ack=False)),
        method_frame(1, commands.Basic.Ack(delivery_tag=0, multiple=True)),
        method_frame(1, commands.Exchange.Declare(exchange="fuzz.x", exchange_type="fanout", auto_delete=True)),
        method_frame(1, commands.Queue.Unbind(queue="", exchange="amq.topic", routing_key="fuzz.#")),
        method_frame(1, commands.Queue.Purge(queue="")),
        method_frame(1, commands.Queue.Delete(queue="")),
        method_frame(1, commands.Exchange.Delete(exchange="fuzz.x")),
        *_close(),
    ),
    _session(
        method_frame(2, commands.Channel.Open()),
        method_frame(1, commands.Basic.Get(queue=SHARED, no_ack=True)),
        method_frame(2, commands.Channel.Flow(active=False)),
        method_frame(2, commands.Basic.Consume(queue=SHARED, no_ack=True, exclusive=False)),
        method_frame(2, commands.Channel.Flow(active=True)),
        method_frame(1, commands.Queue.Declare(queue=SHARED, passive=True)),
        method_frame(1, commands.Queue.Declare(queue=SCRATCH, auto_delete=True, arguments={"x-priority": 3})),
        *_close(2),
    ),
]


# --------------------------------------------------------------------------- mutations


HANDSHAKE_CHUNKS = len(handshake_bytes())


def _frame_spans(stream: list[bytes]) -> list[int]:
    """Indexes of the chunks that are frames (not the protocol header)."""
    return [i for i, chunk in enumerate(stream) if chunk != PROTOCOL_HEADER and len(chunk) >= 8]


@dataclass(frozen=True)
class Mutation:
    kind: str
    target: int  # chunk index (taken modulo the number of chunks)
    position: int  # byte offset (taken modulo the chunk length)
    value: int
    data: bytes = b""

    def apply(self, stream: list[bytes]) -> list[bytes]:
        if not stream:
            return stream
        stream = list(stream)
        frames = _frame_spans(stream) or [0]
        # Mostly past the handshake (chunks 0-3): a broken handshake ends a session early.
        past = [i for i in frames if i >= HANDSHAKE_CHUNKS]
        pool = past if past and self.target >= 8 else frames
        index = pool[self.target % len(pool)]
        chunk = stream[index]
        if self.kind == "flip" and chunk:
            pos = self.position % len(chunk)
            stream[index] = chunk[:pos] + bytes([self.value & 0xFF]) + chunk[pos + 1:]
        elif self.kind == "size" and len(chunk) >= 7:
            size = struct.unpack_from(">I", chunk, 3)[0]
            new = self.value if self.value >= 0 else max(size + self.value % 17 - 8, 0)
            stream[index] = chunk[:3] + struct.pack(">I", new & 0xFFFFFFFF) + chunk[7:]
        elif self.kind == "type" and chunk:
            stream[index] = bytes([self.value & 0xFF]) + chunk[1:]
        elif self.kind == "channel" and len(chunk) >= 3:
            stream[index] = chunk[:1] + struct.pack(">H", self.value & 0xFFFF) + chunk[3:]
        elif self.kind == "drop":
            del stream[index]
        elif self.kind == "duplicate":
            stream.insert(index, chunk)
        elif self.kind == "swap":
            other = frames[self.position % len(frames)]
            stream[index], stream[other] = stream[other], stream[index]
        elif self.kind == "truncate":
            stream = stream[: index + 1]
            stream[index] = chunk[: self.position % (len(chunk) + 1)]
        elif self.kind == "insert":
            stream.insert(index, self.data)
        elif self.kind == "end":
            stream[index] = chunk[:-1] + bytes([self.value & 0xFF])
        return stream


_sizes = st.one_of(
    st.integers(min_value=-1, max_value=-1),  # a small change of the true size
    st.sampled_from([0, 1, 3, 4, 7, 4088, 4095, 4096, 4097, 131072, 2**31, 2**32 - 1]),
    st.integers(min_value=0, max_value=2**32 - 1),
)
mutations = st.one_of(
    st.builds(Mutation, st.just("flip"), st.integers(0, 63), st.integers(0, 4096), st.integers(0, 255)),
    st.builds(Mutation, st.just("size"), st.integers(0, 63), st.just(0), _sizes),
    st.builds(Mutation, st.just("type"), st.integers(0, 63), st.just(0),
              st.sampled_from([0, 1, 2, 3, 4, 8, 9, 0xCE, 0xFF])),
    st.builds(Mutation, st.just("channel"), st.integers(0, 63), st.just(0),
              st.sampled_from([0, 1, 2, 3, 2047, 2048, 65535])),
    st.builds(Mutation, st.just("drop"), st.integers(0, 63), st.just(0), st.just(0)),
    st.builds(Mutation, st.just("duplicate"), st.integers(0, 63), st.just(0), st.just(0)),
    st.builds(Mutation, st.just("swap"), st.integers(0, 63), st.integers(0, 63), st.just(0)),
    st.builds(Mutation, st.just("truncate"), st.integers(0, 63), st.integers(0, 4096), st.just(0)),
    st.builds(Mutation, st.just("insert"), st.integers(0, 63), st.just(0), st.just(0),
              st.binary(min_size=1, max_size=64)),
    st.builds(Mutation, st.just("end"), st.integers(0, 63), st.just(0), st.integers(0, 255)),
)


@st.composite
def mutated_sessions(draw: st.DrawFn) -> bytes:
    seed = draw(st.sampled_from(range(len(SEEDS))))
    stream = SEEDS[seed]
    for mutation in draw(st.lists(mutations, min_size=1, max_size=4)):
        stream = mutation.apply(stream)
    return b"".join(stream)


random_streams = st.one_of(
    st.binary(min_size=1, max_size=512),
    st.binary(max_size=512).map(lambda data: PROTOCOL_HEADER + data),
    st.binary(max_size=512).map(lambda data: b"".join(handshake_bytes(frame_max=4096)) + data),
    st.binary(max_size=512).map(
        lambda data: b"".join(_session()) + b"\x01\x00\x01" + struct.pack(">I", len(data)) + data + b"\xce"
    ),
)

# Well-formed but arbitrary: random sequences of the methods a client may send, with random
# arguments, on random channels (names from a small pool, so that commands meet each other's
# queues, exchanges, consumers and delivery tags). The pool holds only names pamqp's queue-name
# regexp accepts, because these frames are built with pamqp, which refuses the others; the broker
# accepts any shortstr name (test_negative.py::test_any_shortstr_queue_name_is_accepted sends
# such names as raw bytes).
_queues = st.sampled_from(["", SHARED, SCRATCH, "fuzz.q1", "fuzz.q2", "amq.gen-absent", "amq.reserved",
                           "amq.rabbitmq.reply-to"])
_exchanges = st.sampled_from(["", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match",
                              "fuzz.x", "fuzz.absent", "amq.fuzz"])
_keys = st.sampled_from(["", "fuzz.q1", "fuzz.q2", SHARED, "a.b", "a.*", "#", "*.b.#"])
_tags = st.sampled_from(["", "fuzz", "fuzz-2"])
_channels = st.integers(min_value=1, max_value=3)
_small = st.integers(min_value=0, max_value=12)
_table_values = st.one_of(st.booleans(), st.integers(-2**31, 2**31 - 1), st.integers(0, 300), st.text(max_size=8),
                          st.sampled_from(["all", "any", "all-with-x", "any-with-x", "bogus", "drop-head",
                                           "reject-publish", "reject-publish-dlx", "fuzz.x", "amq.fanout"]))
_arguments = st.dictionaries(
    st.sampled_from(["x-match", "x-priority", "x-browse", "x-message-ttl", "x-expires", "x-max-length",
                     "x-max-length-bytes", "x-overflow", "x-dead-letter-exchange", "x-dead-letter-routing-key",
                     "x-max-priority", "x-single-active-consumer", "x-delivery-limit", "x-queue-type",
                     "alternate-exchange", "colour", "size"]),
    _table_values, max_size=3,
)
_properties = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | st.just("text/plain"),
    headers=st.none() | _arguments,
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 9),
    expiration=st.none() | st.sampled_from(["0", "10", "60000"]),
    message_id=st.none() | st.text(max_size=8),
    reply_to=st.none() | st.sampled_from(["amq.rabbitmq.reply-to", "fuzz.q1"]),
)


def _publish(channel: int, exchange: str, key: str, mandatory: bool, size: int,
             properties: commands.Basic.Properties) -> bytes:
    return b"".join(publish_frames(channel, exchange, key, bytes(size), mandatory=mandatory,
                                   frame_max=4096, properties=properties))


_command = st.one_of(
    st.builds(lambda ch, q, p, d, e, a, args: method_frame(ch, commands.Queue.Declare(
        queue=q, passive=p, durable=d, exclusive=e, auto_delete=a, arguments=args)),
        _channels, _queues, st.booleans(), st.booleans(), st.booleans(), st.booleans(), _arguments),
    st.builds(lambda ch, q, x, k, args: method_frame(ch, commands.Queue.Bind(
        queue=q, exchange=x, routing_key=k, arguments=args)), _channels, _queues, _exchanges, _keys, _arguments),
    st.builds(lambda ch, q, x, k: method_frame(ch, commands.Queue.Unbind(queue=q, exchange=x, routing_key=k)),
              _channels, _queues, _exchanges, _keys),
    st.builds(lambda ch, q: method_frame(ch, commands.Queue.Purge(queue=q)), _channels, _queues),
    st.builds(lambda ch, q, u, e: method_frame(ch, commands.Queue.Delete(queue=q, if_unused=u, if_empty=e)),
              _channels, _queues, st.booleans(), st.booleans()),
    st.builds(lambda ch, x, t, p, a, i, args: method_frame(ch, commands.Exchange.Declare(
        exchange=x, exchange_type=t, passive=p, auto_delete=a, internal=i, arguments=args)),
        _channels, _exchanges, st.sampled_from(["direct", "fanout", "topic", "headers", "x-bogus"]),
        st.booleans(), st.booleans(), st.booleans(), _arguments),
    st.builds(lambda ch, x, u: method_frame(ch, commands.Exchange.Delete(exchange=x, if_unused=u)),
              _channels, _exchanges, st.booleans()),
    st.builds(lambda ch, s, c, g: method_frame(ch, commands.Basic.Qos(prefetch_size=s, prefetch_count=c, global_=g)),
              _channels, st.sampled_from([0, 0, 0, 1]), st.integers(0, 65535) | _small, st.booleans()),
    st.builds(lambda ch, q, t, n, e, args: method_frame(ch, commands.Basic.Consume(
        queue=q, consumer_tag=t, no_ack=n, exclusive=e, arguments=args)),
        _channels, _queues, _tags, st.booleans(), st.booleans(), _arguments),
    st.builds(lambda ch, t: method_frame(ch, commands.Basic.Cancel(consumer_tag=t)), _channels, _tags),
    st.builds(lambda ch, q, n: method_frame(ch, commands.Basic.Get(queue=q, no_ack=n)), _channels, _queues,
              st.booleans()),
    st.builds(lambda ch, t, m: method_frame(ch, commands.Basic.Ack(delivery_tag=t, multiple=m)),
              _channels, _small, st.booleans()),
    st.builds(lambda ch, t, m, r: method_frame(ch, commands.Basic.Nack(delivery_tag=t, multiple=m, requeue=r)),
              _channels, _small, st.booleans(), st.booleans()),
    st.builds(lambda ch, t, r: method_frame(ch, commands.Basic.Reject(delivery_tag=t, requeue=r)),
              _channels, _small, st.booleans()),
    st.builds(lambda ch, r: method_frame(ch, commands.Basic.Recover(requeue=r)), _channels, st.booleans()),
    st.builds(_publish, _channels, _exchanges, _keys, st.booleans(), st.integers(0, 9000), _properties),
    st.builds(lambda ch, d, src, k, args: method_frame(ch, commands.Exchange.Bind(
        destination=d, source=src, routing_key=k, arguments=args)),
              _channels, _exchanges, _exchanges, _keys, _arguments),
    st.builds(lambda ch, d, src, k: method_frame(ch, commands.Exchange.Unbind(
        destination=d, source=src, routing_key=k)), _channels, _exchanges, _exchanges, _keys),
    st.builds(lambda ch: method_frame(ch, commands.Confirm.Select()), _channels),
    st.builds(lambda ch: method_frame(ch, commands.Tx.Select()), _channels),
    st.builds(lambda ch: method_frame(ch, commands.Tx.Commit()), _channels),
    st.builds(lambda ch: method_frame(ch, commands.Tx.Rollback()), _channels),
    st.builds(lambda ch, a: method_frame(ch, commands.Channel.Flow(active=a)), _channels, st.booleans()),
    st.builds(lambda ch: method_frame(ch, commands.Channel.Open()), _channels),
    st.builds(lambda ch: method_frame(ch, commands.Channel.Close(reply_code=200, reply_text="", class_id=0,
                                                                 method_id=0)), _channels),
    st.builds(lambda ch: method_frame(ch, commands.Channel.CloseOk()), _channels),
    st.just(HEARTBEAT_FRAME),
)


@st.composite
def command_sessions(draw: st.DrawFn) -> bytes:
    opened = [method_frame(ch, commands.Channel.Open()) for ch in (1, 2, 3)]
    body = draw(st.lists(_command, min_size=1, max_size=30))
    return b"".join([*handshake_bytes(frame_max=4096), *opened, *body])


streams = st.tuples(st.one_of(mutated_sessions(), mutated_sessions(), command_sessions(), random_streams),
                    st.sampled_from(["half-close", "half-close", "reset"]))


# --------------------------------------------------------------------------- one example


def _run_stream(port: int, stream: bytes, ending: str) -> bytes:
    """Send `stream`; return what the broker wrote back ("reset": nothing is read)."""
    sock = socket.create_connection((HOST, port), timeout=EOF_TIMEOUT)
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(stream)
        if ending == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return b""
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        received = bytearray()
        limit = time.monotonic() + EOF_TIMEOUT
        while True:
            sock.settimeout(max(limit - time.monotonic(), 0.001))
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            except TimeoutError as exc:
                raise AssertionError(
                    f"the broker kept a half-closed connection open for {EOF_TIMEOUT:g} s"
                ) from exc
            if not data:
                break
            received += data
        return bytes(received)
    finally:
        sock.close()


def _check_reply(reply: bytes) -> str:
    """The broker's answer is whole, well-formed AMQP 0-9-1; a connection.close is an error.
    Returns a one-line summary of the answer (counted, and printed at the end)."""
    if reply == PROTOCOL_HEADER:
        return "protocol header"
    frames, tail = parse_frames(reply)
    assert not tail, f"the broker's answer ends in a partial frame: {tail[:64]!r}"
    for received in frames:
        assert received.value != PROTOCOL_HEADER or received is frames[0], "protocol header mid-stream"
        if isinstance(received.value, commands.Connection.Close):
            assert received.value.reply_code in ERROR_CLOSE_CODES, received.value
    closes = [r.value.reply_code for r in frames if isinstance(r.value, commands.Connection.Close)]
    if closes:
        return f"connection.close {closes[0]}"
    if any(isinstance(r.value, commands.Connection.OpenOk) for r in frames):
        return "opened, no error"
    return "closed before open" if frames else "no answer"


# --------------------------------------------------------------------------- the test


@pytest.fixture
def bystanders(broker: Broker) -> Iterator[Bystanders]:
    group = Bystanders.start(broker)
    yield group
    group.close()


def _fds(process: psutil.Process) -> int:
    return process.num_fds()


@pytest.mark.deadline(150)
def test_fuzzed_frame_streams_never_crash_leak_or_hurt_a_neighbour(broker: Broker, bystanders: Bystanders) -> None:
    workers = {pid: psutil.Process(pid) for pid in broker.worker_pids}
    admin = broker.connect().channel()
    admin.queue_declare(SHARED)
    for i in range(20):
        admin.basic_publish("", SHARED, f"for the fuzzers {i}".encode())
    baseline_conns = {pid: worker_connection_count(p, broker.port) for pid, p in workers.items()}
    baseline_fds = {pid: _fds(p) for pid, p in workers.items()}
    examples = []
    outcomes: Counter[str] = Counter()

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=EXAMPLE_DEADLINE,
        derandomize=True,
        database=None,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        report_multiple_bugs=False,
    )
    @given(streams)
    def fuzz(case: tuple[bytes, str]) -> None:
        stream, ending = case
        examples.append(len(stream))
        try:
            reply = _run_stream(broker.port, stream, ending)
            outcomes["reset" if ending == "reset" else _check_reply(reply)] += 1
            bystanders.check()
        except (AssertionError, MalformedReply) as exc:
            raise AssertionError(
                f"{exc}\n-- the stream ({ending}, {len(stream)} octets): {stream.hex()}"
            ) from exc

    fuzz()
    print(f"{len(examples)} streams, {sum(examples)} octets; answers: {dict(outcomes.most_common())}")
    assert len(examples) >= MAX_EXAMPLES // 2

    # No leak: the fuzz connections are all gone from the workers, descriptors are back.
    def settled() -> bool:
        return all(worker_connection_count(p, broker.port) <= baseline_conns[pid] for pid, p in workers.items())

    wait_until(settled, 10.0, "the workers to drop every fuzz connection")
    for pid, process in workers.items():
        assert _fds(process) <= baseline_fds[pid] + FD_MARGIN, (
            f"worker {pid}: {baseline_fds[pid]} fds before the fuzzing, {_fds(process)} after"
        )
    # The fuzz sessions may have deleted the shared queue (queue.delete is in their repertoire);
    # if it is there, no fuzz consumer is left on it and every message it reports can be taken.
    if queue_exists(admin.connection, SHARED):
        shared = wait_until(
            lambda: (ok := admin.queue_declare(SHARED, passive=True).method).consumer_count == 0 and ok,
            10.0, "the fuzz consumers to leave the shared queue",
        )
        drained = 0
        while admin.basic_get(SHARED, auto_ack=True)[0] is not None:
            drained += 1
        # Fewer than counted is fine: messages with an `expiration` behind others are counted
        # until they reach the head (as in RabbitMQ). None may remain counted but unreachable.
        assert drained <= shared.message_count
        left = admin.queue_declare(SHARED, passive=True).method.message_count
        assert left == 0, f"{left} message(s) counted on the shared queue that basic.get cannot take"
        admin.queue_delete(SHARED)
    for name in (SCRATCH, "fuzz.q1", "fuzz.q2"):
        with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
            broker.connect().channel().queue_delete(name)
    bystanders.finish()
