"""ConnectionHandler: one connection's channels, supervisor events, errors and back-pressure.

No processes, no sockets: a real sans-IO ``AMQPConnection`` driven through its
handshake with client bytes made by pamqp, a real ``ConnectionHandler``, and
``FakeWorker``, the slice of ``workers.worker.Worker`` that handlers and
channels use, which records the request records they send (the harness is in
``tests/workers/helpers.py``).
"""

from __future__ import annotations

import functools
import logging

import pytest
from pamqp import body, commands, frame, header

from ipc import records as r
from ipc.arena import Arena, BlockState
from tests.workers.helpers import CONN, Harness, consumer, methods, pulls
from workers import events as ev
from workers.connection_handler import HIGH_WATER, PUBLISH_CREDIT
from workers.connection_state import State
from workers.outgoing import Method
from workers.output_queue import COALESCE_AT, PART_COST

# -- back-pressure --------------------------------------------------------------


def test_backpressure_makes_consumers_uninterested_until_written() -> None:
    """TCP back-pressure turns into setNotifyWorkDesired(false), and (true) once written."""
    h = Harness(arena_size=HIGH_WATER + (1 << 20))
    target = consumer(h)
    h.notify(target)
    assert pulls(h.take()) == [r.Pull(target.id, target.credit(), True, target.pull_seq)]

    h.supervisor(r.Pulled(target.id, [h.delivery(1, b"x" * HIGH_WATER)], more=True))
    assert h.handler.backpressured
    assert h.take() == [r.Interest(target.id, False)]

    data = h.handler.take_output()  # handed to the socket, not yet written
    assert len(data) > HIGH_WATER
    h.refresh()
    assert h.take() == []  # still in flight: still back-pressured
    h.handler.written()
    # The pull had said "more": credit back, it pulls at once (ConsumerTarget.more).
    assert h.take() == [r.Interest(target.id, True), r.Pull(target.id, target.credit(), True, target.pull_seq)]


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
    h.handler.take_output()
    h.handler.written()
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
    assert 1 not in h.handler.channels


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
    h.handler.on_pulled(target, r.Pulled(target.id, [h.delivery(1)], more=True))
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
    """connection.close: ChanClose for each channel, then ConnClose; the handler is gone."""
    h = Harness(channels=(1, 2))
    target = consumer(h, 2, "c2")
    h.client(0, commands.Connection.Close(200, "bye", 0, 0))
    assert sorted(h.take(), key=repr) == sorted(
        [r.ChanClose(CONN, 1), r.ChanClose(CONN, 2), r.ConnClose(CONN)], key=repr)
    assert target.id not in h.worker.targets
    assert CONN not in h.worker.handlers


# -- flow control: when the worker stops reading a connection ------------------------------


