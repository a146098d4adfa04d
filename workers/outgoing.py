"""What a worker sends a client on a channel, as events the connection encodes.

wsproto's model (``Connection.send(event) -> bytes``): the runtime hands
``AMQPConnection.send`` an event; the connection checks that it is running and that the
event's channel is open (nothing may follow a close on the wire but close-ok), encodes the
event -- content split into body frames by the negotiated frame_max -- and queues the bytes.
The content-bearing events and the confirms wrap ``workers.codec``'s hand-written encoders
(the hot path); ``Method`` takes any other method through pamqp.

Immutable NamedTuples, not frozen dataclasses: they are made on the hot path (a confirm per
publish batch, deliveries per pull), where a frozen dataclass's ``__init__`` costs several
times a tuple's.
"""

from __future__ import annotations

from typing import NamedTuple

from pamqp import base

from workers import codec
from workers.codec import Buffer

# One message of a Deliveries event: (delivery tag, redelivered, exchange, routing key,
# content header payload, body). A plain tuple: one is made per message.
Delivery = tuple[int, bool, str, str, Buffer, Buffer]


class Deliveries(NamedTuple):
    """basic.deliver of each message one pull brought a consumer, in order, each with its
    content header (verbatim) and body. One event per pull, not per message: the state check
    and the dispatch are paid once per batch."""

    channel: int
    consumer_tag: str
    messages: list[Delivery]


class BasicGetOk(NamedTuple):
    """basic.get-ok with the message's content header and body."""

    channel: int
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    message_count: int
    header: Buffer
    body: Buffer


class Return(NamedTuple):
    """basic.return of an unroutable mandatory publish, with its content. Always encoded
    into bytes (its body copied): the worker frees the publish's arena block as soon as the
    handler has queued it (``Worker._dispatch``), before anything is sent."""

    channel: int
    reply_code: int
    reply_text: str
    exchange: str
    routing_key: str
    header: Buffer
    body: Buffer


class DeclareOk(NamedTuple):
    """queue.declare-ok (encoded by hand: any short string is a queue name)."""

    channel: int
    queue: str
    message_count: int
    consumer_count: int


class Ack(NamedTuple):
    """A publisher confirm: basic.ack up to ``delivery_tag`` (``multiple``) or of it alone."""

    channel: int
    delivery_tag: int
    multiple: bool


class Nack(NamedTuple):
    """A negative publisher confirm (requeue left at its default, as RabbitMQ sends it)."""

    channel: int
    delivery_tag: int
    multiple: bool


class Method(NamedTuple):
    """Any other method frame, through pamqp."""

    channel: int
    method: base.Frame


Outgoing = Deliveries | BasicGetOk | Return | DeclareOk | Ack | Nack | Method


def encode(event: Outgoing, frame_max: int) -> bytes:
    """The frames of one event; content split into body frames of at most frame_max octets."""
    # The hot events first: deliveries, a confirm.
    if isinstance(event, Deliveries):
        return b"".join(encode_deliveries(event, frame_max))
    if isinstance(event, Ack):
        return codec.encode_ack(*event)
    if isinstance(event, Method):
        return codec.encode_method(event.channel, event.method)
    if isinstance(event, BasicGetOk):
        return codec.encode_get_ok(*event, frame_max)
    if isinstance(event, Return):
        return codec.encode_return(*event, frame_max)
    if isinstance(event, DeclareOk):
        return codec.encode_declare_ok(*event)
    return codec.encode_nack(*event)


def deliveries_into(out: list[Buffer], event: Deliveries, frame_max: int,
                    ends: list[int] | None = None) -> int:
    """Each message's frames appended to ``out`` (``codec.content_into``: a big body as
    views of it, not copied); the octets appended. With ``ends``, where each message's frames
    end is appended to it too (octets from the event's start)."""
    channel, consumer_tag, messages = event
    deliver_into = codec.deliver_into
    size = 0
    for tag, redelivered, exchange, routing_key, header, body in messages:
        size += deliver_into(out, channel, consumer_tag, tag, redelivered, exchange,
                             routing_key, header, body, frame_max)
        if ends is not None:
            ends.append(size)
    return size


def get_ok_into(out: list[Buffer], event: BasicGetOk, frame_max: int) -> int:
    """A get-ok's frames appended to ``out`` (``codec.content_into``); the octets appended."""
    return codec.get_ok_into(out, *event, frame_max)


def encode_deliveries(event: Deliveries, frame_max: int) -> list[bytes]:
    """Each message's basic.deliver, content header and body frames, one bytes per message."""
    channel, consumer_tag, messages = event
    encode_deliver = codec.encode_deliver
    return [
        encode_deliver(channel, consumer_tag, tag, redelivered, exchange, routing_key, header,
                       body, frame_max)
        for tag, redelivered, exchange, routing_key, header, body in messages
    ]
