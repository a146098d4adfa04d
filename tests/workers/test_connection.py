from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body, commands, encode, frame, header, heartbeat

from broker import errors
from broker.passwords import hashed
from tests.workers.connection_helpers import (
    assert_closing,
    body_frame,
    content_header,
    method,
    new_connection,
    only_close,
    opened,
    publish,
    sent,
    start_ok,
    tuned,
)
from tests.workers.helpers import default_server_properties
from workers.connection import AMQPConnection
from workers.connection_state import Input, State, UnexpectedMethod
from workers.events import (
    AckReceived,
    ChannelClosed,
    ChannelOpened,
    ConnectionClosed,
    ConnectionOpened,
    MethodReceived,
    PublishReceived,
)
from workers.frame_buffer import PROTOCOL_HEADER
from workers.outgoing import Ack, DeclareOk, Deliveries, Method, Return

LOGIN_REFUSED = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism {}. "
    "For details see the broker logfile."
)

# -- handshake ----------------------------------------------------------------


def test_handshake_with_plain() -> None:
    """Header -> start; PLAIN start-ok -> tune; tune-ok, open -> open-ok and ConnectionOpened."""
    props = default_server_properties()
    conn = new_connection(server_properties=props, frame_max=65536, channel_max=100, heartbeat=30)
    assert conn.receive_data(PROTOCOL_HEADER) == []
    [(channel, start)] = sent(conn)
    assert channel == 0 and isinstance(start, commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert (start.mechanisms, start.locales) == ("PLAIN AMQPLAIN", "en_US")
    server_properties: Any = start.server_properties
    assert server_properties["capabilities"]["authentication_failure_close"] is True

    assert conn.receive_data(start_ok()) == []
    [(_, tune)] = sent(conn)
    assert (tune.frame_max, tune.channel_max, tune.heartbeat) == (65536, 100, 30)

    assert conn.receive_data(method(0, commands.Connection.TuneOk(100, 65536, 30))) == []
    events = conn.receive_data(method(0, commands.Connection.Open("/")))
    assert [type(f) for _, f in sent(conn)] == [commands.Connection.OpenOk]
    client_properties = {"product": "test", "capabilities": {"authentication_failure_close": True}}
    assert events == [ConnectionOpened("/", "guest", client_properties, 65536, 100, 30)]
    assert conn.state is State.RUNNING


def test_handshake_with_amqplain() -> None:
    """AMQPLAIN's response is a LOGIN/PASSWORD field table without its length prefix."""
    conn = new_connection(users=hashed({"alice": "s3cret"}))
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    response = encode.field_table({"LOGIN": "alice", "PASSWORD": "s3cret"})[4:].decode()
    conn.receive_data(start_ok("AMQPLAIN", response))
    assert [type(f) for _, f in sent(conn)] == [commands.Connection.Tune]
    conn.receive_data(method(0, commands.Connection.TuneOk(2047, 131072, 60)))
    [event] = conn.receive_data(method(0, commands.Connection.Open("/")))
    assert isinstance(event, ConnectionOpened) and event.user == "alice"


@pytest.mark.parametrize(
    ("mechanism", "response"),
    [
        ("PLAIN", "\0guest\0wrong"),
        ("PLAIN", "\0nobody\0guest"),
        ("AMQPLAIN", encode.field_table({"LOGIN": "guest", "PASSWORD": "nope"})[4:].decode()),
    ],
)
def test_bad_login_is_403_close_when_client_asks(mechanism: str, response: str | bytes) -> None:
    """A refused login is connection.close 403, RabbitMQ's text (authentication_failure_close)."""
    conn = new_connection()
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    assert conn.receive_data(start_ok(mechanism, response)) == []
    assert_closing(conn, 403, LOGIN_REFUSED.format(mechanism))
    assert conn.receive_data(method(0, commands.Connection.CloseOk())) == [
        ConnectionClosed(f"closed by server: {LOGIN_REFUSED.format(mechanism)}")
    ]
    assert conn.closed


@pytest.mark.parametrize(("response", "why"), [("\0guest\0wrong", "invalid credentials"),
                                             ("\0nobody\0guest", "unknown user")])
def test_a_refused_login_tells_the_runtime_who_and_why_but_not_the_client(
        response: str, why: str) -> None:
    """Unknown user and wrong password get the same answer; the log (refused_login) tells them apart."""
    conn = new_connection()
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    conn.receive_data(start_ok(response=response))
    assert conn.refused_login == (response.split("\0")[1], why)
    assert_closing(conn, 403, LOGIN_REFUSED.format("PLAIN"))


@pytest.mark.parametrize(
    ("mechanism", "response", "external_user"),
    [
        ("PLAIN", "\0guest\0guest", None),
        ("AMQPLAIN", encode.field_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:].decode(), None),
        ("EXTERNAL", "", "guest"),
    ],
)
def test_guest_may_log_in_only_from_a_loopback_address(
        mechanism: str, response: str, external_user: str | None) -> None:
    """RabbitMQ's loopback_users default: guest from another host is 403 with the same generic
    text as a wrong password (rabbit_reader's auth_fail); the reason is only for the log."""
    conn = new_connection(peer_is_loopback=False, external_user=external_user)
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    conn.receive_data(start_ok(mechanism, response))
    assert_closing(conn, 403, LOGIN_REFUSED.format(mechanism))
    assert conn.refused_login == ("guest", "can only connect via localhost")


def test_guest_from_elsewhere_without_capability_closes_silently() -> None:
    """As any refused login: without authentication_failure_close the socket is just closed."""
    conn = new_connection(peer_is_loopback=False)
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    events = conn.receive_data(start_ok(failure_close=False))
    assert conn.data_to_send() == b""
    assert [type(e) for e in events] == [ConnectionClosed] and conn.closed
    assert conn.refused_login == ("guest", "can only connect via localhost")


def test_other_users_may_log_in_from_anywhere() -> None:
    conn = new_connection(peer_is_loopback=False,
                          users=hashed({"alice": "secret", "guest": "guest"}))
    conn.receive_data(PROTOCOL_HEADER)
    conn.receive_data(start_ok(response="\0alice\0secret"))
    assert [type(m) for _, m in sent(conn)][-1] is commands.Connection.Tune
    assert conn.refused_login is None


def test_bad_login_without_capability_closes_silently() -> None:
    """Without authentication_failure_close RabbitMQ just closes the socket."""
    conn = new_connection()
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    events = conn.receive_data(start_ok(response="\0guest\0wrong", failure_close=False))
    assert conn.data_to_send() == b""
    assert [type(e) for e in events] == [ConnectionClosed]
    assert conn.closed


