"""Session: one connection's channels, supervisor events, errors and back-pressure.

No processes, no sockets: a real sans-IO ``AMQPConnection`` driven through its
handshake with client bytes made by pamqp, a real ``Session``, and
``FakeWorker``, the slice of ``workers.worker.Worker`` that sessions and
channels use, which records the request records they send. The harness here
is shared with ``test_channel.py``.
"""

from __future__ import annotations

import itertools
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from pamqp import base, body, commands, frame, header

from ipc import records as r
from tests.workers.helpers import default_server_properties
from workers import events as ev
from workers.channel import Channel
from workers.connection import AMQPConnection, State
from workers.consumer_target import ConsumerTarget
from workers.frame_buffer import PROTOCOL_HEADER
from workers.session import HIGH_WATER, PUBLISH_CREDIT, Session

CONN = 7


# -- the harness --------------------------------------------------------------


class FakeArena:
    """A bump allocator over one fixed bytearray (never resized: views stay valid)."""

    def __init__(self, size: int) -> None:
        self.memory = bytearray(size)
        self.top = 0
        self.freed: list[int] = []

    def store(self, data: bytes | bytearray | memoryview) -> int:
        offset = self.top
        self.memory[offset : offset + len(data)] = data
        self.top += len(data)
        return offset

    def view(self, offset: int, size: int) -> memoryview:
        return memoryview(self.memory)[offset : offset + size]

    def free(self, offset: int) -> None:
        self.freed.append(offset)


class FakeWorker:
    """What Session and Channel use of ``workers.worker.Worker``; records requests."""

    def __init__(self, arena_size: int = 1 << 20) -> None:
        self.index = 0
        self.requests: list[Any] = []
        self.dirty: set[Session] = set()
        self.sessions: dict[int, Session] = {}
        self.targets: dict[int, ConsumerTarget] = {}
        self.region = SimpleNamespace(arena=FakeArena(arena_size))
        self.blocked = False
        self.arena_full = False
        self.trace = None
        self._ids = itertools.count(1)

    @property
    def alarmed(self) -> bool:
        return self.blocked or self.arena_full

    def send(self, rec: Any) -> None:
        self.requests.append(rec)

    def new_target(self, tag: str, channel: Any, queue: str, *, no_ack: bool, browse: bool,
                   prefetch: int) -> ConsumerTarget:
        cid = next(self._ids)
        target = ConsumerTarget(cid, cid - 1, tag, channel, queue, no_ack=no_ack, browse=browse,
                                prefetch=prefetch)
        self.targets[cid] = target
        return target

    def drop_target(self, target: ConsumerTarget) -> None:
        # As Worker.drop_target: a target with a pull in flight stays known by id
        # until the answer comes, unless its channel is closing.
        if not target.pulling or target.channel.closing:
            self.targets.pop(target.id, None)

    def body(self, d: r.Delivery) -> tuple[memoryview, memoryview]:
        return self.own_body(d.offset, d.header_len, d.body_len)

    def own_body(self, offset: int, header_len: int, body_len: int) -> tuple[memoryview, memoryview]:
        view = self.region.arena.view(offset, header_len + body_len)
        return view[:header_len], view[header_len:]


