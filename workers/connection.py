"""Sans-IO AMQP 0-9-1 server connection: bytes in, events and frames out.

Theory of operation
===================

``AMQPConnection`` owns one client connection's protocol state and nothing
else: no socket, no clock, no trio.  The runtime around it does four things:

* feeds whatever the socket produced to ``receive_data(data)`` and acts on
  the events it returns (``workers.events``), in order;
* writes ``data_to_send()`` to the socket after every call;
* calls ``heartbeat_tick(now)`` about once a second with a monotonic time;
  when it returns False the connection is dead (missed heartbeats, handshake
  or close timeout) and the socket is closed without further ado;
* closes the socket once ``closed`` is true, after flushing
  ``data_to_send()``.  ``ConnectionClosed`` is emitted when that happens
  inside ``receive_data``.

Bytes go through a ``FrameBuffer`` (complete frames only, size checked
against the negotiated frame_max before the payload is buffered).  Frames on
channel 0 drive the connection state machine, ``workers.connection_state``: a table of
``(state, input) -> state`` applied by ``_transition``, which raises
``UnexpectedMethod`` naming the state and the input when the pair is not in
it.  The states and their names are RabbitMQ's (rabbit_reader), because the
client-visible answer to an error depends on them:

* before ``running`` most errors close the socket silently (RabbitMQ: "we
  don't trust the client at this point"); only a refused login (when the
  client has the ``authentication_failure_close`` capability), a failed tune
  negotiation (530) and any error while ``opening`` get a connection.close;
* in ``running`` a hard error sends connection.close and moves to
  ``closing``, where everything but connection.close / close-ok is ignored
  until the client's close-ok arrives (or ``heartbeat_tick`` times out);
* a framing error means we have lost sync with the byte stream: the close is
  sent and the connection is finished at once.

The connection owns four helpers, each for one job, as h2's connection
owns its FrameBuffer and WindowManager:

* ``ChannelFrames`` (``workers.channel_frames``): frames on the other
  channels go through a second table, ``(channel state, frame type) ->
  handler``; each channel's ``ContentAssembler`` turns basic.publish, its
  content header and its body frames into one ``PublishReceived``, capping
  the body a peer can make us buffer;
* ``Handshake`` (``workers.handshake``): start, start-ok (the login,
  ``workers.sasl``), tune, tune-ok and open, checked and answered; what the
  connection keeps of each channel-0 method, and the worker's checks at open
  (limits, vhost access), are ``workers.connection_methods``'s;
* ``Liveness`` (``workers.liveness``): heartbeats sent and expected, the
  handshake and close timeouts, and the pause rule;
* ``OutputQueue`` (``workers.output_queue``): the frames queued for the
  socket, big bodies as views of their arena blocks.

All protocol errors are ``broker.errors.AMQPError`` subclasses (the code is a
class attribute) and are turned into frames in one place, ``handle_error``:
soft errors close the channel, hard errors the connection, and reply texts
get RabbitMQ's ``"CODE_NAME - "`` prefix there (``AMQPError.frame_text``).
The runtime uses the same entry point for the errors its own handlers raise.

Outgoing frames are queued by ``send(event)``: the connection encodes the
event (``workers.outgoing``: deliveries, get-oks, returns, confirms, any
other method), splitting content by the negotiated frame_max, and refuses
(returns False) once the connection, or the event's channel, is no longer
open: nothing may follow a close on the wire but close-ok.  ``send_raw``
queues bytes already encoded, under the same check.  Output is taken as one
bytes (``data_to_send``) or, by the runtime, as parts (``output_parts``: big
bodies not copied, until ``seal_output``; see ``workers.output_queue``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pamqp import base, commands

from broker import errors
from broker.errors import AMQPError
from workers import codec, sasl
from workers.channel_frames import ChannelFrames, decode_method
from workers.connection_methods import on_connection_method
from workers.connection_state import TRANSITIONS, Input, State, UnexpectedMethod
from workers.content_assembler import Place, Release
from workers.events import ConnectionClosed, Event
from workers.frame_buffer import (
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    PROTOCOL_HEADER,
    Frame,
    FrameBuffer,
)
from workers.handshake import ACCEPTED_PROTOCOL_HEADERS, Handshake
from workers.limits import WorkerLimits
from workers.liveness import Liveness
from workers.outgoing import BasicGetOk, Deliveries, Method, Outgoing, encode
from workers.output_queue import OutputQueue


class AMQPConnection:
    """One client connection, server side.  See the module docstring."""

    def __init__(
        self,
        *,
        server_properties: dict[str, Any],
        frame_max: int = 131072,
        channel_max: int = 2047,
        heartbeat: int = 60,
        # name -> stored password (broker.passwords); empty: nobody; None: guest/guest (tests)
        users: Mapping[str, str] | None = None,
        max_body_size: int = 128 << 20,
        handshake_timeout: float = 10.0,
        peer_is_loopback: bool = True,
        loopback_users: frozenset[str] = frozenset({"guest"}),
        # A TLS connection's verified client certificate CN: EXTERNAL is offered (sasl.py).
        external_user: str | None = None,
    ) -> None:
        self._handshake = Handshake(
            server_properties=server_properties, frame_max=frame_max, channel_max=channel_max,
            heartbeat=heartbeat, users=sasl.DEFAULT_USERS if users is None else users,
            peer_is_loopback=peer_is_loopback, loopback_users=loopback_users,
            external_user=external_user,
        )

        self._state = State.HANDSHAKE
        self._buffer = FrameBuffer(FRAME_MIN_SIZE)
        self._output = OutputQueue()
        self._events: list[Event] = []
        # The most events one call of receive_data / received_into / parse_more returns; the
        # rest of the input waits, parsed, in order, by parse_more (``unparsed``). The runtime
        # sets it (workers.socket_reader.PARSE_EVENTS) so that what a read's parsing builds and
        # the replies it produces stay bounded; unlimited here.
        self.parse_limit = 1 << 62
        self.unparsed = False  # parsing stopped at parse_limit: parse_more has more
        self._channels = ChannelFrames(max_body_size, channel_max)
        self._sendable = self._channels.sendable  # send's check, one set lookup per event

        # Negotiated values (AMQP 0-9-1 §4.2.3: frame-min-size until tuned).
        self.frame_max = FRAME_MIN_SIZE
        self.channel_max = channel_max
        self.vhost = ""
        self.user = ""
        self.client_properties: dict[str, Any] = {}
        self.close_reason: str | None = None
        # (user, vhost) -> may open it: the worker's permissions (workers.access); None: anyone
        self.vhost_access: Callable[[str, str], bool] | None = None
        # vhost -> it exists (the worker's set, workers.worker); None: only "/"
        self.vhost_exists: Callable[[str], bool] | None = None
        # The vhost and user limits (workers.limits): max-connections, max-channels; None: none
        self.limits: WorkerLimits | None = None

        # Heartbeats and timeouts, in the runtime's clock (heartbeat_tick), from byte counts.
        self._liveness = Liveness(handshake_timeout)

    # -- public: state ----------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def bytes_received(self) -> int:
        return self._liveness.bytes_received

    @property
    def bytes_sent(self) -> int:
        return self._liveness.bytes_sent

    @property
    def heartbeat(self) -> int:
        """The negotiated heartbeat, in seconds (0: none)."""
        return self._liveness.heartbeat

    @property
    def reading_paused(self) -> bool:
        """The runtime stopped reading the socket of its own accord (credit flow, memory
        alarm, no arena room): the client's silence is ours, not missed heartbeats."""
        return self._liveness.reading_paused

    @reading_paused.setter
    def reading_paused(self, paused: bool) -> None:
        self._liveness.reading_paused = paused

    @property
    def refused_login(self) -> tuple[str, str] | None:
        """(user, why) of a refused login, for the runtime's log."""
        return self._handshake.refused_login

    @property
    def closed(self) -> bool:
        """True once the socket should be closed (after flushing data_to_send)."""
        return self._state is State.CLOSED

    @property
    def has_data_to_send(self) -> bool:
        return bool(self._output.parts)

    @property
    def _out(self) -> list[bytes | bytearray | memoryview]:
        """The queued parts, in order (``OutputQueue.parts``)."""
        return self._output.parts

    @property
    def unsent_bytes(self) -> int:
        """Output queued and not taken yet (bounded by the runtime: it stops reading)."""
        return self._output.unsent_bytes

    @property
    def unsent_cost(self) -> int:
        """What the output not taken yet costs in memory: its octets plus a part's overhead
        for each part (``OutputQueue.cost``); what the runtime bounds."""
        return self._output.cost

    @property
    def message_ends(self) -> list[int] | None:
        """Set by the runtime around a pull's deliveries: where each message's frames end
        (octets from the start of its Deliveries event), for the body views it holds."""
        return self._output.message_ends

    @message_ends.setter
    def message_ends(self, ends: list[int] | None) -> None:
        self._output.message_ends = ends

    def is_channel_open(self, channel: int) -> bool:
        """Open and not closing: frames may be sent on it."""
        return self._channels.is_open(channel)

    @property
    def channel_count(self) -> int:
        """Channels open and not closing, as the frames left them (workers.limits counts them:
        a channel.open later in the same read sees the ones before it)."""
        return len(self._sendable)

    # -- public: input ----------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event]:
        """Process received bytes; return the events they complete."""
        self._events = []
        if self._state is State.CLOSED or not data:
            return self._events
        self._liveness.bytes_received += len(data)
        self._buffer.add_data(data)
        return self._parse()

    def place_bodies(self, place: Place, release: Release) -> None:
        """Receive big message bodies where they will be stored: ``place`` takes a block for a
        publish whose content header announced a big body (ContentAssembler.place), its big
        body frames are received straight into it, and ``release`` frees one whose publish
        is abandoned (the channel or connection closes first, or :meth:`release_bodies`)."""
        self._channels.place_bodies(place, release, self._buffer.unplace)
        self._buffer.sink = self._channels.body_room

    def release_bodies(self) -> None:
        """The runtime is done with this connection: free the blocks of publishes in assembly."""
        self._channels.release()

    def receive_room(self) -> memoryview | None:
        """Where the next bytes may be received directly (``socket.recv_into``), then passed
        to :meth:`received_into`: the rest of a big frame (a body frame of a large message)
        being assembled. None: receive into a new bytes and pass it to :meth:`receive_data`."""
        if self._state is State.CLOSED:
            return None
        return self._buffer.big_frame_room()

    def received_into(self, size: int, tail: bytes = b"") -> list[Event]:
        """``size`` bytes were received into :meth:`receive_room`, and ``tail`` after them in
        the same read (only once the room is full); the events they complete."""
        self._events = []
        if self._state is State.CLOSED or not size:
            return self._events
        self._liveness.bytes_received += size + len(tail)
        self._buffer.big_frame_filled(size, tail)
        return self._parse()

    def parse_more(self) -> list[Event]:
        """The events of input already received that parsing left at ``parse_limit``
        (``unparsed``), the next ``parse_limit`` at most; to be called before more is read."""
        self._events = []
        if self._state is State.CLOSED:
            self.unparsed = False
            return self._events
        return self._parse()

    def _parse(self) -> list[Event]:
        self.unparsed = False
        try:
            if self._state is State.HANDSHAKE:
                self._read_protocol_header()
            if self._state not in (State.HANDSHAKE, State.CLOSED):
                self._read_frames()
        except errors.FrameError as exc:
            self._on_frame_error(exc)
        return self._events

    def heartbeat_tick(self, now: float, socket_activity: object = None) -> bool:
        """Send a heartbeat if due; False when the connection is dead.

        Call about once a second with a monotonic clock, from accept time on
        (the handshake timeout counts from the first call).  Like RabbitMQ,
        a heartbeat goes out when nothing was sent for heartbeat/2 seconds,
        and the client is dead after 2 x heartbeat seconds of silence; any
        received byte counts.  Also ends a handshake that takes longer than
        handshake_timeout and a close whose close-ok never comes.

        ``socket_activity`` is what the runtime sees of the socket that the
        protocol cannot (bytes queued unread, output not yet acknowledged),
        or None: a change since the last tick counts as received traffic.
        The runtime passes it while the client does not read its output and
        so is not read either: a client whose heartbeats pile up unread is
        alive, one whose socket shows nothing either way for 2 x heartbeat is
        not (a stalled network; RabbitMQ, which reads on, sees it the same).
        """
        if self._state is State.CLOSED:
            return False
        state = self._state
        liveness = self._liveness
        monitored = state is State.OPENING or state is State.RUNNING
        reason = liveness.tick(now, socket_activity, running=state is State.RUNNING,
                               monitored=monitored, closing=state is State.CLOSING)
        if reason is not None:
            self._finish(Input.ABORT, reason)
            return False
        if liveness.heartbeat_due(now, monitored):
            self._queue_out(codec.HEARTBEAT_FRAME)
            liveness.heartbeat_queued(now, self.unsent_bytes)
        return True

    # -- public: output ---------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Everything queued for the socket since the last call, as one bytes (copied)."""
        data = self._output.take_bytes()
        self._liveness.bytes_sent += len(data)
        return data

    def output_parts(self) -> list[bytes | bytearray | memoryview]:
        """Everything queued for the socket since the last call, as buffers to send in order
        (``socket.sendmsg``, ``OutputQueue.take_parts``): big bodies as views of their arena
        blocks, or as ``seal_output`` copied them.

        The views may wait for the socket as long as nothing lets the supervisor free the
        blocks under them: the runtime copies them (``seal_output``, and its writer's) before
        a Settle naming one of their deliveries, a ChanClose or a ConnClose leaves
        (``ConnectionHandler.held``, ``workers.worker.Worker.send``)."""
        output = self._output
        self._liveness.bytes_sent += output.unsent_bytes
        return output.take_parts()

    @property
    def holds_views(self) -> bool:
        """Queued output holds views of message bodies (``output_parts``, ``seal_output``)."""
        return self._output.holds_views

    def seal_output(self) -> None:
        """Copy the body views queued since the last call into bytes (``OutputQueue.seal``)."""
        self._output.seal()

    def _queue_out(self, data: bytes | bytearray | memoryview) -> None:
        self._output.append(data)

    def send(self, event: Outgoing) -> bool:
        """Encode one outgoing event (``workers.outgoing``) and queue its frames; False
        (dropped) unless the connection is running and the event's channel open."""
        channel = event[0]
        if self._state is not State.RUNNING or (channel and channel not in self._sendable):
            return False
        if type(event) is Deliveries:
            self._output.deliveries(event, self.frame_max)
            return True
        if type(event) is BasicGetOk:
            self._output.get_ok(event, self.frame_max)
            return True
        self._output.append(encode(event, self.frame_max))
        return True

    def send_method(self, channel: int, method: base.Frame) -> bool:
        """Queue a pamqp method; False (dropped) if the channel is not open."""
        return self.send(Method(channel, method))

    def send_raw(self, data: bytes | bytearray | memoryview, channel: int | None = None) -> bool:
        """Queue pre-encoded frames (workers.codec); False (dropped) once the
        connection, or ``channel`` when given, is no longer open."""
        if not self._can_send(0 if channel is None else channel):
            return False
        self._output.append(data)
        return True

    def close_channel(
        self, channel: int, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0
    ) -> None:
        """Send channel.close (text verbatim); ChannelClosed follows its close-ok."""
        if self._state is not State.RUNNING or not self._channels.start_close(channel):
            return
        close = commands.Channel.Close(reply_code, _shortstr(reply_text), class_id, method_id)
        self._queue_out(codec.encode_method(channel, close))

    def close(
        self, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0
    ) -> None:
        """Send connection.close (text verbatim), e.g. 320 CONNECTION_FORCED at
        shutdown; the connection is closed when the client's close-ok arrives."""
        if self._state is State.CLOSING or self._state is State.CLOSED:
            return
        if self._state is State.HANDSHAKE:
            self._finish(Input.ABORT, reply_text)
            return
        self._send_close(reply_code, reply_text, class_id, method_id)

    def handle_error(self, exc: AMQPError, channel: int = 0) -> None:
        """Turn a protocol error into channel.close or connection.close.

        The one place errors become frames.  Soft errors on an open channel
        close that channel; anything else closes the connection -- before
        ``running`` only where RabbitMQ would say why (refused login with the
        authentication_failure_close capability, a 530 while tuning, any
        error while opening); otherwise the socket is just closed.  Errors
        after we sent connection.close are ignored, as RabbitMQ does.
        """
        if self._state is State.CLOSING or self._state is State.CLOSED:
            return
        if not exc.hard and channel:
            if self._state is State.RUNNING:
                text = exc.frame_text
                self.close_channel(channel, exc.reply_code, text, exc.class_id, exc.method_id)
            return
        text = exc.frame_text
        if self._error_is_announced(exc):
            self._send_close(exc.reply_code, text, exc.class_id, exc.method_id)
        else:
            self._finish(Input.ABORT, f"handshake failed: {text}")

    # -- connection state machine ---------------------------------------------------

    def _transition(self, input_: Input, class_id: int = 0, method_id: int = 0) -> State:
        target = TRANSITIONS.get((self._state, input_))
        if target is None:
            raise UnexpectedMethod(self._state, input_, class_id, method_id)
        return target

    def _enter(self, state: State) -> None:
        self._state = state
        if state is State.CLOSED:
            self._channels.clear()
            self._events.append(ConnectionClosed(self.close_reason or ""))

    def _finish(self, input_: Input, reason: str) -> None:
        self.close_reason = reason
        self._enter(self._transition(input_))

    def _send_close(self, reply_code: int, reply_text: str, class_id: int, method_id: int) -> None:
        close = commands.Connection.Close(reply_code, _shortstr(reply_text), class_id, method_id)
        self._queue_out(codec.encode_method(0, close))
        self.close_reason = f"closed by server: {reply_text}"
        self._enter(self._transition(Input.SEND_CLOSE))

    def _error_is_announced(self, exc: AMQPError) -> bool:
        """Whether RabbitMQ sends connection.close for this error in this state."""
        if self._state is State.RUNNING or self._state is State.OPENING:
            return True
        if self._state is State.TUNING:
            return exc.reply_code == errors.NotAllowed.reply_code
        if self._state is State.STARTING:
            return (exc.reply_code == errors.AccessRefused.reply_code
                    and self._handshake.auth_failure_close)
        return False

    def _read_protocol_header(self) -> None:
        header = self._buffer.read_protocol_header()
        if header is None:
            return
        if header not in ACCEPTED_PROTOCOL_HEADERS:
            # AMQP 0-9-1 §4.2.2: answer with the header we support, then close.
            self._queue_out(PROTOCOL_HEADER)
            self._finish(Input.ABORT, f"bad protocol header {header!r}")
            return
        self._enter(self._transition(Input.PROTOCOL_HEADER))
        self._queue_out(self._handshake.start())

    def _read_frames(self) -> None:
        buffer = self._buffer
        events = self._events
        limit = self.parse_limit
        while True:
            if len(events) >= limit:
                self.unparsed = True
                return
            if self._state is State.RUNNING:
                whole = buffer.next_publish()
                if whole is not None:
                    # The publish hot path: three frames taken at once, or declined where
                    # the frame-by-frame path could answer differently.
                    channel, method, header, body, end = whole
                    publish = self._channels.whole_publish(channel, method, header, body)
                    if publish is not None:
                        buffer.skip_to(end)
                        self._events.append(publish)
                        continue
                ack = buffer.next_ack()
                if ack is not None:  # the consumer's hot path: a basic.ack, read at once
                    channel, tag, multiple, end = ack
                    acked = self._channels.whole_ack(channel, tag, multiple)
                    if acked is not None:
                        buffer.skip_to(end)
                        self._events.append(acked)
                        continue
            frame = buffer.next_frame()
            if frame is None:
                return
            try:
                self._on_frame(frame)
            except AMQPError as exc:
                self.handle_error(exc, frame.channel)
            if self._state is State.CLOSED:
                return

    def _on_frame_error(self, exc: errors.FrameError) -> None:
        # We have lost sync with the stream: say why, then stop reading
        # (rabbit_reader fatal_frame_error).
        self.handle_error(exc)
        if self._state is not State.CLOSED:
            self._finish(Input.ABORT, f"frame error: {exc.reply_text}")

    def _on_frame(self, frame: Frame) -> None:
        if frame.channel and self._state is State.RUNNING:  # the hot path first
            self._channels.receive(frame, self._events, self._queue_out)
        elif frame.channel == 0:
            self._on_channel0_frame(frame)
        elif self._state is not State.CLOSING:
            raise errors.UnexpectedFrame(f"type {frame.type} frame on channel {frame.channel}")

    def _on_channel0_frame(self, frame: Frame) -> None:
        if frame.type == FRAME_METHOD:
            on_connection_method(self, decode_method(frame.payload))
        elif frame.type != FRAME_HEARTBEAT:
            raise errors.UnexpectedFrame(f"type {frame.type} frame on channel 0")

    def _can_send(self, channel: int) -> bool:
        if self._state is not State.RUNNING:
            return False
        return channel == 0 or self.is_channel_open(channel)


def _shortstr(text: str) -> str:
    """Reply texts are short strings: at most 255 octets on the wire."""
    data = text.encode("utf-8")
    if len(data) <= 255:
        return text
    return data[:252].decode("utf-8", "ignore") + "..."
