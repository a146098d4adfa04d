"""The frames on a connection's channels 1..channel-max: which channels are open, and what each
may receive next.

``AMQPConnection`` owns one ``ChannelFrames`` and hands it every frame on a channel other than
0 while the connection is running. Dispatch is a table, ``_CHANNEL_TABLE``:
``(channel state, frame type) -> handler``. A channel's state is also its content-assembly
state (AMQP 0-9-1 §4.2.6: a content-bearing method is followed by one content header frame and
body frames, on the same channel, with nothing in between; each channel's ``ContentAssembler``
puts them together), so a miss in the table is exactly RabbitMQ's 505 UNEXPECTED_FRAME, with
RabbitMQ's text for that state. After the server sends channel.close the channel is
``closing``: every frame on it but channel.close / close-ok is discarded (AMQP 0-9-1
channel.close: "any received methods except Close and Close-OK MUST be discarded").

Nothing here holds a reference to the connection: each call gets the list the events go to
and the function that queues a reply (channel.open-ok, channel.close-ok) for the socket.
Errors are raised (``broker.errors``); the connection's ``handle_error`` answers them.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Final

from pamqp import base, commands

from broker import errors
from broker.errors import AMQPError
from workers import codec
from workers.content_assembler import PUBLISH_IDS, ContentAssembler, Place, Release
from workers.events import (
    AckReceived,
    ChannelClosed,
    ChannelOpened,
    Event,
    MethodReceived,
    PublishReceived,
)
from workers.frame_buffer import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    Frame,
)

Send = Callable[[bytes], None]


class ChannelState(enum.Enum):
    UNOPENED = "unopened"
    IDLE = "idle"  # open, expecting a method frame
    AWAIT_HEADER = "awaiting content header"
    AWAIT_BODY = "awaiting content body"
    CLOSING = "closing"  # we sent channel.close; waiting for close-ok


class _ChannelFraming:
    """One channel's row of the channel table (its state) and the publish it is assembling."""

    __slots__ = ("content", "handlers", "state")

    def __init__(self, content: ContentAssembler, state: ChannelState = ChannelState.IDLE) -> None:
        self.content = content
        self.move(state)

    def move(self, state: ChannelState) -> None:
        """Enter ``state``; ``handlers`` is its row of _CHANNEL_TABLE (frame type -> handler)."""
        self.state = state
        self.handlers = _CHANNEL_ROWS[state]


_ACK_IDS: Final = (codec.BASIC_CLASS, codec.BASIC_ACK)
# RabbitMQ's rabbit_command_assembler texts for a frame the state does not expect.
_UNEXPECTED_FRAME_TEXT: Final = {
    ChannelState.UNOPENED: "expected method frame, got non method frame instead",
    ChannelState.IDLE: "expected method frame, got non method frame instead",
    ChannelState.AWAIT_HEADER: (
        "expected content header for class 60, got non content header frame instead"
    ),
    ChannelState.AWAIT_BODY: "expected content body, got non content body frame instead",
}

# Methods a client may send on an open channel and the runtime handles.
_CLIENT_METHODS: Final = frozenset(
    getattr(getattr(commands, class_name), method_name).index
    for class_name, method_names in {
        "Channel": "Flow FlowOk",
        "Exchange": "Declare Delete Bind Unbind",
        "Queue": "Declare Bind Purge Delete Unbind",
        "Basic": "Qos Consume Cancel Get Ack Reject RecoverAsync Recover Nack",
        "Tx": "Select Commit Rollback",
        "Confirm": "Select",
    }.items()
    for method_name in method_names.split()
)

_IDS: Final = struct.Struct(">HH")