def test_unknown_mechanism_closes_silently() -> None:
    """An unknown mechanism is a handshake error: the socket is closed, no close frame."""
    conn = new_connection()
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    events = conn.receive_data(start_ok("EXTERNAL", ""))
    assert conn.data_to_send() == b""
    assert [type(e) for e in events] == [ConnectionClosed] and conn.closed


@pytest.mark.parametrize(
    "header_bytes", [b"AMQP\x00\x00\x09\x00", b"AMQP\x01\x01\x08\x00", b"GET / HTTP/1.1\r\n"]
)
def test_bad_protocol_header_gets_ours_and_close(header_bytes: bytes) -> None:
    """An unsupported protocol header is answered with AMQP 0-9-1's, then the socket closes."""
    conn = new_connection()
    events = conn.receive_data(header_bytes)
    assert conn.data_to_send() == b"AMQP\x00\x00\x09\x01"
    assert [type(e) for e in events] == [ConnectionClosed] and conn.closed
    assert conn.receive_data(start_ok()) == [] and conn.data_to_send() == b""


def test_0_9_protocol_header_is_served_as_0_9_1() -> None:
    """RabbitMQ treats the 0-9 header (AMQP 1 1 0 9) as 0-9-1."""
    conn = new_connection()
    conn.receive_data(b"AMQP\x01\x01\x00\x09")
    assert [type(f) for _, f in sent(conn)] == [commands.Connection.Start]


def test_protocol_header_byte_by_byte() -> None:
    """connection.start goes out only once all 8 header bytes are in."""
    conn = new_connection()
    for byte in PROTOCOL_HEADER[:-1]:
        conn.receive_data(bytes([byte]))
        assert conn.data_to_send() == b""
    conn.receive_data(PROTOCOL_HEADER[-1:])
    assert [type(f) for _, f in sent(conn)] == [commands.Connection.Start]


def test_tune_ok_lower_values_win() -> None:
    """The client's tune-ok values are used when lower than ours and non-zero."""
    conn = opened(frame_max=8192, channel_max=10, heartbeat=5)
    assert (conn.frame_max, conn.channel_max, conn.heartbeat) == (8192, 10, 5)


def test_tune_ok_zero_keeps_server_limits() -> None:
    """A zero frame_max/channel_max ("no limit") leaves ours in force; heartbeat 0 disables them."""
    conn = opened(frame_max=0, channel_max=0, heartbeat=0)
    assert (conn.frame_max, conn.channel_max, conn.heartbeat) == (131072, 2047, 0)
    conn.heartbeat_tick(0.0)
    assert conn.heartbeat_tick(10_000.0) is True
    assert conn.data_to_send() == b""


def test_tune_ok_higher_values_keep_server_limits() -> None:
    """A tune-ok above our frame_max/channel_max does not raise them; its heartbeat is taken."""
    conn = opened(frame_max=1 << 20, channel_max=65535, heartbeat=600)
    assert (conn.frame_max, conn.channel_max, conn.heartbeat) == (131072, 2047, 600)


def test_tune_ok_frame_max_below_minimum_is_530() -> None:
    """frame_max below 4096 fails negotiation: 530 NOT_ALLOWED, as RabbitMQ."""
    conn = new_connection()
    conn.receive_data(PROTOCOL_HEADER)
    conn.receive_data(start_ok())
    conn.data_to_send()
    conn.receive_data(method(0, commands.Connection.TuneOk(2047, 1024, 60)))
    assert_closing(
        conn,
        530,
        "NOT_ALLOWED - negotiated frame_max = 1024 is lower than the minimum allowed value (4096)",
        10,
        30,
    )


def test_unknown_vhost_is_530() -> None:
    """Only vhost "/" exists; another is connection.close 530 with RabbitMQ's text."""
    conn = new_connection()
    tuned(conn)
    assert conn.receive_data(method(0, commands.Connection.Open("other"))) == []
    assert_closing(conn, 530, "NOT_ALLOWED - vhost other not found", 10, 40)


def test_method_out_of_handshake_order_closes_silently() -> None:
    """Before connection.open, an unexpected method closes the socket without a frame."""
    conn = new_connection()
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    events = conn.receive_data(method(0, commands.Connection.Open("/")))
    assert conn.data_to_send() == b""
    assert [type(e) for e in events] == [ConnectionClosed] and conn.closed


def test_unexpected_method_error_names_state_and_input() -> None:
    """A miss in the connection table raises an error naming the state and the input."""
    conn = opened()
    with pytest.raises(UnexpectedMethod) as info:
        conn._transition(Input.START_OK, 10, 11)
    assert info.value.state is State.RUNNING and info.value.input is Input.START_OK
    assert info.value.reply_text == "unexpected method in connection state running"


def test_handshake_method_while_running_is_504() -> None:
    """connection.start-ok once running: RabbitMQ's 504 "unexpected method in connection state"."""
    conn = opened()
    conn.receive_data(start_ok())
    assert_closing(
        conn, 504, "CHANNEL_ERROR - unexpected method in connection state running", 10, 11
    )


# -- framing errors -----------------------------------------------------------


def test_bad_frame_end_is_501() -> None:
    """A frame not ending in 0xCE closes the connection with 501 FRAME_ERROR, at once."""
    conn = opened()
    data = bytearray(method(1, commands.Basic.Qos(prefetch_count=1)))
    data[-1] = 0
    events = conn.receive_data(bytes(data))
    close = only_close(conn)
    assert close.reply_code == 501 and close.reply_text.startswith("FRAME_ERROR - ")
    assert [type(e) for e in events] == [ConnectionClosed] and conn.closed


def test_frame_over_frame_max_is_501() -> None:
    """A frame over the negotiated frame_max is 501, judged from its header alone."""
    conn = opened(frame_max=4096)
    events = conn.receive_data(bytes([3, 0, 1, 0, 0, 0x20, 0x00]))  # body frame of 8192 octets
    assert only_close(conn).reply_code == 501
    assert [type(e) for e in events] == [ConnectionClosed]


def test_frames_up_to_negotiated_frame_max_are_accepted() -> None:
    """After tuning, frames up to the negotiated frame_max (not 4096) are fine."""
    conn = opened()
    data = b"x" * 100_000
    [event] = conn.receive_data(publish(1, data, routing_key="q"))
    assert isinstance(event, PublishReceived) and len(event.body) == 1


def test_garbage_after_handshake_is_501() -> None:
    """Bytes that are not a frame (unknown frame type) are 501 FRAME_ERROR."""
    conn = opened()
    events = conn.receive_data(b"\x99" * 32)
    assert only_close(conn).reply_code == 501
    assert [type(e) for e in events] == [ConnectionClosed]


