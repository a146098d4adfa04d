"""Driving one `workers.connection.AMQPConnection` by hand: frames in, decoded frames out, the
handshake run up to open (test_connection.py, test_output_parts.py)."""

from __future__ import annotations

from typing import Any

from pamqp import base, body, commands, frame, header

from tests.workers.helpers import decode, default_server_properties
from workers.connection import AMQPConnection
from workers.connection_state import State
from workers.frame_buffer import PROTOCOL_HEADER


def method(channel: int, value: base.Frame) -> bytes:
    return frame.marshal(value, channel)


def content_header(
    channel: int, body_size: int, properties: commands.Basic.Properties | None = None
) -> bytes:
    return frame.marshal(header.ContentHeader(0, body_size, properties), channel)


def body_frame(channel: int, data: bytes) -> bytes:
    return frame.marshal(body.ContentBody(data), channel)


def publish(channel: int, data: bytes, frame_max: int = 131072, **kwargs: Any) -> bytes:
    out = method(channel, commands.Basic.Publish(**kwargs)) + content_header(channel, len(data))
    for offset in range(0, len(data), frame_max - 8):
        out += body_frame(channel, data[offset : offset + frame_max - 8])
    return out


def sent(conn: AMQPConnection) -> list[tuple[int, Any]]:
    """Decode data_to_send() into (channel, pamqp frame) pairs."""
    return decode(conn.data_to_send())


def start_ok(
    mechanism: str = "PLAIN", response: str | bytes = "\0guest\0guest", failure_close: bool = True
) -> bytes:
    client_properties = {
        "product": "test",
        "capabilities": {"authentication_failure_close": failure_close},
    }
    return method(0, commands.Connection.StartOk(client_properties, mechanism, response))  # type: ignore[arg-type]


def new_connection(**kwargs: Any) -> AMQPConnection:
    kwargs.setdefault("server_properties", default_server_properties())
    return AMQPConnection(**kwargs)


def tuned(
    conn: AMQPConnection, frame_max: int = 131072, channel_max: int = 2047, heartbeat: int = 60
) -> None:
    """Run the handshake up to (not including) connection.open."""
    conn.receive_data(PROTOCOL_HEADER)
    conn.receive_data(start_ok())
    conn.receive_data(method(0, commands.Connection.TuneOk(channel_max, frame_max, heartbeat)))
    conn.data_to_send()


def opened(channels: tuple[int, ...] = (1,), **kwargs: Any) -> AMQPConnection:
    """A running connection with the given channels open and its output drained."""
    tune = {k: kwargs.pop(k) for k in ("frame_max", "channel_max", "heartbeat") if k in kwargs}
    conn = new_connection(**kwargs)
    tuned(conn, **tune)
    conn.receive_data(method(0, commands.Connection.Open("/")))
    for channel in channels:
        conn.receive_data(method(channel, commands.Channel.Open()))
    conn.data_to_send()
    return conn


def only_close(conn: AMQPConnection) -> commands.Connection.Close:
    frames = sent(conn)
    assert len(frames) == 1 and frames[0][0] == 0, frames
    close = frames[0][1]
    assert isinstance(close, commands.Connection.Close)
    return close


def assert_closing(
    conn: AMQPConnection, code: int, text: str, class_id: int = 0, method_id: int = 0
) -> None:
    close = only_close(conn)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        code,
        text,
        class_id,
        method_id,
    )
    assert conn.state is State.CLOSING