class ChannelFrames:
    """A connection's open channels and their frame table. See the module docstring."""

    def __init__(self, max_body_size: int, channel_max: int) -> None:
        self._max_body_size = max_body_size
        self.channel_max = channel_max  # the negotiated value, set at tune-ok
        # Why a new channel is refused (the user's max-channels, workers.limits); None: never
        self.admit: Callable[[], str | None] | None = None
        self._channels: dict[int, _ChannelFraming] = {}
        # The open channels that are not closing: what may be sent on (checked per frame sent).
        self.sendable: set[int] = set()
        # How channels opened from now on place big bodies (ContentAssembler), if they do.
        self._place: Place | None = None
        self._release: Release | None = None
        self._unplace: Callable[[memoryview], None] | None = None

    def place_bodies(self, place: Place, release: Release,
                     unplace: Callable[[memoryview], None]) -> None:
        """Assemble big bodies where they will be stored (see ContentAssembler.place), on the
        channels open now and those opened later.
        ``unplace(room)``: a publish whose body frame is being received into ``room`` was
        dropped (its block is freed): the rest of that frame must go elsewhere."""
        self._place, self._release, self._unplace = place, release, unplace
        for chan in self._channels.values():
            chan.content.place, chan.content.release = place, release

    # -- queries --------------------------------------------------------------------

    def is_open(self, channel: int) -> bool:
        """Open and not closing: frames may be sent on it."""
        return channel in self.sendable

    # -- input ------------------------------------------------------------------------

    def receive(self, frame: Frame, events: list[Event], send: Send) -> None:
        """One frame on a channel; its event, if it completes one, goes to ``events``."""
        chan = self._channels.get(frame.channel)
        if chan is None:
            # channel-max is "the maximum total number of channels", not the highest number:
            # a client may open channel 65535 (rabbit_reader create_channel).
            if self.channel_max and len(self._channels) >= self.channel_max:
                raise errors.NotAllowed(
                    f"number of channels opened ({len(self._channels)}) has reached the "
                    f"negotiated channel_max ({self.channel_max})",
                )
            if self.admit is not None and (refused := self.admit()) is not None:
                raise errors.NotAllowed(refused)  # the user's max-channels (workers.limits)
            chan = _UNOPENED
        handler = chan.handlers.get(frame.type)  # a row of _CHANNEL_TABLE
        if handler is None:
            raise _unexpected_frame(chan.state)
        handler(self, frame.channel, chan, frame.payload, events, send)

    def whole_publish(
        self, channel: int, method: memoryview, header: memoryview, body: memoryview
    ) -> PublishReceived | None:
        """The publish hot path (FrameBuffer.next_publish): the publish, or None where the
        frame-by-frame path must take the frames (it may answer differently)."""
        chan = self._channels.get(channel)
        if chan is None or chan.state is not ChannelState.IDLE:
            return None
        return chan.content.whole(channel, method, header, body)

    def whole_ack(self, channel: int, delivery_tag: int, multiple: bool) -> AckReceived | None:
        """The ack hot path (FrameBuffer.next_ack): the ack, or None where the frame-by-frame
        path must take the frame (a channel not open, or in the middle of a publish's
        content: its answer is an error)."""
        chan = self._channels.get(channel)
        if chan is None or chan.state is not ChannelState.IDLE:
            return None
        return AckReceived(channel, delivery_tag, multiple)

    def body_room(self, channel: int, size: int) -> memoryview | None:
        """FrameBuffer.sink: where a big body frame on ``channel`` may be received, when the
        channel is assembling a placed publish and the frame fits it; else None (the frame is
        read as any other, and answered as any other)."""
        chan = self._channels.get(channel)
        if chan is None or chan.state is not ChannelState.AWAIT_BODY:
            return None
        return chan.content.body_room(size)

    # -- output-side state ----------------------------------------------------------------

    def start_close(self, channel: int) -> bool:
        """We send channel.close: the channel is closing until its close-ok. False when it is
        not open (unknown, or closing already)."""
        chan = self._channels.get(channel)
        if chan is None or chan.state is ChannelState.CLOSING:
            return False
        self._reset(chan.content)
        chan.move(ChannelState.CLOSING)
        self.sendable.discard(channel)
        return True

    def clear(self) -> None:
        """The connection is closed: every channel is gone with it."""
        self.release()
        self._channels.clear()
        self.sendable.clear()

    def release(self) -> None:
        """Drop every publish in assembly, freeing the blocks of placed ones (the connection
        is over, whatever state its protocol was left in)."""
        for chan in self._channels.values():
            self._reset(chan.content)

    def _reset(self, content: ContentAssembler) -> None:
        """Drop ``content``'s publish in assembly, and tell the frame buffer when a body frame
        was being received into its block (freed now)."""
        room = content.room
        content.reset()
        if room is not None and self._unplace is not None:
            self._unplace(room)

    # -- the table's handlers -------------------------------------------------------------

    def _on_unopened_method(
        self, channel: int, chan: _ChannelFraming, payload: memoryview, events: list[Event],
        send: Send,
    ) -> None:
        method = decode_method(payload)
        if not isinstance(method, commands.Channel.Open):
            raise errors.ChannelError("expected 'channel.open'", *method_ids(method))
        self._channels[channel] = _ChannelFraming(
            ContentAssembler(self._max_body_size, self._place, self._release))
        self.sendable.add(channel)
        send(codec.encode_method(channel, commands.Channel.OpenOk()))
        events.append(ChannelOpened(channel))

    def _on_method(
        self, channel: int, chan: _ChannelFraming, payload: memoryview, events: list[Event],
        send: Send,
    ) -> None:
        ids = _IDS.unpack_from(payload) if len(payload) >= 4 else None
        if ids == PUBLISH_IDS:
            chan.content.begin(payload)
            chan.move(ChannelState.AWAIT_HEADER)
            return
        method = _decode_ack(payload) if ids == _ACK_IDS else decode_method(payload)
        if isinstance(method, commands.Channel.Close):
            send(codec.encode_method(channel, commands.Channel.CloseOk()))
            self._drop(channel, events)
        elif isinstance(method, commands.Channel.Open):
            raise errors.ChannelError("second 'channel.open' seen", 20, 10)
        elif method.index in _CLIENT_METHODS:
            events.append(MethodReceived(channel, method))
        else:
            # rabbit_channel's answer to a method a client may not send.
            raise errors.CommandInvalid("unimplemented method", *method_ids(method))

    def _on_closing_method(
        self, channel: int, chan: _ChannelFraming, payload: memoryview, events: list[Event],
        send: Send,
    ) -> None:
        ids = _IDS.unpack_from(payload) if len(payload) >= 4 else None
        if ids == (20, 40):  # channel.close crossing ours: answer it, keep waiting
            send(codec.encode_method(channel, commands.Channel.CloseOk()))
        elif ids == (20, 41):
            self._drop(channel, events)

    def _discard(
        self, channel: int, chan: _ChannelFraming, payload: memoryview, events: list[Event],
        send: Send,
    ) -> None:
        pass

    def _drop(self, channel: int, events: list[Event]) -> None:
        self._reset(self._channels.pop(channel).content)
        self.sendable.discard(channel)
        events.append(ChannelClosed(channel))

    def _on_content_header(
        self, channel: int, chan: _ChannelFraming, payload: memoryview, events: list[Event],
        send: Send,
    ) -> None:
        # A body too large is refused (406) before any of it is buffered: the assembler drops
        # the publish, and handle_error closes the channel.
        publish = chan.content.header(channel, payload)
        if publish is None:
            chan.move(ChannelState.AWAIT_BODY)
        else:
            events.append(publish)
            chan.move(ChannelState.IDLE)

    def _on_content_body(
        self, channel: int, chan: _ChannelFraming, payload: memoryview, events: list[Event],
        send: Send,
    ) -> None:
        publish = chan.content.body(channel, payload)
        if publish is not None:
            events.append(publish)
            chan.move(ChannelState.IDLE)


