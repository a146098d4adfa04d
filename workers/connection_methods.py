"""The connection class's methods on channel 0, server side: start-ok, tune-ok, open,
update-secret, close and close-ok, each carried out on an ``AMQPConnection``
(``workers.connection``) once its state machine has taken it.

``AMQPConnection`` decides whether a method may come now (``workers.connection_state``);
``on_connection_method`` looks the method's input up, has the connection check the
transition, runs the method's handler here and enters the state the table names. The
handshake's own checks and answers are ``workers.handshake``'s; what is done here is what the
connection keeps of them (the user, the tuned limits, the vhost) and the checks at
connection.open that need the worker (limits, vhost access). None of it is on a message's
path: a connection takes these methods a handful of times in its life.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from pamqp import base, commands

from broker import errors
from broker.permissions import vhost_refused
from workers import codec
from workers.channel_frames import ChannelFrames, method_ids
from workers.connection_state import METHOD_INPUTS, Input, State, UnexpectedMethod
from workers.events import ConnectionOpened, Event, MethodReceived
from workers.frame_buffer import FrameBuffer
from workers.handshake import Handshake
from workers.limits import WorkerLimits
from workers.liveness import Liveness


class AMQPConnection(Protocol):
    """What these methods use of ``workers.connection.AMQPConnection`` (a protocol, so that
    this module does not import the connection that imports it)."""

    _state: State
    _handshake: Handshake
    _channels: ChannelFrames
    _liveness: Liveness
    _buffer: FrameBuffer
    _events: list[Event]
    user: str
    vhost: str
    client_properties: dict[str, Any]
    frame_max: int
    channel_max: int
    close_reason: str | None
    vhost_access: Callable[[str, str], bool] | None
    vhost_exists: Callable[[str], bool] | None
    limits: WorkerLimits | None

    @property
    def heartbeat(self) -> int: ...
    def _transition(self, input_: Input, class_id: int = 0, method_id: int = 0) -> State: ...
    def _enter(self, state: State) -> None: ...
    def _queue_out(self, data: bytes | bytearray | memoryview) -> None: ...


def on_connection_method(conn: AMQPConnection, method: base.Frame) -> None:
    """A connection-class method on channel 0: checked against the state table, carried
    out, and the connection moved to the state the table names."""
    class_id, method_id = method_ids(method)
    input_ = METHOD_INPUTS.get(method.index)
    if input_ is None:
        # A known method we never take (connection.start, secure-ok, blocked, a channel's
        # method): 504, as RabbitMQ 3.10 answers it. Ids AMQP 0-9-1 does not define were
        # 540 in _decode (RabbitMQ drops the socket without a word).
        raise UnexpectedMethod(conn._state, method.name, class_id, method_id)
    target = conn._transition(input_, class_id, method_id)
    _CONNECTION_HANDLERS[input_](conn, method)
    conn._enter(target)


def _on_start_ok(conn: AMQPConnection, method: commands.Connection.StartOk) -> None:
    handshake = conn._handshake
    try:
        conn._queue_out(handshake.start_ok(method))
    finally:  # the properties also when the login is refused
        conn.user = handshake.user
        conn.client_properties = handshake.client_properties


def _on_tune_ok(conn: AMQPConnection, method: commands.Connection.TuneOk) -> None:
    tuned = conn._handshake.tune_ok(method)
    conn.frame_max = tuned.frame_max
    conn.channel_max = tuned.channel_max
    conn._channels.channel_max = tuned.channel_max
    conn._liveness.heartbeat = tuned.heartbeat
    conn._buffer.frame_max = tuned.frame_max


def _on_open(conn: AMQPConnection, method: commands.Connection.Open) -> None:
    conn.vhost = vhost = conn._handshake.open(method, conn.vhost_exists)
    if conn.limits is not None:  # rabbit_reader: the vhost's limit, the user's, then access
        if (refused := conn.limits.admit_connection(vhost, conn.user)) is not None:
            raise errors.NotAllowed(refused, 10, 40)
        conn._channels.admit = partial(conn.limits.admit_channel, conn.user)
    if conn.vhost_access is not None and not conn.vhost_access(conn.user, vhost):
        raise errors.NotAllowed(vhost_refused(vhost, conn.user), 10, 40)
    conn._queue_out(codec.encode_method(0, commands.Connection.OpenOk()))
    conn._events.append(
        ConnectionOpened(
            vhost,
            conn.user,
            conn.client_properties,
            conn.frame_max,
            conn.channel_max,
            conn.heartbeat,
        )
    )


def _on_update_secret(conn: AMQPConnection, method: commands.Connection.UpdateSecret) -> None:
    """RabbitMQ's extension for clients whose credentials expire (OAuth 2 tokens): the
    internal user store keeps no per-connection credential state, so the new secret is
    accepted as RabbitMQ's internal backend accepts it, and the connection carries on.
    The runtime hears of it (for the log) as a method on channel 0."""
    conn._queue_out(codec.encode_method(0, commands.Connection.UpdateSecretOk()))
    conn._events.append(MethodReceived(0, method))


def _on_close(conn: AMQPConnection, method: commands.Connection.Close) -> None:
    conn._queue_out(codec.encode_method(0, commands.Connection.CloseOk()))
    conn.close_reason = f"closed by client: {method.reply_code} {method.reply_text}"


def _on_close_ok(conn: AMQPConnection, method: commands.Connection.CloseOk) -> None:
    pass  # close_reason was set when we sent connection.close


_CONNECTION_HANDLERS: dict[Input, Callable[[AMQPConnection, Any], None]] = {
    Input.START_OK: _on_start_ok,
    Input.TUNE_OK: _on_tune_ok,
    Input.OPEN: _on_open,
    Input.CLOSE: _on_close,
    Input.CLOSE_OK: _on_close_ok,
    Input.UPDATE_SECRET: _on_update_secret,
}
