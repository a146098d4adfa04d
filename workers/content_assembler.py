"""Reassemble one channel's basic.publish: method, content header and body frames into one event.

AMQP 0-9-1 §4.2.6: a content-bearing method is followed on its channel by one content header
frame and as many body frames as the header's body size needs, with nothing in between.
``AMQPConnection`` owns one ``ContentAssembler`` per open channel (as h2's connection owns its
``FrameBuffer``) and feeds it the frames its channel table routes here; the assembler checks
each frame against the publish it is assembling, caps the body a peer can make us buffer
(``max_body_size``, checked on the header before any body arrives), and returns the complete
publish as a ``PublishReceived``. Errors are raised as ``broker.errors`` classes, with
RabbitMQ's texts (rabbit_command_assembler, rabbit_channel:check_msg_size).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from broker import errors
from workers import codec
from workers.events import PublishReceived

PUBLISH_IDS: Final = (codec.BASIC_CLASS, codec.BASIC_PUBLISH)
# RabbitMQ's own limit; its text then says "max size", not "configured max size".
_RABBITMQ_MAX_BODY: Final = 512 << 20
# tuple.__new__ skips NamedTuple's Python-level __new__: one PublishReceived per message.
_new_publish = tuple.__new__
# A body at least this big is assembled where it will be stored, when the connection can place
# it (``place``): its arena block is taken when the content header comes, and its big body frames
# are received straight into it (FrameBuffer.sink) instead of being copied there at the end.
PLACE_MIN: Final = 32 << 10

# place(content header payload, body size) -> (the view its body goes to, its block's offset,
# the stored header's length), or None (assemble it in pieces); release(offset) frees the block.
Place = Callable[[bytes, int], tuple[memoryview, int, int] | None]
Release = Callable[[int], None]


class ContentAssembler:
    """The publish one channel is assembling; empty between publishes."""

    __slots__ = (
        "body_size",
        "chunks",
        "exchange",
        "header_len",
        "header_payload",
        "immediate",
        "mandatory",
        "max_body_size",
        "offset",
        "place",
        "release",
        "remaining",
        "room",
        "routing_key",
        "target",
    )

    def __init__(self, max_body_size: int, place: Place | None = None,
                 release: Release | None = None) -> None:
        self.max_body_size = max_body_size
        self.place = place
        self.release = release
        # A placed publish: the view its body goes to (filled up to body_size - remaining), its
        # block, and the last view handed out for a body frame to be received into (body_room).
        self.target: memoryview | None = None
        self.room: memoryview | None = None
        self.offset = 0
        self.header_len = 0
        self.reset()

    def reset(self) -> None:
        """Drop the publish in assembly (the channel closes, or it completed); a block taken
        for its body is freed."""
        if self.target is not None:
            self.target = self.room = None
            if self.release is not None:
                self.release(self.offset)
        self.offset = 0
        self.header_len = 0
        self.exchange = ""
        self.routing_key = ""
        self.mandatory = False
        self.immediate = False
        self.header_payload = b""
        self.body_size = 0
        self.remaining = 0
        self.chunks: list[bytes | memoryview] = []

    def begin(self, payload: memoryview) -> None:
        """basic.publish: remember where it goes; its content header comes next."""
        try:
            exchange, routing_key, mandatory, immediate = codec.decode_basic_publish(payload)
        except codec.DecodeError as exc:
            raise errors.FrameError(str(exc), *PUBLISH_IDS) from exc
        if immediate:
            # RabbitMQ (3.0+) does not implement immediate (rabbit_channel).
            raise errors.NotImplemented_("immediate=true", *PUBLISH_IDS)
        self.exchange, self.routing_key = exchange, routing_key
        self.mandatory, self.immediate = mandatory, immediate

    def header(self, channel: int, payload: memoryview) -> PublishReceived | None:
        """The content header: the publish when its body is empty, else None (bodies follow)."""
        try:
            class_id, body_size, _ = codec.parse_content_header(payload)
        except codec.DecodeError as exc:
            raise errors.FrameError(str(exc)) from exc
        if class_id != codec.BASIC_CLASS:
            raise errors.UnexpectedFrame(
                f"expected content header for class 60, got one for class {class_id} instead",
                *PUBLISH_IDS,
            )
        if body_size > self.max_body_size:
            self.reset()
            # rabbit_channel:check_msg_size words it so; "max size" alone at its 512 MiB cap.
            configured = "max size" if self.max_body_size == _RABBITMQ_MAX_BODY else (
                "configured max size")
            raise errors.PreconditionFailed(
                f"message size {body_size} is larger than {configured} {self.max_body_size}",
                *PUBLISH_IDS,
            )
        self.header_payload = bytes(payload)
        self.body_size = self.remaining = body_size
        if body_size >= PLACE_MIN and self.place is not None:
            placed = self.place(self.header_payload, body_size)
            if placed is not None:
                self.target, self.offset, self.header_len = placed
        return None if body_size else self._complete(channel)

    def body_room(self, size: int) -> memoryview | None:
        """Where the next body frame's payload (``size`` octets) may be received, when this
        publish is placed and the frame fits; that view is then the frame's payload."""
        target = self.target
        if target is None or size > self.remaining:
            return None
        filled = self.body_size - self.remaining
        room = self.room = target[filled : filled + size]
        return room

    def body(self, channel: int, payload: memoryview) -> PublishReceived | None:
        """A body frame: the publish once its last body frame is here, else None."""
        size = len(payload)
        if size > self.remaining:
            # rabbit_command_assembler: a frame_error, not unexpected_frame.
            raise errors.FrameError(
                "content body frame exceeds remaining content size", *PUBLISH_IDS
            )
        if size:
            target = self.target
            if target is None:
                self.chunks.append(payload)
            else:
                if payload is not self.room:  # else it was received there
                    filled = self.body_size - self.remaining
                    target[filled : filled + size] = payload
                self.room = None
            self.remaining -= size
        return None if self.remaining else self._complete(channel)

    def whole(
        self, channel: int, method: memoryview, header: memoryview, body: memoryview
    ) -> PublishReceived | None:
        """The publish hot path: method, header and one body frame, all here at once. None
        (declined) whenever the frame-by-frame path could answer differently, so every error
        still comes from one place; nothing is assembled either way."""
        if len(body) > self.max_body_size:
            return None
        try:
            exchange, routing_key, mandatory, immediate = codec.decode_basic_publish(method)
        except codec.DecodeError:
            return None
        if immediate:
            return None
        return _new_publish(PublishReceived, (
            channel, exchange, routing_key, mandatory, False, bytes(header), len(body),
            [body] if len(body) else [], -1, 0,
        ))

    def _complete(self, channel: int) -> PublishReceived:
        placed = -1
        if self.target is not None:  # the body is in its block: the block is the publish's now
            placed = self.offset
            self.target = self.room = None
        publish = PublishReceived(
            channel, self.exchange, self.routing_key, self.mandatory, self.immediate,
            self.header_payload, self.body_size, self.chunks, placed, self.header_len,
        )
        self.reset()
        return publish