def test_unknown_method_is_540() -> None:
    """A class/method id pair outside AMQP 0-9-1 is 540 NOT_IMPLEMENTED, with its ids."""
    conn = opened()
    payload = b"\x00\x3c\x03\xe7"
    conn.receive_data(bytes([1, 0, 1, 0, 0, 0, len(payload)]) + payload + b"\xce")
    close = only_close(conn)
    assert (close.reply_code, close.class_id, close.method_id) == (540, 60, 999)
    assert close.reply_text.startswith("NOT_IMPLEMENTED - ")


def test_server_only_method_from_client_is_503() -> None:
    """A method only a server may send (basic.deliver) is 503 COMMAND_INVALID."""
    conn = opened()
    conn.receive_data(method(1, commands.Basic.Deliver("c", 1, False, "", "q")))
    assert_closing(conn, 503, "COMMAND_INVALID - unimplemented method", 60, 60)


# -- channels -----------------------------------------------------------------


def test_channel_open() -> None:
    """channel.open on a fresh number -> open-ok and ChannelOpened."""
    conn = opened(channels=())
    assert conn.receive_data(method(3, commands.Channel.Open())) == [ChannelOpened(3)]
    assert [(ch, type(f)) for ch, f in sent(conn)] == [(3, commands.Channel.OpenOk)]
    assert conn.is_channel_open(3) and not conn.is_channel_open(4)


def test_method_on_unopened_channel_is_504() -> None:
    """Any method on a channel not opened is 504 CHANNEL_ERROR (connection close)."""
    conn = opened()
    conn.receive_data(method(5, commands.Queue.Declare(queue="q")))
    assert_closing(conn, 504, "CHANNEL_ERROR - expected 'channel.open'", 50, 10)


def test_second_channel_open_is_504() -> None:
    """channel.open on an open channel is 504 "second 'channel.open' seen"."""
    conn = opened()
    conn.receive_data(method(1, commands.Channel.Open()))
    assert_closing(conn, 504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)


def test_channel_max_limits_how_many_channels_are_open_not_their_numbers() -> None:
    """AMQP's channel-max is "the maximum total number of channels": with channel_max 2 a
    client may open channel 65535; a third open channel is 530 NOT_ALLOWED (RabbitMQ's text),
    and closing one makes room again."""
    conn = opened(channels=(), channel_max=2)
    [event] = conn.receive_data(method(65535, commands.Channel.Open()))
    assert isinstance(event, ChannelOpened) and event.channel == 65535
    conn.receive_data(method(7, commands.Channel.Open()))
    conn.receive_data(method(7, commands.Channel.Close(200, "bye", 0, 0)))
    conn.data_to_send()
    conn.receive_data(method(8, commands.Channel.Open()))
    assert conn.is_channel_open(8) and conn.state is State.RUNNING
    conn.data_to_send()
    conn.receive_data(method(9, commands.Channel.Open()))
    assert_closing(conn, 530, "NOT_ALLOWED - number of channels opened (2) has reached the "
                   "negotiated channel_max (2)", 0, 0)


def test_update_secret_is_answered_while_running() -> None:
    """connection.update-secret (RabbitMQ extension; pika, aiormq, amqplib) gets update-secret-ok."""
    conn = opened()
    conn.receive_data(method(0, commands.Connection.UpdateSecret("new-token", "token refresh")))
    assert [(ch, type(m)) for ch, m in sent(conn)] == [(0, commands.Connection.UpdateSecretOk)]
    assert conn.state is State.RUNNING


@pytest.mark.parametrize("unexpected", [commands.Connection.SecureOk("x"), commands.Connection.Start(),
                                        commands.Connection.Blocked("r"), commands.Connection.OpenOk()],
                         ids=["secure-ok", "start", "blocked", "open-ok"])
def test_a_connection_method_the_server_does_not_take_is_504(unexpected: Any) -> None:
    """A known connection method the server never takes: 504 with RabbitMQ 3.10's text."""
    conn = opened()
    conn.receive_data(method(0, unexpected))
    assert_closing(conn, 504, "CHANNEL_ERROR - unexpected method in connection state running",
                   *divmod(unexpected.index, 1 << 16))


def test_an_unknown_connection_method_is_540() -> None:
    """A connection-class method id AMQP 0-9-1 does not define is 540 NOT_IMPLEMENTED."""
    conn = opened()
    payload = b"\x00\x0a\x00\x63"  # class 10, method 99
    conn.receive_data(bytes([1, 0, 0, 0, 0, 0, len(payload)]) + payload + b"\xce")
    close = only_close(conn)
    assert (close.reply_code, close.class_id, close.method_id) == (540, 10, 99)


def test_channel_method_on_channel_zero_is_504() -> None:
    """Channel 0 carries only connection methods: RabbitMQ answers 504."""
    conn = opened()
    conn.receive_data(method(0, commands.Channel.Open()))
    assert_closing(
        conn, 504, "CHANNEL_ERROR - unexpected method in connection state running", 20, 10
    )


def test_method_received() -> None:
    """Channel-level methods reach the runtime as pamqp objects."""
    conn = opened()
    [event] = conn.receive_data(method(1, commands.Queue.Declare(queue="q1", durable=True)))
    assert isinstance(event, MethodReceived) and event.channel == 1
    assert isinstance(event.method, commands.Queue.Declare)
    assert (event.method.queue, event.method.durable) == ("q1", True)
    assert conn.data_to_send() == b""


def test_client_closes_channel() -> None:
    """Client channel.close -> close-ok and ChannelClosed; the number can be reused."""
    conn = opened()
    events = conn.receive_data(method(1, commands.Channel.Close(200, "bye", 0, 0)))
    assert events == [ChannelClosed(1)]
    assert [(ch, type(f)) for ch, f in sent(conn)] == [(1, commands.Channel.CloseOk)]
    assert not conn.is_channel_open(1)
    assert conn.receive_data(method(1, commands.Channel.Open())) == [ChannelOpened(1)]