def test_publish_credit_stops_reading_after_the_window_and_credit_resumes_it() -> None:
    """Credit flow: PUBLISH_CREDIT publishes not given back stop the reader (state ``flow``);
    the supervisor's Credit resumes it and wakes the waiting reader once."""
    h = Harness()
    woken: list[str] = []
    h.handler.wake_reader = lambda: woken.append("reader")
    for _ in range(PUBLISH_CREDIT - 1):
        h.publish(1, exchange="", routing_key="q")
    assert h.handler.reading_stop is None and h.handler.state == "running"
    h.publish(1, exchange="", routing_key="q")
    assert len([rec for rec in h.take() if isinstance(rec, r.Publish)]) == PUBLISH_CREDIT
    assert h.handler.reading_stop == "flow" and h.handler.state == "flow"

    h.handler.add_credit(PUBLISH_CREDIT // 2)
    assert h.handler.reading_stop is None and h.handler.state == "running"
    assert woken == ["reader"]
    h.handler.add_credit(PUBLISH_CREDIT // 2)
    assert woken == ["reader"]  # it was not stopped: nothing to wake


def test_transactional_publishes_take_credit_when_committed() -> None:
    """Held in the channel until tx.commit, they are not on the ring: no credit used yet."""
    h = Harness()
    h.client(1, commands.Tx.Select())
    h.supervisor(*[])
    for _ in range(3):
        h.publish(1, exchange="", routing_key="q")
    assert h.handler.credit == PUBLISH_CREDIT
    h.client(1, commands.Tx.Commit())
    assert h.handler.credit == PUBLISH_CREDIT - 3


def test_unsent_output_past_the_bound_stops_reading_whatever_produced_it() -> None:
    """A client that pipelines methods the worker answers itself and never reads: past
    OUTPUT_BOUND of unsent replies the reader stops; once written, it reads again."""
    h = Harness()
    h.handler.output_bound = 64 << 10  # OUTPUT_BOUND's 8 MiB of qos-ok takes 700k methods
    flood = frame.marshal(commands.Basic.Qos(prefetch_count=1), 1) * 1024
    for _ in range(100):
        if h.handler.reading_stop is not None:
            break
        h.feed(flood)
    assert h.handler.reading_stop == "output" and h.handler.state == "flow"
    # The bound counts what the replies cost (octets and a part's overhead each), and past a
    # few parts they are copied onto one bytearray (OutputQueue.append): 12 octets a qos-ok.
    assert h.proto.unsent_cost > h.handler.output_bound
    assert h.proto.unsent_cost < h.proto.unsent_bytes + 64 * PART_COST
    assert len(h.proto._output.parts) <= COALESCE_AT + 1
    woken: list[str] = []
    h.handler.wake_reader = lambda: woken.append("reader")
    h.frames()  # the writer took everything and the socket accepted it
    assert h.handler.reading_stop is None and woken == ["reader"]


def test_heartbeats_look_at_the_socket_only_while_output_stops_the_reader() -> None:
    """Unread output stops the reader, so the client's heartbeats lie unread: the tick asks the
    socket's queues then, and only then (credit flow is the broker's own pause)."""
    h = Harness()
    asked: list[int] = []
    h.handler.socket_queues = lambda: asked.append(1) or (len(asked), 0)
    assert h.handler.heartbeat_tick(1.0) and asked == []
    h.handler.credit = 0
    assert h.handler.heartbeat_tick(2.0) and asked == []
    h.handler.output_bound = 0
    h.handler.send(Method(1, commands.Basic.QosOk()))
    assert h.handler.reading_stop == "output"
    assert h.handler.heartbeat_tick(3.0) and asked == [1]


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
    h.handler.credit = 0
    assert h.handler.reading_stop == "flow"
    h.proto.close(320, "CONNECTION_FORCED")
    assert h.handler.reading_stop is None
    assert h.handler.state == "closing"


def test_state_names_the_memory_alarm_as_rabbitmq_does() -> None:
    """``blocking``: alarm on, the connection has not published; ``blocked`` once it has."""
    h = Harness()
    h.worker.blocked = True
    assert h.handler.state == "blocking"
    h.handler.publishes = True
    assert h.handler.state == "blocked"
    h.worker.blocked = False
    h.worker.arena_full = True
    assert h.handler.state == "blocked"


def _used(arena: Arena) -> list[int]:
    return [b.payload for b in arena.blocks() if b.state is not BlockState.FREE]


def _big_publish(channel: int, data: bytes, properties: commands.Basic.Properties | None = None,
                 **kwargs: object) -> bytes:
    out = (frame.marshal(commands.Basic.Publish(**kwargs), channel)  # type: ignore[arg-type]
           + frame.marshal(header.ContentHeader(0, len(data), properties
                                                or commands.Basic.Properties()), channel))
    for at in range(0, len(data), 131064):
        out += frame.marshal(body.ContentBody(data[at : at + 131064]), channel)
    return out


def _placing(h: Harness, size: int = 1 << 20) -> Arena:
    """The worker's wiring (workers.server): big bodies placed in an arena (a real one: the
    compiled handler takes no other); a block given up is freed through the worker's bodies
    (the harness's fake arena records it)."""
    arena = Arena(bytearray(size), init=True)
    h.proto.place_bodies(functools.partial(h.handler.place_body, arena), h.handler.release_body)
    return arena


def test_a_placed_big_publish_goes_out_from_the_block_its_body_was_received_into() -> None:
    """With placing on, a big body is received into a block of the worker's arena taken at its
    content header; publish_at_once then publishes that block (no second block, no copy)."""
    h = Harness()
    arena = _placing(h)
    data = bytes(range(256)) * 800  # 204,800 octets: two body frames
    [event] = h.proto.receive_data(_big_publish(1, data, routing_key="q"))
    assert isinstance(event, ev.PublishReceived) and event.placed >= 0 and event.body == []
    blocks = _used(arena)
    assert h.handler.publish_at_once(event, arena) == 0
    assert _used(arena) == blocks == [event.placed]  # nothing more allocated
    [pub] = [rec for rec in h.take() if isinstance(rec, r.Publish)]
    assert (pub.offset, pub.header_len, pub.body_len) == (
        event.placed, event.placed_header, len(data))
    stored = bytes(arena.view(pub.offset, pub.header_len + pub.body_len))
    assert stored == bytes(event.header_payload) + data


@pytest.mark.parametrize("why", ["blocked", "arena full", "direct reply-to", "no room"])
def test_a_big_body_is_not_placed_when_it_may_not_take_a_block_now(why: str) -> None:
    """Publishers blocked (memory alarm, full arena), a direct reply-to (its stored header is
    rewritten, and it may be refused) or no block that size: the body is assembled in pieces
    as before, and nothing is taken from the arena at its header."""
    h = Harness()
    arena = _placing(h, 300_000)
    taken = arena.alloc(150_000) if why == "no room" else None
    h.worker.blocked = why == "blocked"
    h.worker.arena_full = why == "arena full"
    props = commands.Basic.Properties(reply_to="amq.rabbitmq.reply-to" if why == "direct reply-to"
                                      else None)
    [event] = h.proto.receive_data(_big_publish(1, b"p" * 200_000, props, routing_key="q"))
    assert isinstance(event, ev.PublishReceived)
    assert event.placed == -1 and sum(len(c) for c in event.body) == 200_000
    assert _used(arena) == ([] if taken is None else [taken])


def test_a_connection_that_ends_mid_body_frees_its_placed_block() -> None:
    """The socket goes while a big body is half here: finish() frees the block it had."""
    h = Harness()
    arena = _placing(h)
    stream = _big_publish(1, b"f" * 200_000, routing_key="q")
    assert h.proto.receive_data(stream[:150_000]) == []
    [block] = _used(arena)
    assert h.worker.region.arena.freed == []
    h.handler.finish()
    assert h.worker.region.arena.freed == [block]


def test_info_lists_the_client_properties_and_every_open_channel() -> None:
    """The management API's /api/connections and /api/channels: the row carries the client's
    properties (JSON-able) and each open channel as the worker knows it."""
    h = Harness(channels=(1, 2), capabilities={"publisher_confirms": True})
    h.client(1, commands.Basic.Qos(prefetch_count=7))
    h.client(2, commands.Basic.Qos(prefetch_count=3, global_=True))
    h.client(2, commands.Confirm.Select())
    info = h.handler.info()
    assert info.client_properties == {"product": "test",
                                      "capabilities": {"publisher_confirms": True}}
    by_number = {c.number: c for c in info.open_channels}
    assert by_number[1] == r.ChannelInfo(1, 7, 0, False, False, 0, 0)
    assert by_number[2] == r.ChannelInfo(2, 0, 3, True, False, 0, 0)


def test_field_table_values_become_json_values() -> None:
    from decimal import Decimal

    from workers.connection_lifecycle import jsonable_table
    table = {"product": b"caf\xc3\xa9", "bad": b"\xff", "nested": {"a": [1, b"x", (2.5, None)]},
             "n": Decimal("1.5"), "ok": True}
    assert jsonable_table(table) == {"product": "café", "bad": "\ufffd",
                                     "nested": {"a": [1, "x", [2.5, None]]}, "n": "1.5", "ok": True}