_ChannelHandler = Callable[
    [ChannelFrames, int, _ChannelFraming, memoryview, list[Event], Send], None
]

# (channel state, frame type) -> handler.  A miss is 505 UNEXPECTED_FRAME.
_CHANNEL_TABLE: dict[tuple[ChannelState, int], _ChannelHandler] = {
    (ChannelState.UNOPENED, FRAME_METHOD): ChannelFrames._on_unopened_method,
    (ChannelState.IDLE, FRAME_METHOD): ChannelFrames._on_method,
    (ChannelState.AWAIT_HEADER, FRAME_HEADER): ChannelFrames._on_content_header,
    (ChannelState.AWAIT_BODY, FRAME_BODY): ChannelFrames._on_content_body,
    (ChannelState.CLOSING, FRAME_METHOD): ChannelFrames._on_closing_method,
    (ChannelState.CLOSING, FRAME_HEADER): ChannelFrames._discard,
    (ChannelState.CLOSING, FRAME_BODY): ChannelFrames._discard,
    (ChannelState.CLOSING, FRAME_HEARTBEAT): ChannelFrames._discard,
}
# The table by row, so that dispatch is one int-keyed lookup per frame.
_CHANNEL_ROWS: dict[ChannelState, dict[int, _ChannelHandler]] = {
    state: {
        frame_type: handler for (row, frame_type), handler in _CHANNEL_TABLE.items() if row is state
    }
    for state in ChannelState
}
_UNOPENED: Final = _ChannelFraming(ContentAssembler(0), ChannelState.UNOPENED)  # shared, never mutated


def method_ids(method: base.Frame) -> tuple[int, int]:
    """(class id, method id) of a pamqp method, for close frames."""
    return method.index >> 16, method.index & 0xFFFF


def decode_method(payload: memoryview) -> base.Frame:
    """A method frame via pamqp; unknown ids are 540, undecodable fields 501."""
    try:
        return codec.decode_method(payload)
    except codec.UnknownMethod as exc:
        raise errors.NotImplemented_(str(exc), exc.class_id, exc.method_id) from exc
    except codec.DecodeError as exc:
        raise errors.FrameError(str(exc)) from exc


def _decode_ack(payload: memoryview) -> base.Frame:
    try:
        return codec.decode_basic_ack(payload)
    except codec.DecodeError as exc:
        raise errors.FrameError(str(exc), *_ACK_IDS) from exc


def _unexpected_frame(state: ChannelState) -> AMQPError:
    ids = PUBLISH_IDS if state in (ChannelState.AWAIT_HEADER, ChannelState.AWAIT_BODY) else (0, 0)
    return errors.UnexpectedFrame(_UNEXPECTED_FRAME_TEXT[state], *ids)