def test_server_closes_channel_and_discards_until_close_ok() -> None:
    """After our channel.close only close/close-ok count on it; ChannelClosed on close-ok."""
    conn = opened(channels=(1, 2))
    conn.close_channel(1, 404, "NOT_FOUND - no queue 'q' in vhost '/'", 50, 10)
    [(channel, close)] = sent(conn)
    assert channel == 1 and (
        close.reply_code,
        close.reply_text,
        close.class_id,
        close.method_id,
    ) == (
        404,
        "NOT_FOUND - no queue 'q' in vhost '/'",
        50,
        10,
    )
    assert not conn.is_channel_open(1)
    ignored = publish(1, b"abc", routing_key="q") + method(1, commands.Queue.Declare(queue="q"))
    ignored += content_header(1, 10) + method(1, commands.Channel.Open())
    assert conn.receive_data(ignored) == []
    assert conn.data_to_send() == b"" and conn.state is State.RUNNING
    assert conn.send_method(1, commands.Basic.QosOk()) is False
    assert conn.receive_data(method(1, commands.Channel.CloseOk())) == [ChannelClosed(1)]
    [event] = conn.receive_data(method(2, commands.Queue.Declare(queue="q2")))
    assert isinstance(event, MethodReceived) and event.channel == 2


def test_channel_close_crossing_ours() -> None:
    """A client channel.close crossing ours gets close-ok; ChannelClosed waits for its close-ok."""
    conn = opened()
    conn.close_channel(1, 406, "PRECONDITION_FAILED - x")
    conn.data_to_send()
    assert conn.receive_data(method(1, commands.Channel.Close(200, "bye", 0, 0))) == []
    assert [(ch, type(f)) for ch, f in sent(conn)] == [(1, commands.Channel.CloseOk)]
    assert conn.receive_data(method(1, commands.Channel.CloseOk())) == [ChannelClosed(1)]


def test_close_ok_on_open_channel_is_503() -> None:
    """channel.close-ok when we did not close the channel is not a valid method."""
    conn = opened()
    conn.receive_data(method(1, commands.Channel.CloseOk()))
    assert_closing(conn, 503, "COMMAND_INVALID - unimplemented method", 20, 41)


# -- content ------------------------------------------------------------------


def test_publish_reassembled_from_many_body_frames() -> None:
    """Publish + header + N body frames -> one PublishReceived with the header verbatim."""
    conn = opened(frame_max=4096)
    data = bytes(i % 256 for i in range(20_000))
    props = commands.Basic.Properties(content_type="text/plain", headers={"h": 1})
    wire = method(
        1, commands.Basic.Publish(exchange="amq.direct", routing_key="rk", mandatory=True)
    )
    wire += content_header(1, len(data), props)
    chunks = [data[i : i + 4088] for i in range(0, len(data), 4088)]
    assert len(chunks) == 5
    for index, chunk in enumerate(chunks):
        events = conn.receive_data(body_frame(1, chunk) if index else wire + body_frame(1, chunk))
        if index < len(chunks) - 1:
            assert events == []
    [event] = events
    assert isinstance(event, PublishReceived)
    assert (event.channel, event.exchange, event.routing_key, event.mandatory, event.immediate) == (
        1,
        "amq.direct",
        "rk",
        True,
        False,
    )
    assert event.header_payload == header.ContentHeader(0, len(data), props).marshal()
    assert event.body_size == len(data) and b"".join(bytes(c) for c in event.body) == data


def test_publish_fed_one_byte_at_a_time() -> None:
    """Arbitrary splits change nothing: one event, when the last byte arrives."""
    conn = opened(channels=(1, 2), frame_max=4096)
    data = b"0123456789" * 900
    wire = publish(2, data, frame_max=4096, exchange="", routing_key="q")
    wire += method(1, commands.Basic.Ack(7))
    events = []
    for i in range(len(wire)):
        events += conn.receive_data(wire[i : i + 1])
    published, acked = events
    assert isinstance(published, PublishReceived) and isinstance(acked, AckReceived)
    assert b"".join(bytes(c) for c in published.body) == data and published.channel == 2
    assert acked == AckReceived(1, 7, False)


def test_publish_with_empty_body() -> None:
    """A zero body_size completes the publish at its content header."""
    conn = opened()
    [event] = conn.receive_data(
        method(1, commands.Basic.Publish(routing_key="q")) + content_header(1, 0)
    )
    assert isinstance(event, PublishReceived) and event.body == [] and event.body_size == 0


def test_publishes_interleave_across_channels() -> None:
    """Content is assembled per channel: frames of two channels may interleave."""
    conn = opened(channels=(1, 2))
    wire = method(1, commands.Basic.Publish(routing_key="a")) + method(
        2, commands.Basic.Publish(routing_key="b")
    )
    wire += content_header(2, 2) + content_header(1, 1) + body_frame(1, b"A") + body_frame(2, b"BB")
    events = conn.receive_data(wire)
    assert all(isinstance(e, PublishReceived) for e in events)
    got = [
        (e.channel, e.routing_key, b"".join(e.body))
        for e in events
        if isinstance(e, PublishReceived)
    ]
    assert got == [(1, "a", b"A"), (2, "b", b"BB")]


def test_publish_immediate_is_540() -> None:
    """basic.publish with immediate=true is 540 NOT_IMPLEMENTED, as in RabbitMQ 3.0+."""
    conn = opened()
    conn.receive_data(publish(1, b"abc", routing_key="q", immediate=True))
    assert_closing(conn, 540, "NOT_IMPLEMENTED - immediate=true", 60, 40)


def test_content_header_without_publish_is_505() -> None:
    """A content header with no content-bearing method before it is 505 UNEXPECTED_FRAME."""
    conn = opened()
    conn.receive_data(content_header(1, 3))
    assert_closing(
        conn, 505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead"
    )


def test_body_without_header_is_505() -> None:
    """A body frame right after basic.publish (no header) is 505 UNEXPECTED_FRAME."""
    conn = opened()
    conn.receive_data(method(1, commands.Basic.Publish(routing_key="q")) + body_frame(1, b"abc"))
    assert_closing(
        conn,
        505,
        "UNEXPECTED_FRAME - expected content header for class 60, "
        "got non content header frame instead",
        60,
        40,
    )


def test_method_mid_body_is_505() -> None:
    """A method arriving while body frames are due is 505 UNEXPECTED_FRAME."""
    conn = opened()
    conn.receive_data(method(1, commands.Basic.Publish(routing_key="q")) + content_header(1, 10))
    conn.receive_data(body_frame(1, b"12345") + method(1, commands.Basic.Qos(prefetch_count=1)))
    assert_closing(
        conn,
        505,
        "UNEXPECTED_FRAME - expected content body, got non content body frame instead",
        60,
        40,
    )


def test_body_longer_than_declared_is_501() -> None:
    """A body frame past the header's body_size: RabbitMQ's 501 FRAME_ERROR."""
    conn = opened()
    wire = (
        method(1, commands.Basic.Publish(routing_key="q"))
        + content_header(1, 3)
        + body_frame(1, b"abcd")
    )
    events = conn.receive_data(wire)
    assert events == []
    assert_closing(
        conn, 501, "FRAME_ERROR - content body frame exceeds remaining content size", 60, 40
    )


