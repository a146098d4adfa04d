"""Events an ``AMQPConnection`` hands to the worker runtime.

Each is the outcome of bytes a client sent: ``AMQPConnection.receive_data``
returns them in the order the frames arrived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from pamqp import base


@dataclass(frozen=True, slots=True)
class ConnectionOpened:
    """connection.open accepted and open-ok queued: the client may open channels."""

    vhost: str
    user: str
    client_properties: dict[str, Any]
    frame_max: int
    channel_max: int
    heartbeat: int


@dataclass(frozen=True, slots=True)
class ChannelOpened:
    """channel.open accepted and open-ok queued."""

    channel: int


@dataclass(frozen=True, slots=True)
class MethodReceived:
    """A channel-level method for the runtime (exchange, queue, basic, tx,
    confirm, channel.flow), decoded by pamqp; never basic.publish."""

    channel: int
    method: base.Frame


class AckReceived(NamedTuple):
    """basic.ack from a client, read on the consumer's hot path (``FrameBuffer.next_ack``):
    what a ``MethodReceived`` with a ``Basic.Ack`` says, without the pamqp method (one is
    made per delivery for a consumer that acks each message). A NamedTuple, as
    ``PublishReceived``."""

    channel: int
    delivery_tag: int
    multiple: bool


class PublishReceived(NamedTuple):
    """A complete basic.publish: method, content header and all body frames.

    ``header_payload`` is the content header frame's payload verbatim (class
    id, weight, body size, property flags and properties), ready to be passed
    through to ``codec.encode_deliver``.  ``body`` is the body frames'
    payloads in order; their lengths sum to ``body_size``.  ``immediate`` is
    always False: the connection answers immediate=true with 540, as RabbitMQ.

    A NamedTuple, not a frozen dataclass like the other events: one is made per
    message, and ``tuple.__new__(PublishReceived, fields)`` costs a fraction of
    a frozen dataclass's ``__init__`` (0.5 against 4.2 us, timeit, loaded machine).
    """

    channel: int
    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool
    header_payload: bytes
    body_size: int
    body: list[bytes | memoryview]
    # A big body received straight into the arena (ContentAssembler.place): its block's offset,
    # with the stored header (``placed_header`` octets) before the body; ``body`` is empty.
    placed: int = -1
    placed_header: int = 0


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    """The channel is gone: the client closed it (close-ok already queued),
    or it acknowledged a close we sent.  Emitted once per channel lifetime;
    the runtime requeues its unacked messages and cancels its consumers."""

    channel: int


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The connection is finished: flush ``data_to_send()``, then close the
    socket.  Every channel still open is gone with it (no ChannelClosed is
    emitted for them)."""

    reason: str


Event = (
    ConnectionOpened
    | ChannelOpened
    | MethodReceived
    | AckReceived
    | PublishReceived
    | ChannelClosed
    | ConnectionClosed
)