class Harness:
    """A Session over an opened AMQPConnection with ``channels`` open, output drained."""

    def __init__(self, channels: tuple[int, ...] = (1,), arena_size: int = 1 << 20,
                 capabilities: dict[str, Any] | None = None) -> None:
        self.worker = FakeWorker(arena_size)
        self.proto = AMQPConnection(server_properties=default_server_properties())
        self.session = Session(self.worker, CONN, self.proto)  # type: ignore[arg-type]
        self.worker.sessions[CONN] = self.session
        props = {"product": "test", "capabilities": capabilities or {}}
        self.feed(PROTOCOL_HEADER)
        self.client(0, commands.Connection.StartOk(props, "PLAIN", "\0guest\0guest"))  # type: ignore[arg-type]
        self.client(0, commands.Connection.TuneOk(2047, 131072, 60))
        self.client(0, commands.Connection.Open("/"))
        for n in channels:
            self.client(n, commands.Channel.Open())
        self.frames()
        self.take()

    # client → worker
    def feed(self, data: bytes) -> None:
        for event in self.proto.receive_data(data):
            if isinstance(event, ev.PublishReceived):  # as workers.server._publish does
                payload = bytes(event.header_payload) + b"".join(bytes(c) for c in event.body)
                offset = self.worker.region.arena.store(payload)
                self.session.publish(event, offset, len(event.header_payload), None)
            else:
                self.session.handle(event)

    def client(self, channel: int, method: base.Frame) -> None:
        self.feed(frame.marshal(method, channel))

    def publish(self, channel: int, data: bytes = b"m", **kwargs: Any) -> None:
        self.feed(frame.marshal(commands.Basic.Publish(**kwargs), channel)
                  + frame.marshal(header.ContentHeader(0, len(data), commands.Basic.Properties()),
                                  channel)
                  + frame.marshal(body.ContentBody(data), channel))

    # supervisor → worker
    def supervisor(self, *events: Any) -> None:
        """One batch of events, routed as Worker.handle_events routes them."""
        for event in events:
            if isinstance(event, (r.Pulled, r.Cancelled)):
                target = self.worker.targets.get(event.consumer)
                if target is None:
                    continue
                if isinstance(event, r.Pulled):
                    target.channel.on_pulled(target, event)
                else:
                    target.channel.on_cancelled(target)
            else:
                session = self.worker.sessions.get(event.conn)
                if session is not None:
                    session.on_event(event)
        for ch in self.session.confirms_pending:
            ch.flush_confirms()
        self.session.confirms_pending.clear()

    def notify(self, target: ConsumerTarget) -> None:
        """seed: notifyWork, i.e. the target's notify slot was found set."""
        if target.id in self.worker.targets:
            target.channel.notify(target)

    def delivery(self, entry: int, data: bytes = b"body", redelivered: bool = False) -> r.Delivery:
        """A message body in the arena and the Delivery record that names it."""
        head = header.ContentHeader(0, len(data), commands.Basic.Properties()).marshal()
        offset = self.worker.region.arena.store(head + data)
        return r.Delivery(entry, redelivered, "", "q", 0, offset, len(head), len(data))

    # worker → observed
    def take(self) -> list[Any]:
        """The request records sent since the last call."""
        out, self.worker.requests = self.worker.requests, []
        return out

    def frames(self) -> list[tuple[int, Any]]:
        """What the session wrote (the writer took it and the socket accepted it)."""
        data = self.session.take_output()
        self.session.written()
        return decode(data)

    def channel(self, n: int = 1) -> Channel:
        return self.session.channels[n]


def decode(data: bytes) -> list[tuple[int, Any]]:
    out = []
    while data:
        used, channel, value = frame.unmarshal(data)
        out.append((channel, value))
        data = data[used:]
    return out