def test_oversize_body_is_406_channel_close() -> None:
    """body_size over max_body_size is channel.close 406; its body frames are then discarded."""
    conn = opened(channels=(1, 2), max_body_size=1000)
    wire = (
        method(1, commands.Basic.Publish(routing_key="q"))
        + content_header(1, 1001)
        + body_frame(1, b"x" * 1001)
    )
    assert conn.receive_data(wire) == []
    [(channel, close)] = sent(conn)
    assert channel == 1 and isinstance(close, commands.Channel.Close)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        406,
        "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000",
        60,
        40,
    )
    assert conn.state is State.RUNNING
    [event] = conn.receive_data(publish(2, b"y" * 1000, routing_key="q"))
    assert isinstance(event, PublishReceived) and event.channel == 2


# -- heartbeats and timeouts -------------------------------------------------------


HEARTBEAT_BYTES = heartbeat.Heartbeat().marshal()


def test_heartbeat_sent_after_half_the_interval_of_silence() -> None:
    """With nothing sent for heartbeat/2 seconds, a heartbeat frame is queued."""
    conn = opened(heartbeat=10)
    assert conn.heartbeat_tick(100.0)
    assert conn.heartbeat_tick(104.0) and conn.data_to_send() == b""
    assert conn.heartbeat_tick(105.0)
    assert conn.data_to_send() == HEARTBEAT_BYTES


def test_heartbeats_go_out_every_half_interval_of_silence() -> None:
    """An idle connection gets a heartbeat every heartbeat/2 seconds, as RabbitMQ sends them:
    the heartbeat itself, taken by the writer after its tick, does not push the next one back."""
    conn = opened(heartbeat=10)
    sent_at = []
    for t in range(100, 121):
        assert conn.heartbeat_tick(float(t))
        if conn.data_to_send() == HEARTBEAT_BYTES:
            sent_at.append(t)
        conn.receive_data(HEARTBEAT_BYTES)  # the client's, to stay alive
    assert sent_at == [105, 110, 115, 120]


def test_no_heartbeat_while_other_frames_flow() -> None:
    """Any data sent resets the heartbeat send timer."""
    conn = opened(heartbeat=10)
    conn.heartbeat_tick(100.0)
    conn.send_method(1, commands.Basic.QosOk())
    conn.data_to_send()
    conn.heartbeat_tick(104.0)
    assert conn.heartbeat_tick(108.0) and conn.data_to_send() == b""
    conn.heartbeat_tick(109.0)
    assert conn.data_to_send() == HEARTBEAT_BYTES


def test_missed_heartbeats_kill_the_connection() -> None:
    """Nothing received for 2 x heartbeat: heartbeat_tick returns False and the connection ends."""
    conn = opened(heartbeat=10)
    assert conn.heartbeat_tick(100.0)
    assert conn.heartbeat_tick(119.0)
    assert conn.heartbeat_tick(120.0) is False
    assert conn.closed and conn.close_reason == "missed heartbeats from client, timeout: 10s"


def test_received_frames_count_as_activity() -> None:
    """Any received frame, a heartbeat included, keeps the connection alive."""
    conn = opened(heartbeat=10)
    conn.heartbeat_tick(100.0)
    assert conn.receive_data(HEARTBEAT_BYTES) == []
    assert conn.heartbeat_tick(115.0)
    assert conn.heartbeat_tick(134.0)
    assert conn.heartbeat_tick(135.0) is False


def test_reading_paused_by_the_broker_is_never_missed_heartbeats() -> None:
    """While the broker leaves the socket unread (credit flow, alarm) the client's silence is ours."""
    conn = opened(heartbeat=1)
    conn.heartbeat_tick(100.0)
    conn.reading_paused = True
    assert all(conn.heartbeat_tick(100.0 + t) for t in range(1, 60))
    conn.reading_paused = False  # silence counts again from the last paused tick (159)
    assert conn.heartbeat_tick(160.0)
    assert conn.heartbeat_tick(161.0) is False


def test_socket_activity_counts_as_traffic_and_its_standstill_as_silence() -> None:
    """What the runtime sees of the socket (unread input, unacknowledged output) keeps the
    connection alive while it changes; 2 x heartbeat without change is missed heartbeats."""
    conn = opened(heartbeat=1)
    conn.heartbeat_tick(100.0, (0, 0))
    for t in range(1, 10):  # the client's heartbeats pile up unread
        assert conn.heartbeat_tick(100.0 + t, (8 * t, 1 << 20))
    assert conn.heartbeat_tick(110.0, (72, 1 << 20))
    assert conn.heartbeat_tick(111.0, (72, 1 << 20)) is False
    assert conn.close_reason == "missed heartbeats from client, timeout: 1s"


def test_handshake_timeout() -> None:
    """A client that does not finish the handshake in time is dropped."""
    conn = new_connection(handshake_timeout=10.0)
    assert conn.heartbeat_tick(0.0)
    conn.receive_data(PROTOCOL_HEADER)
    assert conn.heartbeat_tick(9.0)
    assert conn.heartbeat_tick(10.0) is False and conn.closed


