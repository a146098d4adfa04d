"""Bad input, sent as raw bytes: every malformed or illegal input gets the reply code the spec
(and RabbitMQ) names, and hurts no one else.

Each test keeps a healthy pika client connected to every worker of the broker (so one shares the
misbehaving client's worker, whichever it lands on), each with a message queued before the bad
client connected (`rawclient.Bystanders`). At the end every bystander must still do a confirmed
publish and a basic.get round trip, its queued message must still be there, and no broker process
may have been replaced.

Where a test names RabbitMQ's behaviour it is rabbit_reader / rabbit_command_assembler /
rabbit_channel's: frame errors are 501 FRAME_ERROR, a frame the assembler does not expect is 505
UNEXPECTED_FRAME, a method on a channel that is not open (or a second channel.open) is 504
CHANNEL_ERROR, and errors before the connection is open close the socket without a word, except a
refused login from a client with the `authentication_failure_close` capability (403).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import pytest
from pamqp import commands

from tests.integration.harness import Broker, wait_until
from tests.integration.rawclient import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    FRAME_BODY,
    FRAME_ERROR,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PROTOCOL_HEADER,
    UNEXPECTED_FRAME,
    Bystanders,
    RawClient,
    body_frame,
    describe,
    header_frame,
    method_frame,
    method_payload,
    publish_frames,
    raw_frame,
    start_ok,
    unique_name,
)


@pytest.fixture
def bystanders(shared_broker: Broker) -> Iterator[Bystanders]:
    group = Bystanders.start(shared_broker)
    yield group
    group.close()


def _connection_closed_with(raw: RawClient, code: int, bystanders: Bystanders) -> commands.Connection.Close:
    """The broker answers with connection.close `code`, then closes the socket."""
    assert bystanders.covers(raw.worker)
    close = raw.expect_connection_close()
    assert close.reply_code == code, f"expected {code}, got {close.reply_code} {close.reply_text!r}"
    assert close.reply_text.startswith(_REPLY_NAMES[code]), close.reply_text
    raw.expect_eof()
    return close


def _channel_close() -> commands.Channel.Close:
    return commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)


_REPLY_NAMES = {
    403: "ACCESS_REFUSED", 404: "NOT_FOUND", 501: "FRAME_ERROR", 503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR", 505: "UNEXPECTED_FRAME", 540: "NOT_IMPLEMENTED",
}


# --------------------------------------------------------------------------- protocol header


@pytest.mark.parametrize(
    "header",
    [
        pytest.param(b"AMQP\x00\x01\x00\x00", id="amqp-1.0"),
        pytest.param(b"AMQP\x03\x01\x00\x00", id="amqp-1.0-sasl"),
        pytest.param(b"AMQP\x01\x01\x00\x0a", id="amqp-0-10"),
        pytest.param(b"AMQP\x00\x00\x09\x00", id="amqp-0-9-0"),
        pytest.param(b"AMQP\x00\x00\x0a\x00", id="amqp-0-10-0"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: shoal\r\n\r\n", id="http"),
        pytest.param(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", id="tls-client-hello"),
    ],
)
def test_wrong_protocol_header_gets_the_091_header_and_a_closed_socket(
    shared_broker: Broker, bystanders: Bystanders, header: bytes
) -> None:
    """AMQP 0-9-1 §4.2.2: a server that does not speak the client's protocol answers with the
    protocol header it does support, then closes the socket."""
    with RawClient(shared_broker.port) as raw:
        raw.send(header)
        assert raw.read_raw_until_eof() == PROTOCOL_HEADER
    bystanders.finish()


def test_protocol_header_sent_one_byte_at_a_time_is_accepted(shared_broker: Broker, bystanders: Bystanders) -> None:
    """The header may arrive in pieces; the broker waits for all eight octets."""
    with RawClient(shared_broker.port) as raw:
        for octet in PROTOCOL_HEADER:
            raw.send(bytes([octet]))
        start = raw.read_until(commands.Connection.Start)
        assert (start.version_major, start.version_minor) == (0, 9)
    bystanders.finish()


def test_garbage_instead_of_a_protocol_header(shared_broker: Broker, bystanders: Bystanders) -> None:
    """Plain garbage as the first bytes is a wrong protocol header."""
    garbage = b"\x00\xff" + random.Random(4).randbytes(4094)
    with RawClient(shared_broker.port) as raw:
        raw.send(garbage)
        assert raw.read_raw_until_eof() == PROTOCOL_HEADER
    bystanders.finish()


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"\x00" * 64, id="zeros"),
        pytest.param(b"\xff" + random.Random(7).randbytes(4095), id="random"),
        pytest.param(b"hello, is this thing on?\r\n" * 8, id="text"),
    ],
)
def test_garbage_after_the_handshake_is_501(shared_broker: Broker, bystanders: Bystanders, garbage: bytes) -> None:
    """Garbage where a frame should start is an unknown frame type (or a frame too large):
    501 FRAME_ERROR, then the socket is closed (RabbitMQ: fatal_frame_error)."""
    with RawClient.opened(shared_broker.port) as raw:
        raw.send(garbage)
        _connection_closed_with(raw, FRAME_ERROR, bystanders)
    bystanders.finish()


# --------------------------------------------------------------------------- framing


@pytest.mark.parametrize(
    "bad_frame",
    [
        pytest.param(raw_frame(FRAME_METHOD, 2, method_payload(20, 10, b"\x00"), end=0x00), id="method"),
        pytest.param(raw_frame(FRAME_HEARTBEAT, 0, b"", end=0xCD), id="heartbeat"),
        pytest.param(raw_frame(FRAME_METHOD, 0, method_payload(10, 50, b"\x00\xc8\x00\x00\x00\x00\x00"),
                               end=ord("A")), id="connection-close"),
    ],
)
def test_bad_frame_end_octet_is_501(shared_broker: Broker, bystanders: Bystanders, bad_frame: bytes) -> None:
    with RawClient.opened(shared_broker.port) as raw:
        raw.send(bad_frame)
        close = _connection_closed_with(raw, FRAME_ERROR, bystanders)
        assert "frame end" in close.reply_text
    bystanders.finish()


def test_bad_frame_end_octet_in_a_body_frame_loses_the_publish(
    shared_broker: Broker, bystanders: Bystanders
) -> None:
    queue = unique_name("q")
    keeper = shared_broker.connect().channel()
    keeper.queue_declare(queue)
    with RawClient.opened(shared_broker.port) as raw:
        publish, content_header, body = publish_frames(1, "", queue, b"payload")
        raw.send(publish, content_header, body[:-1] + b"\x00")
        _connection_closed_with(raw, FRAME_ERROR, bystanders)
    assert keeper.queue_declare(queue, passive=True).method.message_count == 0
    bystanders.finish()


def test_frame_over_frame_max_is_501_before_its_payload_arrives(shared_broker: Broker, bystanders: Bystanders) -> None:
    """A frame header announcing more than the negotiated frame_max is refused at once: the
    broker does not wait for (or buffer) the payload."""
    with RawClient.opened(shared_broker.port, frame_max=4096) as raw:
        raw.send(b"\x03\x00\x01" + (4097).to_bytes(4, "big"))  # a body frame header, nothing else
        close = _connection_closed_with(raw, FRAME_ERROR, bystanders)
        assert "frame too large" in close.reply_text
    bystanders.finish()


def test_frame_over_frame_max_is_501_whole(shared_broker: Broker, bystanders: Bystanders) -> None:
    queue = unique_name("q")
    keeper = shared_broker.connect().channel()
    keeper.queue_declare(queue)
    with RawClient.opened(shared_broker.port, frame_max=4096) as raw:
        body = b"x" * 5000
        raw.send(*publish_frames(1, "", queue, body, frame_max=8192))  # one 5000-octet body frame
        _connection_closed_with(raw, FRAME_ERROR, bystanders)
    assert keeper.queue_declare(queue, passive=True).method.message_count == 0
    bystanders.finish()


def test_frame_of_exactly_frame_max_is_accepted(shared_broker: Broker, bystanders: Bystanders) -> None:
    """The limit itself is allowed: RabbitMQ tolerates payloads up to frame_max (not frame_max - 8,
    its FRAME_SIZE_FUDGE), and so does Shoal."""
    queue = unique_name("q")
    keeper = shared_broker.connect().channel()
    keeper.queue_declare(queue)
    with RawClient.opened(shared_broker.port, frame_max=4096) as raw:
        raw.send(*publish_frames(1, "", queue, b"y" * 4096, frame_max=4096 + 8))
        raw.send_method(1, commands.Basic.Get(queue=queue, no_ack=True))
        get_ok = raw.read_until(commands.Basic.GetOk)
        assert get_ok.routing_key == queue
        raw.close_connection()
    bystanders.finish()


# --------------------------------------------------------------------------- methods


@pytest.mark.parametrize(
    ("channel", "class_id", "method_id"),
    [
        pytest.param(1, 999, 10, id="unknown-class"),
        pytest.param(1, 60, 999, id="unknown-basic-method"),
        pytest.param(1, 90, 99, id="unknown-tx-method"),
        pytest.param(0, 10, 99, id="unknown-connection-method"),
    ],
)
def test_unknown_class_or_method_is_540(
    shared_broker: Broker, bystanders: Bystanders, channel: int, class_id: int, method_id: int
) -> None:
    """A method id the spec does not define is 540 NOT_IMPLEMENTED, naming the ids."""
    with RawClient.opened(shared_broker.port) as raw:
        raw.send(raw_frame(FRAME_METHOD, channel, method_payload(class_id, method_id, b"\x00\x00\x00\x00")))
        close = _connection_closed_with(raw, NOT_IMPLEMENTED, bystanders)
        assert (close.class_id, close.method_id) == (class_id, method_id)
    bystanders.finish()


@pytest.mark.parametrize(
    "method",
    [
        pytest.param(commands.Queue.Declare(queue="never-declared"), id="queue.declare"),
        pytest.param(commands.Basic.Publish(routing_key="never-declared"), id="basic.publish"),
        pytest.param(commands.Basic.Consume(queue="never-declared"), id="basic.consume"),
        pytest.param(commands.Basic.Ack(delivery_tag=1), id="basic.ack"),
    ],
)
def test_method_on_an_unopened_channel_is_504(
    shared_broker: Broker, bystanders: Bystanders, method: Any
) -> None:
    """rabbit_channel: "expected 'channel.open'" (504 CHANNEL_ERROR, a connection error)."""
    with RawClient.opened(shared_broker.port) as raw:
        raw.send(method_frame(5, method))
        close = _connection_closed_with(raw, CHANNEL_ERROR, bystanders)
        assert (close.class_id, close.method_id) == (method.index >> 16, method.index & 0xFFFF)
    bystanders.finish()


def test_method_on_a_closed_channel_is_504(shared_broker: Broker, bystanders: Bystanders) -> None:
    """A channel the client closed (close / close-ok done) is unopened again."""
    with RawClient.opened(shared_broker.port) as raw:
        raw.send_method(1, _channel_close())
        raw.read_until(commands.Channel.CloseOk, channel=1)
        raw.send_method(1, commands.Queue.Declare(queue="", exclusive=True))
        _connection_closed_with(raw, CHANNEL_ERROR, bystanders)
    bystanders.finish()


def test_methods_on_a_closing_channel_are_discarded_until_close_ok(
    shared_broker: Broker, bystanders: Bystanders
) -> None:
    """After the broker sends channel.close, every frame on that channel but channel.close and
    close-ok is discarded (AMQP 0-9-1 channel.close; rabbit_channel's `closing` state): no
    answer, no effect, no error. After close-ok the channel number can be opened again."""
    absent, would_be = unique_name("absent"), unique_name("would-be")
    with RawClient.opened(shared_broker.port) as raw:
        raw.send_method(1, commands.Queue.Declare(queue=absent, passive=True))
        close = raw.read_until(commands.Channel.Close, channel=1)
        assert close.reply_code == NOT_FOUND
        # The channel is closing: all of these must be dropped without a reply.
        raw.send(
            method_frame(1, commands.Queue.Declare(queue=would_be)),
            *publish_frames(1, "", would_be, b"never routed"),
            header_frame(1, 5),  # would be 505 on an open channel
            body_frame(1, b"stray"),
            method_frame(1, commands.Channel.Open()),  # would be 504 on an open channel
            method_frame(1, commands.Basic.Consume(queue=would_be)),
            raw_frame(FRAME_HEARTBEAT, 1, b""),
        )
        seen = raw.quiet_for(0.5)
        assert seen == [], f"the broker answered frames on a closing channel: {describe(seen)}"
        raw.send_method(1, commands.Channel.CloseOk())
        raw.open_channel(1)
        raw.send_method(1, commands.Queue.Declare(queue=would_be, passive=True))
        assert raw.read_until(commands.Channel.Close, channel=1).reply_code == NOT_FOUND
        raw.send_method(1, commands.Channel.CloseOk())
        raw.close_connection()
    bystanders.finish()


def test_channel_close_crossing_the_brokers_close_gets_close_ok(
    shared_broker: Broker, bystanders: Bystanders
) -> None:
    """Both sides closing a channel at once: the broker answers the client's channel.close with
    close-ok even while it waits for its own (rabbit_channel does the same)."""
    with RawClient.opened(shared_broker.port) as raw:
        raw.send_method(1, commands.Queue.Declare(queue=unique_name("absent"), passive=True))
        raw.read_until(commands.Channel.Close, channel=1)
        raw.send_method(1, _channel_close())  # as if sent before the broker's close arrived
        raw.read_until(commands.Channel.CloseOk, channel=1)
        raw.send_method(1, commands.Channel.CloseOk())
        raw.open_channel(1)
    bystanders.finish()


@pytest.mark.parametrize(
    ("frames", "state"),
    [
        pytest.param([header_frame(1, 3)], "idle", id="header-on-idle-channel"),
        pytest.param([body_frame(1, b"abc")], "idle", id="body-on-idle-channel"),
        pytest.param([header_frame(0, 3)], "channel-0", id="header-on-channel-0"),
        pytest.param([body_frame(0, b"abc")], "channel-0", id="body-on-channel-0"),
        pytest.param([header_frame(3, 3)], "unopened", id="header-on-unopened-channel"),
        pytest.param([method_frame(1, commands.Basic.Publish(routing_key="x")), body_frame(1, b"abc")],
                     "awaiting header", id="body-instead-of-header"),
        pytest.param([method_frame(1, commands.Basic.Publish(routing_key="x")),
                      method_frame(1, commands.Basic.Qos(prefetch_count=1))],
                     "awaiting header", id="method-instead-of-header"),
        pytest.param([*publish_frames(1, "", "x", b"abcdef")[:2], method_frame(1, commands.Basic.Qos())],
                     "awaiting body", id="method-instead-of-body"),
        pytest.param([raw_frame(FRAME_HEARTBEAT, 1, b"")], "idle", id="heartbeat-on-channel-1"),
    ],
)
def test_content_frame_out_of_place_is_505(
    shared_broker: Broker, bystanders: Bystanders, frames: list[bytes], state: str
) -> None:
    """A content header without a publish (or a frame the assembler does not expect next)
    is 505 UNEXPECTED_FRAME; a heartbeat on a non-zero channel too (rabbit_reader
    unexpected_frame)."""
    with RawClient.opened(shared_broker.port) as raw:
        raw.send(*frames)
        _connection_closed_with(raw, UNEXPECTED_FRAME, bystanders)
    bystanders.finish()


def test_content_header_for_another_class_is_505(shared_broker: Broker, bystanders: Bystanders) -> None:
    with RawClient.opened(shared_broker.port) as raw:
        raw.send(method_frame(1, commands.Basic.Publish(routing_key="x")), header_frame(1, 3, class_id=50))
        _connection_closed_with(raw, UNEXPECTED_FRAME, bystanders)
    bystanders.finish()


@pytest.mark.parametrize(
    "bodies",
    [
        pytest.param([b"0123456789"], id="one-frame"),
        pytest.param([b"01", b"23456789"], id="second-frame"),
    ],
)
def test_body_longer_than_its_header_said_is_501(
    shared_broker: Broker, bystanders: Bystanders, bodies: list[bytes]
) -> None:
    """rabbit_command_assembler: a body frame beyond the announced size is a frame_error (501),
    not 505; and the message is not routed."""
    queue = unique_name("q")
    keeper = shared_broker.connect().channel()
    keeper.queue_declare(queue)
    with RawClient.opened(shared_broker.port) as raw:
        raw.send(
            method_frame(1, commands.Basic.Publish(routing_key=queue)),
            header_frame(1, 3),
            *(body_frame(1, chunk) for chunk in bodies),
        )
        _connection_closed_with(raw, FRAME_ERROR, bystanders)
    assert keeper.queue_declare(queue, passive=True).method.message_count == 0
    bystanders.finish()


def test_second_channel_open_is_504(shared_broker: Broker, bystanders: Bystanders) -> None:
    """rabbit_channel: "second 'channel.open' seen" (504 CHANNEL_ERROR)."""
    with RawClient.opened(shared_broker.port) as raw:
        raw.send_method(1, commands.Channel.Open())
        close = _connection_closed_with(raw, CHANNEL_ERROR, bystanders)
        assert (close.class_id, close.method_id) == (20, 10)
    bystanders.finish()


def test_connection_usable_up_to_the_bad_frame(shared_broker: Broker, bystanders: Bystanders) -> None:
    """Frames before the bad one in the same write are handled: a publish pipelined ahead of a
    frame error is routed."""
    queue = unique_name("q")
    keeper = shared_broker.connect().channel()
    keeper.queue_declare(queue)
    with RawClient.opened(shared_broker.port) as raw:
        raw.send(*publish_frames(1, "", queue, b"before the error"), raw_frame(FRAME_BODY, 1, b"x", end=0))
        _connection_closed_with(raw, FRAME_ERROR, bystanders)
    # The keeper may be on the other worker, whose ring the supervisor reads apart from the
    # closed connection's: the publish reaches its view within moments (bounded wait).
    _method, _properties, body = wait_until(
        lambda: (got := keeper.basic_get(queue, auto_ack=True))[0] is not None and got,
        10, "the pipelined publish to reach the queue")
    assert body == b"before the error"
    bystanders.finish()


# --------------------------------------------------------------------------- login


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
@pytest.mark.parametrize(("user", "password"), [("guest", "wrong"), ("nobody", "guest")])
def test_bad_login_with_authentication_failure_close_is_403(
    shared_broker: Broker, bystanders: Bystanders, mechanism: str, user: str, password: str
) -> None:
    """A client that advertises `authentication_failure_close` gets connection.close
    403 ACCESS_REFUSED (and never a connection.tune)."""
    with RawClient(shared_broker.port) as raw:
        raw.send(PROTOCOL_HEADER)
        raw.start = raw.read_until(commands.Connection.Start)
        raw.send(start_ok(user, password, mechanism=mechanism, auth_failure_close=True))
        close = _connection_closed_with(raw, ACCESS_REFUSED, bystanders)
        assert f"mechanism {mechanism}" in close.reply_text
        assert not any(isinstance(r.value, commands.Connection.Tune) for r in raw.received)
    bystanders.finish()


def test_bad_login_without_the_capability_just_closes_the_socket(
    shared_broker: Broker, bystanders: Bystanders
) -> None:
    """Without the capability the spec's answer is a closed socket, nothing else
    (RabbitMQ: "we don't trust the client at this point")."""
    with RawClient(shared_broker.port) as raw:
        raw.send(PROTOCOL_HEADER)
        raw.start = raw.read_until(commands.Connection.Start)
        raw.send(start_ok("guest", "wrong", auth_failure_close=False))
        after = raw.expect_eof()
        assert after == [], f"expected a silent close, got {describe(after)}"
    bystanders.finish()


def test_unknown_sasl_mechanism_closes_the_socket(shared_broker: Broker, bystanders: Bystanders) -> None:
    """An unknown mechanism is a handshake error (RabbitMQ: command_invalid while starting):
    the socket is closed without a connection.close."""
    with RawClient(shared_broker.port) as raw:
        raw.send(PROTOCOL_HEADER)
        raw.start = raw.read_until(commands.Connection.Start)
        raw.send(method_frame(0, commands.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="EXTERNAL", response="")))
        after = raw.expect_eof()
        assert after == [], f"expected a silent close, got {describe(after)}"
    bystanders.finish()


def test_pika_bad_login_is_an_authentication_error(shared_broker: Broker, bystanders: Bystanders) -> None:
    """pika advertises authentication_failure_close, so it learns why it was refused."""
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as caught:
        shared_broker.connect(credentials=pika.PlainCredentials("guest", "not the password"))
    assert "ACCESS_REFUSED" in str(caught.value)
    bystanders.finish()


# --------------------------------------------------------------------------- many at once


def test_many_bad_clients_at_once(shared_broker: Broker, bystanders: Bystanders) -> None:
    """Forty misbehaving connections in flight together, of every kind above; afterwards the
    bystanders are fine and the workers hold no socket for them."""
    kinds = [
        b"GET / HTTP/1.0\r\n\r\n",
        b"AMQP\x00\x00\x09\x01" + b"\xff" * 32,
        b"AMQP\x00\x00\x09\x01" + start_ok("guest", "wrong", auth_failure_close=False),
        b"AMQP\x00\x00\x09\x01" + start_ok() + b"\x01\x00\x00\xff\xff\xff\xff",
    ]
    clients = [RawClient(shared_broker.port) for _ in range(40)]
    try:
        for i, client in enumerate(clients):
            client.send(kinds[i % len(kinds)])
        for client in clients:
            client.read_raw_until_eof()
    finally:
        for client in clients:
            client.close()
    bystanders.finish()


# --------------------------------------------------------------------------- names


def test_any_shortstr_queue_name_is_accepted(broker: Broker) -> None:
    """RabbitMQ takes any UTF-8 short string (but the amq. prefix) as a queue name; the spec's
    queue-name regexp is not enforced by it, and clients (pika, amqplib) do not enforce it
    either. Shoal must answer declare-ok and stay up."""
    bystanders = Bystanders.start(broker)
    try:
        channel = broker.connect().channel()
        for name in ("a[b]", "café", "queue (1)!"):
            assert channel.queue_declare(name, auto_delete=True).method.queue == name
            channel.basic_publish("", name, b"odd name")
            assert channel.basic_get(name, auto_ack=True)[2] == b"odd name"
            channel.queue_delete(name)
        bystanders.finish()
    finally:
        bystanders.close()
