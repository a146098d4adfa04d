"""One client connection on a worker: protocol events in, channels, output out.

The sans-IO :class:`~workers.connection.AMQPConnection` parses and frames;
this class owns the connection's channels, routes protocol events and
supervisor events to them and carries out what each call on a channel returns
(``workers.channel_config.ChannelOutput``): request records to the worker's
outbox, events to the protocol, publish credit spent, confirms to coalesce, a
commit to resume after the body log's sync. It does no IO either: the socket
task in ``workers.server`` feeds it bytes and writes what it produced.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Final, Protocol

from pamqp import commands as spec

from broker import errors
from broker.constants import REPLY_TO
from broker.errors import AMQPError
from ipc import records as r
from ipc.arena import Arena
from ipc.logfile import BodyLog
from ipc.records import VIEWED_BODY_MIN
from workers import codec
from workers import connection_lifecycle as lifecycle
from workers import events as ev
from workers.access import PermissionTables
from workers.channel import Channel
from workers.channel_config import ChannelConfig, ChannelOutput, ChannelResources
from workers.connection import AMQPConnection
from workers.connection_state import State
from workers.consumer_target import Backpressure, ConsumerTarget
from workers.outgoing import Method, Outgoing

log = logging.getLogger("shoal.connection")

# Output buffered for one connection beyond which its consumers stop pulling
# (docs/design.md, Consumer target: back-pressure turns into setNotifyWorkDesired(false)).
HIGH_WATER: Final = 4 << 20
# Unsent output beyond which the worker stops reading the connection, whatever produced
# it (replies to a pipelined method flood, say): a client that does not read cannot make
# the worker hold more than this for it. Both bounds count what the output costs in memory
# (AMQPConnection.unsent_cost: octets plus each queued part's overhead), not its octets.
OUTPUT_BOUND: Final = 2 * HIGH_WATER
# Publishes a connection may have on the request ring that the supervisor has not given
# back as credit (RabbitMQ's credit flow: reader -> channel -> queue, initial credit 400).
PUBLISH_CREDIT: Final = 400


class HandlerWorker(Protocol):
    """What a connection handler uses of its worker (``workers.worker.Worker``): its index
    (for the log), the request outbox, what it lends channels, the body log's writes and
    syncs, the memory alarm, the handlers by connection id, and the set of handlers with
    output for the writers."""

    index: int
    dirty: set[ConnectionHandler]
    handlers: dict[int, ConnectionHandler]
    impersonators: set[str]  # may publish with another user_id

    @property
    def alarmed(self) -> bool: ...
    @property
    def channel_resources(self) -> ChannelResources: ...
    @property
    def body_log(self) -> BodyLog | None: ...

    def send(self, rec: Any) -> None: ...
    def store_body(self, offset: int, header_len: int, body_len: int,
                   conn: int) -> tuple[int, int, int] | None: ...
    def after_body_sync(self, call: Callable[[], object]) -> None: ...
    def limits_changed(self) -> None: ...


_UNWRITTEN: Final = 1 << 62  # a delivery's place in the output stream until its frames are queued


class ConnectionHandler:
    """One client connection on this worker: owns its ``AMQPConnection`` (the protocol) and
    its ``Channel`` objects (the AMQP channels, Sessions in docs/design.md), routes protocol events
    and supervisor events to them, and holds the connection-wide limits (publish credit,
    output bounds, connection.blocked)."""

    def __init__(self, worker: HandlerWorker, conn_id: int, proto: AMQPConnection, *,
                 arena: Arena | None = None, peer: str = "", local: str = "",
                 connected_at: float = 0.0,
                 socket_queues: Callable[[], object] | None = None) -> None:
        self.worker = worker
        self.conn_id = conn_id
        self.proto = proto
        self.channels: dict[int, Channel] = {}
        self.opened = False
        self.finished = False
        self.cancel_notify = False
        self.output = Backpressure()  # our output is backed up: consumers take nothing
        self._channel_config = ChannelConfig(conn_id, False, self.output)  # set when opened
        self.blocked_capable = False  # the client understands connection.blocked
        self.told_blocked = False
        self.publishes = False  # RabbitMQ blocks (and tells) only publishing connections
        self.confirms_pending: set[Channel] = set()
        # The worker's permissions (workers.access); None (a test's worker): no checks.
        self.permissions: PermissionTables | None = lifecycle.admission(worker, proto)
        self._closed_numbers: dict[int, int] = {}  # channel → ChanClose barriers owed
        self.in_flight = 0  # handed to the socket, not yet written
        self.credit = PUBLISH_CREDIT  # Publish records we may still send (credit flow)
        self.output_bound = OUTPUT_BOUND
        self.wake_writer = lambda: None
        self.wake_reader = lambda: None  # the reader may be waiting for credit or output room
        # Deliveries (entry id → where their frames end in our output stream) whose bodies
        # are big enough to go out as views of their arena blocks (VIEWED_BODY_MIN), until the
        # socket has taken them. Such a view may wait for the socket: the supervisor frees a
        # block only on our Settle, ChanClose or ConnClose, and the worker seals (copies) what
        # still views a block before one that could free it leaves (``Worker.send``).
        self.held: dict[int, int] = {}
        self.taken_bytes = 0  # output handed to the socket's writer so far (take_*)
        self.sent_bytes = 0  # of that, what the socket took (``sent``)
        self.seal_writer = lambda: None  # the writer copies the views it holds (SocketWriter.seal)
        self.closed_ticks = 0  # heartbeat ticks seen since the protocol closed (workers.server)
        # The runtime's view of the socket's kernel queues (unread input, unacknowledged output).
        self.socket_queues: Callable[[], object] = socket_queues or _no_queues
        self.peer = peer  # host:port of the client
        self.local = local  # host:port it connected to
        self.connected_at = connected_at
        if arena is not None:  # big bodies are received into blocks of the worker's arena
            proto.place_bodies(functools.partial(self.place_body, arena), self.release_body)

    @property
    def label(self) -> str:
        """How the log names this connection (RabbitMQ: ``<pid> (peer -> local)``)."""
        return f"w{self.worker.index}#{self.conn_id} ({self.peer} -> {self.local})"

    @property
    def backpressured(self) -> bool:
        return self.proto.unsent_cost + self.in_flight > HIGH_WATER

    @property
    def reading_stop(self) -> str | None:
        """Why the worker must not read this connection now, or None: ``flow`` (its
        publish credit is spent) or ``output`` (too much unsent output). A closing
        connection is read: its close-ok must come through."""
        if self.proto.state is State.CLOSING:
            return None
        if self.proto.unsent_cost + self.in_flight > self.output_bound:
            return "output"
        if self.credit <= 0:
            return "flow"
        return None

    @property
    def state(self) -> str:
        """The connection's state as ``rabbitmqctl list_connections`` names it: ``running``;
        ``flow`` while credit flow or unsent output stops its reader; ``blocking`` while the
        memory alarm is on and it has not published, ``blocked`` once it has; ``closing``."""
        if self.finished or self.proto.state in (State.CLOSING, State.CLOSED):
            return "closing"
        if self.worker.alarmed:
            return "blocked" if self.publishes else "blocking"
        return "running" if self.reading_stop is None else "flow"

    def info(self) -> r.ConnectionInfo:
        return lifecycle.connection_info(self)

    def heartbeat_tick(self, now: float) -> bool:
        """The protocol's heartbeat tick. While the client leaves our output unread (reading
        stopped for ``output``) its own bytes are not read either: the socket's queues tell
        whether anything still moves (AMQPConnection.heartbeat_tick)."""
        activity = self.socket_queues() if self.reading_stop == "output" else None
        return self.proto.heartbeat_tick(now, activity)

    def add_credit(self, n: int) -> None:
        was_stopped = self.credit <= 0
        self.credit += n
        if was_stopped and self.credit > 0:
            self.wake_reader()

    # ------------------------------------------------------------- output

    def send(self, event: Outgoing) -> None:
        """Hand an outgoing event to the protocol (which encodes it, or drops it once its
        channel or the connection is closing); the writer is woken after the batch."""
        self.proto.send(event)
        self.worker.dirty.add(self)
        if not self.output.active and self.backpressured:
            self.output.active = True

    def apply(self, ch: Channel, out: ChannelOutput) -> None:
        """Carry out what a call on ``ch`` produced."""
        if out.events:
            for event in out.events:
                self.send(event)
        if out.requests:
            send = self.worker.send
            for rec in out.requests:
                send(rec)
            self.credit -= out.publishes
        if out.confirms_due:
            self.confirms_pending.add(ch)
        if out.wait_body_sync:
            self.worker.after_body_sync(lambda: self._commit_synced(ch))

    def _commit_synced(self, ch: Channel) -> None:
        if not ch.closing:
            self._guarded(ch, ch.commit_synced)
            self.worker.dirty.add(self)

    def _guarded(self, ch: Channel, call: Callable[..., ChannelOutput], *args: Any) -> None:
        """Call ``ch`` and carry out what it produced; its error closes the channel (or the
        connection), after what it produced before the error."""
        try:
            out = call(*args)
        except AMQPError as exc:
            self._channel_failed(ch, exc)
            return
        self.apply(ch, out)

    def _channel_failed(self, ch: Channel, exc: AMQPError) -> None:
        """A call on ``ch`` raised ``exc``: what it produced before the error is carried out,
        then the error closes the channel (or the connection)."""
        self.apply(ch, ch.take_output())
        self.fail(exc, ch)

    def refresh_all(self) -> None:
        """Credit may have come back for every consumer of the connection."""
        for ch in self.channels.values():
            self.apply(ch, ch.refresh_all())

    def take_output(self) -> bytes:
        """All queued output, as one bytes (body views copied): it may wait for the socket."""
        data = self.proto.data_to_send()
        self.in_flight = len(data)
        self.taken_bytes += len(data)
        return data

    def take_parts(self) -> list[bytes | bytearray | memoryview]:
        """All queued output as parts (``AMQPConnection.output_parts``): big bodies as views of
        their arena blocks, held (``held``) until the socket took them or ``seal_held``."""
        size = self.proto.unsent_bytes
        parts = self.proto.output_parts()
        self.in_flight = size
        self.taken_bytes += size
        return parts

    def sent(self, n: int) -> None:
        """The socket took ``n`` more octets of what ``take_parts`` / ``take_output`` gave."""
        self.sent_bytes += n

    def seal_output(self) -> None:
        """Copy queued body views into bytes (``AMQPConnection.seal_output``)."""
        self.proto.seal_output()

    @property
    def holds_views(self) -> bool:
        """Output not yet taken by the socket may view arena blocks of deliveries."""
        return bool(self.held)

    def views(self, entries: list[int]) -> bool:
        """Output not yet taken by the socket may view the block of one of these deliveries."""
        held = self.held
        sent = self.sent_bytes
        while held:  # in output order: forget those the socket took
            first = next(iter(held))
            if held[first] > sent:
                break
            del held[first]
        for entry in entries:
            if entry in held:
                return True
        return False

    def seal_held(self) -> None:
        """Copy every body view our output holds (queued, or the writer's) into bytes: a record
        that may free one of their blocks is about to go to the supervisor."""
        self.proto.seal_output()
        self.seal_writer()
        self.held.clear()

    def _hold(self, entries: list[int]) -> None:
        """These deliveries' frames are queued now: held until the socket took up to here
        (unless sealed meanwhile: a no-ack delivery's Settle goes with its frames)."""
        end = self.taken_bytes + self.proto.unsent_bytes
        held = self.held
        for entry in entries:
            if entry in held:
                held[entry] = end

    def _hold_each(self, deliveries: list[r.Delivery], ends: list[int]) -> None:
        """A pull's deliveries were queued, their Deliveries last: each big one is held until
        the socket took its own frames' last octet (``ends``: where each message's frames end
        in that event), not the whole batch's: a client acking the first of a batch while the
        rest is still being written then frees its block without a copy of the rest. If not
        every delivery was queued (a body lost), the batch's end for all."""
        if len(ends) != len(deliveries):
            self._hold([d.entry for d in deliveries])
            return
        start = self.taken_bytes + self.proto.unsent_bytes - ends[-1]
        held = self.held
        for d, end in zip(deliveries, ends, strict=True):
            if d.entry in held:
                held[d.entry] = start + end

    def proto_has_output(self) -> bool:
        return self.proto.has_data_to_send

    def written(self) -> None:
        """The socket took what ``take_parts`` (or ``take_output``) gave: lift back-pressure."""
        self.in_flight = 0
        if self.output.active and not self.backpressured:
            self.output.active = False
            self.refresh_all()
        if self.proto.unsent_cost <= self.output_bound:
            self.wake_reader()

    # ------------------------------------------------------ protocol events

    def handle(self, event: Any) -> None:
        if type(event) is ev.AckReceived:  # the hot path: one per delivery, acked each
            ch = self.channels.get(event.channel)
            if ch is not None and not ch.closing:
                try:  # _guarded, without its *args
                    out = ch.on_ack(event.delivery_tag, event.multiple)
                except AMQPError as exc:
                    self._channel_failed(ch, exc)
                else:
                    self.apply(ch, out)
            self.worker.dirty.add(self)
            return
        match event:
            case ev.MethodReceived(channel=0, method=spec.Connection.UpdateSecret(reason=why)):
                log.info("connection %s: user '%s' updated secret, reason: %s", self.label,
                         self.proto.user, why)
            case ev.MethodReceived(channel=n, method=m):
                ch = self.channels.get(n)
                if ch is not None and not ch.closing:
                    self._guarded(ch, ch.on_method, m)
            case ev.ConnectionOpened():
                lifecycle.opened(self, event)
            case ev.ChannelOpened(channel=n):
                self.channels[n] = Channel(n, self._channel_config, self.worker.channel_resources)
                log.debug("connection %s: channel %d opened", self.label, n)
                self._limits_changed()
            case ev.ChannelClosed(channel=n):
                ch = self.channels.pop(n, None)
                if ch is not None and not ch.closing:
                    lifecycle.close_channel(self, ch)
                log.debug("connection %s: channel %d closed", self.label, n)
                self._limits_changed()
            case ev.ConnectionClosed():
                self.finish()
        self.worker.dirty.add(self)

    def publish_header(self, event: ev.PublishReceived, reply_to: str | None) -> bytes | None:
        """The content header to store: the publisher's, or with reply_to set to
        the channel's direct reply-to queue. None: the publish was refused."""
        header = event.header_payload
        if reply_to != REPLY_TO:
            return header
        ch = self.channels.get(event.channel)
        if ch is None or ch.closing:
            return None
        if not ch.reply_to:  # RabbitMQ's text
            self.fail(errors.PreconditionFailed("fast reply consumer does not exist", 60, 40), ch)
            return None
        return codec.with_reply_to(header, ch.reply_to)

    def set_blocked(self, active: bool, reason: str = "low on memory") -> None:
        """connection.blocked (RabbitMQ's reason: ``low on memory``, ``low on disk``) /
        unblocked, to clients that asked for them."""
        if (not self.blocked_capable or self.told_blocked == active or not self.opened
                or not self.publishes):
            return
        self.told_blocked = active
        method = (spec.Connection.Blocked(reason=reason) if active
                  else spec.Connection.Unblocked())
        self.send(Method(0, method))

    def publish_at_once(self, event: ev.PublishReceived, arena: Arena) -> int:
        """The publish hot path, all of it here (compiled, where ``workers.server``'s
        coroutine is not): the properties read, the header and body copied into our arena,
        the channel told; 0 then. When the arena has no block that size: that size, with
        nothing done (``Server._publish`` waits for room and calls again)."""
        self.publishes = True
        headers, expiration, priority, reply_to, user_id = codec.publish_properties(
            event.header_payload)
        if event.placed >= 0:  # header and body are in their block already (place_body)
            self.publish(event, event.placed, event.placed_header, headers, expiration, priority,
                         user_id)
            return 0
        header = self.publish_header(event, reply_to)
        if header is None:
            return 0
        block = _block_with_header(arena, header, event.body_size)
        if block is None:
            return len(header) + event.body_size
        offset, view = block
        header_len = pos = len(header)
        for chunk in event.body:
            end = pos + len(chunk)
            view[pos:end] = chunk
            pos = end
        self.publish(event, offset, header_len, headers, expiration, priority, user_id)
        return 0

    def place_body(self, arena: Arena, header: bytes,
                   body_size: int) -> tuple[memoryview, int, int] | None:
        """AMQPConnection.place_bodies: a block of our arena for a big publish whose content
        header (``header``) just came, the header written there; the view its body goes to.
        None (the body is assembled in pieces and copied at the end, as any other) while
        publishers here are blocked, when the arena has no block that size, or for a direct
        reply-to (whose header changes, and which may be refused)."""
        if self.worker.alarmed or codec.publish_properties(header)[3] == REPLY_TO:
            return None
        block = _block_with_header(arena, header, body_size)
        if block is None:
            return None
        offset, view = block
        return view[len(header) :], offset, len(header)

    def release_body(self, offset: int) -> None:
        """A placed publish was abandoned before its body was all here: free its block."""
        self.worker.channel_resources.bodies.free(offset)

    def publish(self, event: ev.PublishReceived, offset: int, header_len: int,
                headers: dict | None, expiration: str | None = None,
                priority: int | None = None, user_id: str | None = None) -> None:
        ch = self.channels.get(event.channel)
        if ch is None or ch.closing:
            self.worker.channel_resources.bodies.free(offset)
            return
        access = self._channel_config.access
        if access is not None and not access.may_publish(event.exchange):
            self.worker.channel_resources.bodies.free(offset)  # write on the exchange, first
            self.fail(access.publish_refused(event.exchange), ch)
            return
        if user_id is not None and user_id != self.proto.user and access is not None and (
                self.proto.user not in self.worker.impersonators):
            # rabbit_channel:check_user_id_header (the exchange's 404 and topic checks, which
            # the supervisor makes, come after it here)
            self.worker.channel_resources.bodies.free(offset)
            self.fail(errors.PreconditionFailed(
                f"user_id property set to '{user_id}' but authenticated user was "
                f"'{self.proto.user}'", 60, 40), ch)
            return
        body_at = None
        if self.worker.body_log is not None:  # --data-dir: a persistent body goes there now
            try:
                body_at = self.worker.store_body(offset, header_len, event.body_size,
                                                 self.conn_id)
            except AMQPError as exc:  # it could not be (its block is freed)
                self.fail(exc, ch)
                return
        self.apply(ch, ch.publish(event.exchange, event.routing_key, event.mandatory, offset,
                                  header_len, event.body_size, headers, expiration, priority,
                                  body_at))

    # ----------------------------------------------------- errors, closing

    def fail(self, exc: AMQPError, ch: Channel | None = None) -> None:
        """Turn an error into channel.close or connection.close (``workers.connection_lifecycle``)."""
        lifecycle.fail(self, exc, ch)

    def finish(self) -> None:
        """The connection is over (closed or the socket went): ``workers.connection_lifecycle``."""
        lifecycle.finish(self)

    def _limits_changed(self) -> None:
        limits = self.proto.limits  # a test's worker has none
        if limits is not None and limits.watching:
            self.worker.limits_changed()

    # ---------------------------------------------------- supervisor events

    def on_event(self, event: Any) -> None:
        owed = self._closed_numbers.get(event.ch)
        if owed:  # an answer to the closed channel that had this number
            if isinstance(event, r.Reply) and event.method == "chclose":
                if owed == 1:
                    del self._closed_numbers[event.ch]
                else:
                    self._closed_numbers[event.ch] = owed - 1
            return
        ch = self.channels.get(event.ch)
        if ch is None or ch.closing:
            return
        match event:
            case r.GetOk(delivery=d):
                big = d.body_len >= VIEWED_BODY_MIN
                if big:
                    self.held[d.entry] = _UNWRITTEN
                self._guarded(ch, ch.on_reply, event)
                if big:
                    self._hold([d.entry])
            case r.Reply() | r.GetEmpty():
                self._guarded(ch, ch.on_reply, event)
            case r.Confirm():
                self.apply(ch, ch.on_confirm(event))
            case r.Returned():
                self.apply(ch, ch.on_return(event))
            case r.Error(code=code, text=text, class_id=cid, method_id=mid):
                self.fail(errors.error_for_code(code, text, cid, mid), ch)

    def _channel_of(self, target: ConsumerTarget) -> Channel | None:
        ch = self.channels.get(target.ch)
        return ch if ch is not None and ch.owns(target) else None

    def on_pulled(self, target: ConsumerTarget, event: r.Pulled) -> None:
        """A pull's deliveries: handed to the protocol before the target's credit is looked
        at again (they may back the output up)."""
        ch = self._channel_of(target)
        if ch is not None:
            big = False
            for d in event.deliveries:
                if d.body_len >= VIEWED_BODY_MIN:
                    big = True
                    self.held[d.entry] = _UNWRITTEN
            if big:
                proto = self.proto
                ends: list[int] = []
                proto.message_ends = ends
                try:
                    self.apply(ch, ch.on_pulled(target, event))
                finally:
                    proto.message_ends = None
                self._hold_each(event.deliveries, ends)
            else:
                self.apply(ch, ch.on_pulled(target, event))
            self.apply(ch, ch.after_pull(target))

    def on_cancelled(self, target: ConsumerTarget) -> None:
        ch = self._channel_of(target)
        if ch is not None:
            self.apply(ch, ch.on_cancelled(target))

    def pull_due(self, target: ConsumerTarget) -> None:
        ch = self._channel_of(target)
        if ch is not None:
            self.apply(ch, ch.pull_due(target))

    def notify(self, target: ConsumerTarget) -> None:
        ch = self._channel_of(target)
        if ch is not None:
            self.apply(ch, ch.notify(target))

    def flush_confirms(self) -> None:
        """The end of an event batch: each channel's confirms as one basic.ack multiple."""
        for ch in self.confirms_pending:
            self.apply(ch, ch.flush_confirms())
        self.confirms_pending.clear()

    def release_confirms(self, number: int) -> None:
        """The body log was synced: the confirms channel ``number``'s gate held that are due."""
        ch = self.channels.get(number)
        if ch is not None and not ch.closing:
            self.apply(ch, ch.release_confirms())
            self.worker.dirty.add(self)


def _no_queues() -> object:
    return None


def _block_with_header(arena: Arena, header: bytes, body_size: int) -> tuple[int, memoryview] | None:
    """A block of ``arena`` for ``header`` and a body of ``body_size`` octets, the header
    written at its start: its offset and a view of all of it. None: no block that size now."""
    size = len(header) + body_size
    offset = arena.alloc(size)
    if offset is None:
        return None
    view = arena.view(offset, size)
    view[: len(header)] = header
    return offset, view