def test_close_ok_timeout() -> None:
    """After our connection.close, a client that never sends close-ok is dropped."""
    conn = opened(heartbeat=10)
    conn.heartbeat_tick(0.0)
    conn.close(320, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'")
    assert conn.heartbeat_tick(1.0)
    assert conn.heartbeat_tick(10.0)
    assert conn.heartbeat_tick(11.0) is False and conn.closed


# -- connection close ---------------------------------------------------------------


def test_client_closes_connection() -> None:
    """Client connection.close -> close-ok and ConnectionClosed; nothing more is read."""
    conn = opened()
    events = conn.receive_data(method(0, commands.Connection.Close(200, "bye", 0, 0)))
    assert [(ch, type(f)) for ch, f in sent(conn)] == [(0, commands.Connection.CloseOk)]
    assert events == [ConnectionClosed("closed by client: 200 bye")] and conn.closed
    assert conn.receive_data(method(1, commands.Queue.Declare(queue="q"))) == []
    assert conn.send_method(1, commands.Basic.QosOk()) is False


def test_server_closes_connection_and_waits_for_close_ok() -> None:
    """After our connection.close everything but close-ok is ignored; close-ok ends it."""
    conn = opened()
    text = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
    conn.close(320, text)
    assert_closing(conn, 320, text)
    ignored = method(1, commands.Queue.Declare(queue="q")) + publish(1, b"abc", routing_key="q")
    ignored += content_header(1, 3) + method(0, commands.Connection.Open("/"))
    assert conn.receive_data(ignored) == [] and conn.data_to_send() == b""
    assert conn.send_raw(b"\x08\x00\x00\x00\x00\x00\x00\xce") is False
    closed = conn.receive_data(method(0, commands.Connection.CloseOk()))
    assert closed == [ConnectionClosed(f"closed by server: {text}")] and conn.closed


def test_connection_close_crossing_ours() -> None:
    """A client connection.close crossing ours is answered with close-ok and ends the connection."""
    conn = opened()
    conn.close(320, "CONNECTION_FORCED - x")
    conn.data_to_send()
    events = conn.receive_data(method(0, commands.Connection.Close(200, "bye", 0, 0)))
    assert [type(f) for _, f in sent(conn)] == [commands.Connection.CloseOk]
    assert [type(e) for e in events] == [ConnectionClosed]


# -- errors from the runtime --------------------------------------------------------


def test_handle_error_soft_closes_the_channel() -> None:
    """A soft error closes its channel, with RabbitMQ's code-name prefix."""
    conn = opened()
    conn.handle_error(errors.NotFound("no queue 'q' in vhost '/'", 50, 10), channel=1)
    [(channel, close)] = sent(conn)
    assert channel == 1 and (close.reply_code, close.reply_text) == (
        404,
        "NOT_FOUND - no queue 'q' in vhost '/'",
    )
    assert conn.state is State.RUNNING


def test_handle_error_hard_closes_the_connection() -> None:
    """A hard error closes the connection, whatever channel it came from."""
    conn = opened()
    conn.handle_error(errors.NotImplemented_("immediate=true", 60, 40), channel=1)
    assert_closing(conn, 540, "NOT_IMPLEMENTED - immediate=true", 60, 40)


def test_format_reply_text() -> None:
    """Reply texts carry the reply code's name, as RabbitMQ writes them."""
    assert format_reply_text(406, "x") == "PRECONDITION_FAILED - x"
    assert format_reply_text(504, "y") == "CHANNEL_ERROR - y"
    assert format_reply_text(320, "z") == "CONNECTION_FORCED - z"


def format_reply_text(reply_code: int, text: str) -> str:
    """The text handle_error puts in a close frame for an error with this code."""
    return errors.error_for_code(reply_code, text).frame_text


def test_send_raw_checks_the_channel() -> None:
    """Pre-encoded frames for a closing channel are dropped, others queued."""
    conn = opened(channels=(1, 2))
    conn.close_channel(1, 406, "PRECONDITION_FAILED - x")
    conn.data_to_send()
    assert conn.send_raw(b"one", channel=1) is False
    assert conn.send_raw(b"two", channel=2) is True
    assert conn.data_to_send() == b"two"


# -- the whole-publish fast path ---------------------------------------------


def _frame_by_frame(conn: AMQPConnection) -> AMQPConnection:
    conn._buffer.hot_paths = False
    return conn


def _comparable(events: list[Any]) -> list[Any]:
    return [
        (e.channel, e.exchange, e.routing_key, e.mandatory, bytes(e.header_payload), e.body_size,
         b"".join(bytes(c) for c in e.body)) if isinstance(e, PublishReceived)
        else (e.channel, e.method.name, sorted(vars(e.method).items())) if isinstance(e, MethodReceived)
        else _comparable([MethodReceived(e.channel, commands.Basic.Ack(e.delivery_tag, e.multiple))])[0]
        if isinstance(e, AckReceived)
        else e
        for e in events
    ]


# -- basic.ack on the hot path (FrameBuffer.next_ack) --------------------------------------

_ACK_STREAM = b"".join([
    method(1, commands.Basic.Ack(1)),
    method(2, commands.Basic.Ack(2**63 - 1, multiple=True)),
    publish(1, b"between"),
    method(1, commands.Basic.Ack(0, multiple=True)),
    method(2, commands.Basic.Nack(3)),  # not an ack: read frame by frame
    method(1, commands.Basic.Ack(4)),
])


def test_acks_on_the_hot_path_are_the_events_of_frame_by_frame_reading() -> None:
    """Each basic.ack comes out as an AckReceived saying what the frame-by-frame path's
    MethodReceived(Basic.Ack) says, in the same place among the other events."""
    fast, slow = opened(channels=(1, 2)), _frame_by_frame(opened(channels=(1, 2)))
    events = fast.receive_data(_ACK_STREAM)
    assert [e for e in events if isinstance(e, AckReceived)] == [
        AckReceived(1, 1, False), AckReceived(2, 2**63 - 1, True), AckReceived(1, 0, True),
        AckReceived(1, 4, False)]
    slow_events = slow.receive_data(_ACK_STREAM)
    assert not any(isinstance(e, AckReceived) for e in slow_events)
    assert _comparable(events) == _comparable(slow_events)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(_ACK_STREAM) - 1), max_size=6))
def test_acks_split_anywhere_give_the_same_events(cuts: list[int]) -> None:
    conn = opened(channels=(1, 2))
    events: list[Any] = []
    start = 0
    for cut in [*sorted(set(cuts)), len(_ACK_STREAM)]:
        events += conn.receive_data(_ACK_STREAM[start:cut])
        start = cut
    whole = opened(channels=(1, 2)).receive_data(_ACK_STREAM)
    assert _comparable(events) == _comparable(whole)


def test_an_ack_the_hot_path_declines_is_answered_as_frame_by_frame() -> None:
    """Inside a publish's content an ack is 505 on the hot path too; on a channel never opened
    it is 504; an ack whose payload is longer than its fields is read as any other ack."""
    conn = opened()
    conn.receive_data(method(1, commands.Basic.Publish(routing_key="q")) + content_header(1, 4)
                      + method(1, commands.Basic.Ack(1)))
    assert only_close(conn).reply_code == 505
    conn = opened()
    conn.receive_data(method(3, commands.Basic.Ack(1)))
    assert only_close(conn).reply_code == 504
    conn = opened()
    long_ack = frame.marshal(commands.Basic.Ack(5), 1)
    size = int.from_bytes(long_ack[3:7], "big")
    padded = long_ack[:3] + (size + 2).to_bytes(4, "big") + long_ack[7:-1] + b"\0\0" + long_ack[-1:]
    [event] = conn.receive_data(padded)
    assert isinstance(event, MethodReceived) and event.method.delivery_tag == 5


