"""A channel on its own (issue 10, h2's ``H2Stream`` model): made with its connection's
configuration and the resources a worker lends (``workers.channel_config``), it returns the
requests and events each call produced, and never calls an owner -- there is none here."""

from __future__ import annotations

from pamqp import commands

from ipc import records as r
from tests.workers.helpers import FakeArena, FakeArenas
from workers.channel import Channel
from workers.channel_config import ChannelConfig, ChannelResources
from workers.consumer_target import Backpressure, ConsumerTargets
from workers.outgoing import Ack, Deliveries, Method, Outgoing

CONN = 3


def _methods(events: list[Outgoing]) -> list[tuple[int, str]]:
    return [(e.channel, e.method.name) for e in events if isinstance(e, Method)]


def _channel(targets: ConsumerTargets | None = None,
             output: Backpressure | None = None) -> tuple[Channel, FakeArena]:
    arena = FakeArena(1 << 16)
    resources = ChannelResources(FakeArenas(arena),
                                 ConsumerTargets(8) if targets is None else targets)
    config = ChannelConfig(CONN, False, Backpressure() if output is None else output)
    return Channel(1, config, resources), arena


def test_a_local_answer_is_an_event_and_a_supervisor_request_a_record() -> None:
    ch, _ = _channel()
    out = ch.on_method(commands.Basic.Qos(prefetch_count=5))
    assert out.requests == [] and _methods(out.events) == [(1, "Basic.QosOk")]
    out = ch.on_method(commands.Queue.Declare(queue="q"))
    assert out.events == []
    assert [type(rec) for rec in out.requests] == [r.QueueDeclare]
    out = ch.on_reply(r.Reply(CONN, 1, "declare", queue="q", message_count=2, consumer_count=0))
    assert out.requests == [] and [e.queue for e in out.events] == ["q"]  # type: ignore[union-attr]


def test_a_publish_says_the_credit_it_spends_and_its_confirm_comes_back_as_an_event() -> None:
    ch, arena = _channel()
    ch.on_method(commands.Confirm.Select())
    offset = arena.store(b"hb")
    out = ch.publish("", "q", False, offset, 1, 1, None)
    assert out.publishes == 1 and [type(rec) for rec in out.requests] == [r.Publish]
    out = ch.on_confirm(r.Confirm(CONN, 1, True))
    assert out.events == [] and out.confirms_due  # coalesced at the end of the batch
    assert ch.flush_confirms().events == [Ack(1, 1, False)]


def test_consumer_credit_turns_into_interest_pulls_and_deliveries() -> None:
    targets = ConsumerTargets(8)
    output = Backpressure()
    ch, arena = _channel(targets, output)
    ch.on_method(commands.Basic.Qos(prefetch_count=2))
    out = ch.on_method(commands.Basic.Consume(queue="q", consumer_tag="c"))
    [consume] = out.requests
    assert isinstance(consume, r.Consume) and consume.interested
    target = targets.get(consume.consumer)
    assert target is not None and target.conn == CONN and target.ch == 1 and ch.owns(target)
    out = ch.on_reply(r.Reply(CONN, 1, "consume", queue="q"))
    assert _methods(out.events) == [(1, "Basic.ConsumeOk")]
    assert ch.notify(target).requests == [r.Pull(target.id, 2, True, target.pull_seq)]
    offset = arena.store(b"hb")
    out = ch.on_pulled(target, r.Pulled(target.id, [r.Delivery(9, False, "", "q", 0, offset, 1, 1)],
                                        more=False))
    [deliveries] = out.events
    assert isinstance(deliveries, Deliveries) and deliveries.messages[0][0] == 1
    output.active = True  # the connection's output backed up: no credit for anyone
    assert ch.after_pull(target).requests == [r.Interest(target.id, False)]


def test_closing_gives_back_slots_and_the_inbox_publishes_blocks() -> None:
    """A publish waiting behind a server-named queue.declare is freed if the channel closes."""
    targets = ConsumerTargets(8)
    ch, arena = _channel(targets)
    ch.on_method(commands.Basic.Consume(queue="q", consumer_tag="c"))
    assert len(targets) == 1
    ch.on_method(commands.Queue.Declare(queue=""))  # the name comes with declare-ok
    offset = arena.store(b"hb")
    assert ch.publish("", "", False, offset, 1, 1, None).requests == []  # waits for the name
    ch.close()
    assert len(targets) == 0 and arena.freed == [offset]
