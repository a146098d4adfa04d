"""AMQPConnection from the protocol header to connection.open-ok: logins (PLAIN, AMQPLAIN,
loopback-only users), tune, the handshake's order, and the framing errors that close it."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands, encode

from broker.passwords import hashed
from tests.workers.connection_helpers import (
    assert_closing,
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
from workers.connection_state import Input, State, UnexpectedMethod
from workers.events import (
    ConnectionClosed,
    ConnectionOpened,
    PublishReceived,
)
from workers.frame_buffer import PROTOCOL_HEADER

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