def test_an_ack_on_a_closing_channel_is_dropped() -> None:
    """After the server's channel.close only close and close-ok count (AMQP 0-9-1 §4.2.6)."""
    conn = opened(channels=(1, 2))
    conn.close_channel(1, 406, "PRECONDITION_FAILED - x")
    conn.data_to_send()
    assert conn.receive_data(method(1, commands.Basic.Ack(1)) + method(2, commands.Basic.Ack(2))) == [
        AckReceived(2, 2, False)]


def test_whole_publish_gives_the_events_of_frame_by_frame_reading() -> None:
    """Publishes taken three frames at a time are the same events, in the same
    order, as when each frame is read on its own — small, empty, multi-frame
    and interleaved with other methods and channels."""
    stream = b"".join([
        publish(1, b"small", exchange="amq.direct", routing_key="k", mandatory=True),
        publish(1, b""),
        method(2, commands.Basic.Ack(delivery_tag=0, multiple=True)),
        publish(2, b"x" * 10_000, frame_max=4096),
        method(1, commands.Basic.Publish(routing_key="h"))
        + content_header(1, 4, commands.Basic.Properties(headers={"h": 1}))
        + body_frame(1, b"last"),
    ])
    fast, slow = opened(channels=(1, 2)), _frame_by_frame(opened(channels=(1, 2)))
    assert _comparable(fast.receive_data(stream)) == _comparable(slow.receive_data(stream))
    assert len([e for e in fast.receive_data(publish(1, b"z")) if isinstance(e, PublishReceived)]) == 1


def test_whole_publish_split_anywhere_gives_the_same_events() -> None:
    """A publish cut at any byte still comes out once and whole."""
    stream = publish(1, b"payload") * 2
    for cut in range(1, len(stream)):
        conn = opened()
        events = conn.receive_data(stream[:cut]) + conn.receive_data(stream[cut:])
        bodies = [b"".join(bytes(c) for c in e.body) for e in events if isinstance(e, PublishReceived)]
        assert bodies == [b"payload", b"payload"], cut


def test_whole_publish_declines_what_frame_by_frame_must_refuse() -> None:
    """An oversize body still gets 406 and an immediate publish 540: the fast
    path never answers differently from the frame-by-frame path."""
    conn = opened(max_body_size=3)
    conn.receive_data(publish(1, b"toolong"))
    assert any(isinstance(m, commands.Channel.Close) and m.reply_code == 406 for _, m in sent(conn))
    conn = opened()
    conn.receive_data(publish(1, b"x", immediate=True))
    assert only_close(conn).reply_code == 540


# -- outgoing events (AMQPConnection.send) ------------------------------------------

OUT_HEADER = memoryview(header.ContentHeader(0, 10, commands.Basic.Properties()).marshal())


def test_deliveries_are_split_by_the_negotiated_frame_max() -> None:
    """A body larger than frame_max - 8 goes out in several body frames, each within it."""
    conn = opened(frame_max=4096)
    data = b"x" * 10_000
    assert conn.send(Deliveries(1, "c1", [(1, False, "", "q", OUT_HEADER, memoryview(data))]))
    frames = sent(conn)
    deliver = frames[0][1]
    assert isinstance(deliver, commands.Basic.Deliver) and deliver.consumer_tag == "c1"
    bodies = [f.value for _, f in frames if isinstance(f, body.ContentBody)]
    assert b"".join(bodies) == data and all(len(b) <= 4096 - 8 for b in bodies)


def test_nothing_follows_a_channel_close() -> None:
    """AMQP 0-9-1 channel.close: once the server sent it, nothing more goes out on the channel."""
    conn = opened(channels=(1, 2))
    conn.close_channel(1, 406, "PRECONDITION_FAILED - x")
    conn.data_to_send()
    for event in (
        Deliveries(1, "c1", [(1, False, "", "q", OUT_HEADER, memoryview(b"0123456789"))]),
        Ack(1, 1, False),
        Return(1, 312, "NO_ROUTE", "", "q", OUT_HEADER, memoryview(b"0123456789")),
        DeclareOk(1, "q", 0, 0),
        Method(1, commands.Basic.QosOk()),
    ):
        assert conn.send(event) is False
    assert conn.data_to_send() == b""
    assert conn.send(Ack(2, 1, False)) is True
    [(channel, ack)] = sent(conn)
    assert channel == 2 and isinstance(ack, commands.Basic.Ack)


def test_nothing_follows_a_connection_close() -> None:
    """After connection.close only close-ok may be sent: channel 0 events are dropped too."""
    conn = opened()
    conn.close(320, "CONNECTION_FORCED - x")
    conn.data_to_send()
    assert conn.send(Method(0, commands.Connection.Blocked("low on memory"))) is False
    assert conn.send(Ack(1, 1, False)) is False
    assert conn.data_to_send() == b""


def test_a_big_body_received_into_its_frame_gives_the_same_events() -> None:
    """The worker receives the rest of a big body frame straight into the buffer the frame is
    assembled in (``receive_room`` / ``received_into``): the same publishes come out as when
    every read is handed over as bytes."""
    stream = publish(1, bytes(range(256)) * 1000, frame_max=131072) + publish(1, b"small")
    plain = opened()
    expected = _comparable(plain.receive_data(stream))
    direct = opened()
    events: list[Any] = []
    pos, into = 0, 0
    while pos < len(stream):
        room = direct.receive_room()
        if room is None:
            events += direct.receive_data(stream[pos : pos + 50_000])
            pos += 50_000
        else:
            size = min(len(room), 30_000)
            room[:size] = stream[pos : pos + size]
            events += direct.received_into(size)
            pos, into = pos + size, into + size
    assert into > 0  # the rest of the first body's frames went in directly
    assert _comparable(events) == expected
    assert len([e for e in events if isinstance(e, PublishReceived)]) == 2


# -- big bodies received where they are stored (place_bodies) ----------------


class _Placer:
    """A stand-in for the worker's arena: ``place`` takes a block of ``memory`` for a big
    publish and writes its header there (as ConnectionHandler.place_body does), ``release``
    frees one; what is live, what was freed and what was refused are kept to look at."""

    def __init__(self, refuse: int = 0) -> None:
        self.memory = bytearray(4 << 20)
        self.top = 0
        self.live: dict[int, int] = {}  # offset -> block size
        self.released: list[int] = []
        self.refuse = refuse  # how many place() calls to answer None first

    def place(self, header: bytes, body_size: int) -> tuple[memoryview, int, int] | None:
        if self.refuse:
            self.refuse -= 1
            return None
        offset, size = self.top, len(header) + body_size
        self.top += size
        self.live[offset] = size
        self.memory[offset : offset + len(header)] = header
        view = memoryview(self.memory)[offset : offset + size]
        return view[len(header) :], offset, len(header)

    def release(self, offset: int) -> None:
        del self.live[offset]
        self.released.append(offset)

    def body(self, event: PublishReceived) -> bytes:
        """A placed publish's body, read from its block (and its header checked there)."""
        start = event.placed + event.placed_header
        assert bytes(self.memory[event.placed : start]) == event.header_payload
        return bytes(self.memory[start : start + event.body_size])