def methods(frames: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """Method frames only (no content headers or bodies)."""
    return [(n, f) for n, f in frames if isinstance(f, base.Frame)]


def consumer(h: Harness, ch: int = 1, tag: str = "c1", queue: str = "q", *,
             no_ack: bool = False) -> ConsumerTarget:
    """A consumer whose consume-ok was sent; requests and frames drained."""
    h.client(ch, commands.Basic.Consume(queue=queue, consumer_tag=tag, no_ack=no_ack))
    h.supervisor(r.Reply(CONN, ch, "consume"))
    h.take()
    h.frames()
    return h.channel(ch).consumers[tag]


def pulls(records: list[Any]) -> list[r.Pull]:
    return [rec for rec in records if isinstance(rec, r.Pull)]


def interests(records: list[Any]) -> list[r.Interest]:
    return [rec for rec in records if isinstance(rec, r.Interest)]


# -- back-pressure --------------------------------------------------------------


def test_backpressure_makes_consumers_uninterested_until_written() -> None:
    """TCP back-pressure turns into setNotifyWorkDesired(false), and (true) once written."""
    h = Harness(arena_size=HIGH_WATER + (1 << 20))
    target = consumer(h)
    h.notify(target)
    assert pulls(h.take()) == [r.Pull(target.id, target.credit())]

    h.supervisor(r.Pulled(target.id, [h.delivery(1, b"x" * HIGH_WATER)], more=True))
    assert h.session.backpressured
    assert h.take() == [r.Interest(target.id, False)]

    data = h.session.take_output()  # handed to the socket, not yet written
    assert len(data) > HIGH_WATER
    h.channel().refresh_all()
    assert h.take() == []  # still in flight: still back-pressured
    h.session.written()
    # The pull had said "more": credit back, it pulls at once (ConsumerTarget.more).
    assert h.take() == [r.Interest(target.id, True), r.Pull(target.id, target.credit())]


def test_backpressure_holds_every_channel_of_the_connection() -> None:
    """Back-pressure is the connection's: consumers on its other channels stop too."""
    h = Harness(channels=(1, 2), arena_size=HIGH_WATER + (1 << 20))
    first = consumer(h, 1, "c1")
    second = consumer(h, 2, "c2")
    h.notify(first)
    h.take()
    h.supervisor(r.Pulled(first.id, [h.delivery(1, b"x" * HIGH_WATER)], more=False))
    assert h.take() == [r.Interest(first.id, False)]
    h.notify(second)
    assert h.take() == [r.Interest(second.id, False)]
    h.session.take_output()
    h.session.written()
    assert h.take() == [r.Interest(first.id, True), r.Interest(second.id, True)]


# -- errors from the supervisor --------------------------------------------------


@pytest.mark.parametrize("code", [530, 503])
def test_hard_error_from_supervisor_closes_the_connection(code: int) -> None:
    """A hard reply code closes the connection (connection.close), not just the channel."""
    h = Harness(channels=(1, 2))
    h.client(1, commands.Exchange.Declare(exchange="x", exchange_type="direct"))
    h.take()
    h.supervisor(r.Error(CONN, 1, code, "boom", 40, 10))
    [(n, close)] = h.frames()
    assert n == 0 and isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (code, 40, 10)
    assert h.proto.state is State.CLOSING
    assert sorted(rec.ch for rec in h.take() if isinstance(rec, r.ChanClose)) == [1, 2]


def test_soft_error_from_supervisor_closes_only_its_channel() -> None:
    """A soft reply code (404) closes the channel; the connection and other channels go on."""
    h = Harness(channels=(1, 2))
    h.client(1, commands.Queue.Declare(queue="nope", passive=True))
    h.client(2, commands.Queue.Declare(queue="q"))
    h.take()
    h.supervisor(r.Error(CONN, 1, 404, "no queue 'nope' in vhost '/'", 50, 10))
    [(n, close)] = h.frames()
    assert n == 1 and isinstance(close, commands.Channel.Close)
    assert close.reply_code == 404
    assert close.reply_text == "NOT_FOUND - no queue 'nope' in vhost '/'"
    assert h.proto.state is State.RUNNING
    assert h.take() == [r.ChanClose(CONN, 1)]

    h.supervisor(r.Reply(CONN, 2, "qdecl", queue="q"))
    [(n, ok)] = h.frames()
    assert n == 2 and isinstance(ok, commands.Queue.DeclareOk) and ok.queue == "q"


def test_soft_error_close_ok_sends_no_second_chan_close() -> None:
    """The supervisor hears of a failed channel once, not again at its close-ok."""
    h = Harness()
    h.client(1, commands.Queue.Declare(queue="nope", passive=True))
    h.take()
    h.supervisor(r.Error(CONN, 1, 404, "no queue", 50, 10))
    assert h.take() == [r.ChanClose(CONN, 1)]
    h.client(1, commands.Channel.CloseOk())
    assert h.take() == []
    assert 1 not in h.session.channels


# -- closing ------------------------------------------------------------------------


def test_client_channel_close_sends_chan_close_and_drops_targets() -> None:
    """channel.close: the supervisor hears ChanClose, the channel's consumer targets go."""
    h = Harness()
    target = consumer(h)
    h.client(1, commands.Channel.Close(200, "bye", 0, 0))
    assert h.take() == [r.ChanClose(CONN, 1)]
    assert target.id not in h.worker.targets
    assert not target.active
    assert [type(f) for _, f in h.frames()] == [commands.Channel.CloseOk]


def test_events_for_a_closed_channel_are_ignored() -> None:
    """After channel.close, replies, deliveries and confirms for it produce nothing."""
    h = Harness()
    target = consumer(h)
    h.notify(target)
    h.client(1, commands.Queue.Declare(queue="q"))
    h.client(1, commands.Channel.Close(200, "bye", 0, 0))
    h.frames()
    h.take()
    h.supervisor(
        r.Pulled(target.id, [h.delivery(1)], more=True),
        r.Reply(CONN, 1, "qdecl", queue="q"),
        r.Confirm(CONN, 1, True),
        r.Error(CONN, 1, 404, "no queue", 50, 10),
    )
    assert h.frames() == []
    assert h.take() == []


def test_events_for_a_channel_awaiting_close_ok_are_ignored() -> None:
    """A channel the broker closed is gone at once: later events for it do nothing."""
    h = Harness()
    h.client(1, commands.Confirm.Select())
    h.publish(1, b"m", exchange="", routing_key="q")
    h.client(1, commands.Queue.Declare(queue="nope", passive=True))
    h.client(1, commands.Queue.Bind(queue="nope", exchange="amq.direct", routing_key="k"))
    h.frames()
    h.take()
    h.supervisor(r.Error(CONN, 1, 404, "no queue 'nope'", 50, 10))
    assert h.take() == [r.ChanClose(CONN, 1)]
    h.frames()
    assert h.channel().closing  # still waiting for the client's close-ok
    h.supervisor(r.Confirm(CONN, 1, True), r.Error(CONN, 1, 404, "no queue 'nope'", 50, 20))
    assert h.take() == []
    assert h.frames() == []


def test_pull_in_flight_when_channel_closes_sends_nothing_more() -> None:
    """A channel closing with a pull in flight neither pulls nor settles afterwards."""
    h = Harness()
    target = consumer(h)
    h.notify(target)
    h.take()
    h.client(1, commands.Channel.Close(200, "bye", 0, 0))
    assert h.take() == [r.ChanClose(CONN, 1)]
    # Even if the answer reached the channel directly, nothing follows it.
    target.channel.on_pulled(target, r.Pulled(target.id, [h.delivery(1)], more=True))
    assert h.take() == []


def test_reply_owed_to_a_closed_channel_does_not_answer_its_successor() -> None:
    """A reopened channel number never receives the replies of the channel closed before it."""
    h = Harness()
    h.client(1, commands.Queue.Declare(queue="old"))
    h.client(1, commands.Channel.Close(200, "bye", 0, 0))
    h.client(1, commands.Channel.Open())
    h.client(1, commands.Queue.Declare(queue="new"))
    h.frames()
    h.supervisor(r.Reply(CONN, 1, "qdecl", queue="old"))  # answers the first channel
    assert methods(h.frames()) == []
    h.supervisor(r.Reply(CONN, 1, "chclose"))  # the ChanClose barrier
    assert methods(h.frames()) == []
    h.supervisor(r.Reply(CONN, 1, "qdecl", queue="new"))
    [(_, ok)] = methods(h.frames())
    assert ok.queue == "new"


def test_connection_close_closes_every_channel_then_the_connection() -> None:
    """connection.close: ChanClose for each channel, then ConnClose; the session is gone."""
    h = Harness(channels=(1, 2))
    target = consumer(h, 2, "c2")
    h.client(0, commands.Connection.Close(200, "bye", 0, 0))
    assert sorted(h.take(), key=repr) == sorted(
        [r.ChanClose(CONN, 1), r.ChanClose(CONN, 2), r.ConnClose(CONN)], key=repr)
    assert target.id not in h.worker.targets
    assert CONN not in h.worker.sessions


# -- flow control: when the worker stops reading a connection ------------------------------


def test_publish_credit_stops_reading_after_the_window_and_credit_resumes_it() -> None:
    """Credit flow: PUBLISH_CREDIT publishes not given back stop the reader (state ``flow``);
    the supervisor's Credit resumes it and wakes the waiting reader once."""
    h = Harness()
    woken: list[str] = []
    h.session.wake_reader = lambda: woken.append("reader")
    for _ in range(PUBLISH_CREDIT - 1):
        h.publish(1, exchange="", routing_key="q")
    assert h.session.reading_stop is None and h.session.state == "running"
    h.publish(1, exchange="", routing_key="q")
    assert len([rec for rec in h.take() if isinstance(rec, r.Publish)]) == PUBLISH_CREDIT
    assert h.session.reading_stop == "flow" and h.session.state == "flow"

    h.session.add_credit(PUBLISH_CREDIT // 2)
    assert h.session.reading_stop is None and h.session.state == "running"
    assert woken == ["reader"]
    h.session.add_credit(PUBLISH_CREDIT // 2)
    assert woken == ["reader"]  # it was not stopped: nothing to wake


def test_transactional_publishes_take_credit_when_committed() -> None:
    """Held in the channel until tx.commit, they are not on the ring: no credit used yet."""
    h = Harness()
    h.client(1, commands.Tx.Select())
    h.supervisor(*[])
    for _ in range(3):
        h.publish(1, exchange="", routing_key="q")
    assert h.session.credit == PUBLISH_CREDIT
    h.client(1, commands.Tx.Commit())
    assert h.session.credit == PUBLISH_CREDIT - 3


def test_unsent_output_past_the_bound_stops_reading_whatever_produced_it() -> None:
    """A client that pipelines methods the worker answers itself and never reads: past
    OUTPUT_BOUND of unsent replies the reader stops; once written, it reads again."""
    h = Harness()
    h.session.output_bound = 64 << 10  # OUTPUT_BOUND's 8 MiB of qos-ok takes 700k methods
    flood = frame.marshal(commands.Basic.Qos(prefetch_count=1), 1) * 1024
    for _ in range(100):
        if h.session.reading_stop is not None:
            break
        h.feed(flood)
    assert h.session.reading_stop == "output" and h.session.state == "flow"
    assert h.proto.unsent_bytes > h.session.output_bound
    woken: list[str] = []
    h.session.wake_reader = lambda: woken.append("reader")
    h.frames()  # the writer took everything and the socket accepted it
    assert h.session.reading_stop is None and woken == ["reader"]


def test_heartbeats_look_at_the_socket_only_while_output_stops_the_reader() -> None:
    """Unread output stops the reader, so the client's heartbeats lie unread: the tick asks the
    socket's queues then, and only then (credit flow is the broker's own pause)."""
    h = Harness()
    asked: list[int] = []
    h.session.socket_queues = lambda: asked.append(1) or (len(asked), 0)
    assert h.session.heartbeat_tick(1.0) and asked == []
    h.session.credit = 0
    assert h.session.heartbeat_tick(2.0) and asked == []
    h.session.output_bound = 0
    h.session.send_method(1, commands.Basic.QosOk())
    assert h.session.reading_stop == "output"
    assert h.session.heartbeat_tick(3.0) and asked == [1]


def test_debug_log_names_the_client_and_its_channels(caplog: pytest.LogCaptureFixture) -> None:
    """--log-level debug: the client, its capabilities and the negotiated limits; channels opened
    and closed."""
    with caplog.at_level(logging.DEBUG, logger="shoal.connection"):
        h = Harness(capabilities={"publisher_confirms": True})
        h.client(1, commands.Channel.Close(200, "", 0, 0))
    text = caplog.text
    assert "client test" in text and "['publisher_confirms']" in text
    assert "frame_max 131072, channel_max 2047, heartbeat 60 s" in text
    assert "channel 1 opened" in text and "channel 1 closed" in text


def test_update_secret_is_logged_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    """RabbitMQ's info line: user 'guest' updated secret, reason: ... (never the secret)."""
    h = Harness()
    with caplog.at_level(logging.INFO, logger="shoal.connection"):
        h.client(0, commands.Connection.UpdateSecret("token-1234", "token refresh"))
    assert [type(f) for _, f in h.frames()] == [commands.Connection.UpdateSecretOk]
    assert "user 'guest' updated secret, reason: token refresh" in caplog.text
    assert "token-1234" not in caplog.text


def test_a_closing_connection_is_read_for_its_close_ok_even_without_credit() -> None:
    h = Harness()
    h.session.credit = 0
    assert h.session.reading_stop == "flow"
    h.proto.close(320, "CONNECTION_FORCED")
    assert h.session.reading_stop is None
    assert h.session.state == "closing"


def test_state_names_the_memory_alarm_as_rabbitmq_does() -> None:
    """``blocking``: alarm on, the connection has not published; ``blocked`` once it has."""
    h = Harness()
    h.worker.blocked = True
    assert h.session.state == "blocking"
    h.session.publishes = True
    assert h.session.state == "blocked"
    h.worker.blocked = False
    h.worker.arena_full = True
    assert h.session.state == "blocked"
