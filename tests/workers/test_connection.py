"""AMQPConnection once open: channels, content (a publish reassembled from its frames),
heartbeats and timeouts, closing, the runtime's errors, and what it sends (outgoing events).
The handshake is test_connection_handshake.py's, the hot paths test_connection_hot_paths.py's."""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import body, commands, header, heartbeat

from broker import errors
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
)
from workers.connection_state import State
from workers.events import (
    AckReceived,
    ChannelClosed,
    ChannelOpened,
    ConnectionClosed,
    MethodReceived,
    PublishReceived,
)
from workers.frame_buffer import PROTOCOL_HEADER
from workers.outgoing import Ack, DeclareOk, Deliveries, Method, Return

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