def _placing(placer: _Placer, **kwargs: Any) -> AMQPConnection:
    conn = opened(**kwargs)
    conn.place_bodies(placer.place, placer.release)
    return conn


def _feed(conn: AMQPConnection, stream: bytes, sizes: list[int]) -> tuple[list[Any], int]:
    """Feed ``stream`` as the worker's reader does: into ``receive_room`` when there is one,
    else as bytes; read sizes cycle through ``sizes``. The events, and the octets that went
    straight into a room."""
    events: list[Any] = []
    pos = into = k = 0
    while pos < len(stream):
        want = sizes[k % len(sizes)]
        k += 1
        room = conn.receive_room()
        if room is None:
            events += conn.receive_data(stream[pos : pos + want])
            pos += want
        else:
            size = min(len(room), want)
            room[:size] = stream[pos : pos + size]
            events += conn.received_into(size)
            pos, into = pos + size, into + size
    return events, into


def test_a_big_body_goes_straight_into_its_block() -> None:
    """A body of at least PLACE_MIN octets is assembled in the block ``place`` gave when its
    content header came: the publish names that block (``placed``), carries no chunks, the
    block holds the header and every body octet, and most of them were received straight
    into it. Small publishes around it are unchanged."""
    big = bytes(range(256)) * 1000  # 256,000 octets: two full body frames and a short one
    stream = publish(1, b"before") + publish(1, big, routing_key="k") + publish(1, b"after")
    placer = _Placer()
    events, into = _feed(_placing(placer), stream, [50_000])
    publishes = [e for e in events if isinstance(e, PublishReceived)]
    assert [p.body_size for p in publishes] == [6, len(big), 5]
    small1, placed, small2 = publishes
    assert small1.placed == small2.placed == -1
    assert b"".join(bytes(c) for c in small2.body) == b"after"
    assert placed.placed == 0 and placed.body == [] and placed.routing_key == "k"
    assert placer.body(placed) == big
    assert into > len(big) // 2
    assert placer.released == []  # the block is the publish's now


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(st.lists(st.integers(1, 70_000), min_size=1, max_size=20))
def test_placed_bodies_split_anywhere_come_out_whole(sizes: list[int]) -> None:
    """However the reads cut the stream (into rooms or as bytes), each big body lands whole in
    its own block and the publishes come out as when nothing is placed."""
    bodies = [bytes([n]) * 40_000 + bytes(range(256)) * (n * 300) for n in range(1, 4)]
    stream = b"".join(publish(1, body, frame_max=65536) for body in bodies) + publish(1, b"z")
    expected = _comparable(opened(frame_max=65536).receive_data(stream))
    placer = _Placer()
    events, _ = _feed(_placing(placer, frame_max=65536), stream, sizes)
    got = [e for e in events if isinstance(e, PublishReceived)]
    assert [placer.body(e) for e in got[:3]] == bodies
    assert [e.placed for e in got] == [*sorted(placer.live), -1]  # a block each, in order
    unplaced = [e._replace(body=[placer.body(e)]) if e.placed >= 0 else e for e in got]
    assert _comparable(unplaced) == [e for e in expected if isinstance(e, tuple)]


def test_a_body_that_cannot_be_placed_is_assembled_as_before() -> None:
    """When ``place`` answers None (the arena is full, publishers are blocked) the body is
    assembled in pieces, as without placing."""
    big = b"q" * 100_000
    placer = _Placer(refuse=1)
    events, _ = _feed(_placing(placer), publish(1, big), [30_000])
    [event] = [e for e in events if isinstance(e, PublishReceived)]
    assert event.placed == -1 and b"".join(bytes(c) for c in event.body) == big
    assert placer.live == {}


def test_a_closed_connection_frees_the_block_of_a_body_half_here() -> None:
    """A connection that ends mid-body (a method between two body frames: 505, then close-ok)
    frees the block its publish had."""
    placer = _Placer()
    conn = _placing(placer)
    stream = publish(1, b"b" * 200_000)  # body frames of 131,064 and 68,936 octets
    first_frame_end = len(stream) - (68_936 + 8)
    _feed(conn, stream[:first_frame_end], [60_000])
    assert list(placer.live) == [0]
    conn.receive_data(method(1, commands.Basic.Qos(prefetch_count=1)))
    assert_closing(conn, 505, "UNEXPECTED_FRAME - expected content body, got non content body "
                   "frame instead", 60, 40)
    conn.receive_data(method(0, commands.Connection.CloseOk()))
    assert conn.state is State.CLOSED and placer.released == [0] and placer.live == {}


def test_release_bodies_frees_what_the_runtime_abandons() -> None:
    """The socket went (the protocol never saw a close): ``release_bodies`` frees the block,
    and a room handed out before no longer points into it."""
    placer = _Placer()
    conn = _placing(placer)
    stream = publish(1, b"c" * 100_000)
    _feed(conn, stream[:60_000], [60_000])
    room = conn.receive_room()
    assert room is not None
    conn.release_bodies()
    assert placer.released == [0]
    again = conn.receive_room()
    assert again is not None and again.obj is not placer.memory


def test_a_channel_closed_by_the_server_mid_body_frees_the_block_and_stops_writing_it() -> None:
    """The server closes the channel (an error on an earlier publish, say) while a body frame
    is being received into its block: the block is freed at once, the rest of that frame goes
    elsewhere (the freed block may be someone else's by then), and the channel discards it."""
    placer = _Placer()
    conn = _placing(placer)
    stream = publish(1, b"d" * 100_000) + publish(1, b"e" * 100_000)
    events, _ = _feed(conn, stream[:60_000], [60_000])
    conn.handle_error(errors.NotFound("no exchange 'x' in vhost '/'", 60, 40), 1)
    assert placer.released == [0]
    before = bytes(placer.memory[:200_000])
    events, _ = _feed(conn, stream[60_000:], [30_000])
    assert bytes(placer.memory[:200_000]) == before  # nothing written there after the free
    assert not [e for e in events if isinstance(e, PublishReceived)]  # the channel is closing
    assert placer.live == {}
