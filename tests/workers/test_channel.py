"""Channel: credit and interest (setNotifyWorkDesired), pulls (deliverSingleMessage),
delivery tags and settling, reply order, confirms, the "last declared queue".

Driven through a real AMQPConnection and ConnectionHandler (see the harness in
``tests/workers/helpers.py``); the records the channel sends are what is asserted on.
"""

from __future__ import annotations

from typing import Any

import pytest
from pamqp import commands, header

from ipc import records as r
from tests.workers.channel_helpers import deliver, delivery_tags, only_channel_close, with_prefetch
from tests.workers.helpers import (
    CONN,
    Harness,
    consumer,
    interests,
    methods,
    pulls,
)
from workers.consumer_target import PULL_BATCH, ConsumerTarget

# -- credit and interest (seed: setNotifyWorkDesired) --------------------------------


def test_consume_with_credit_is_interested() -> None:
    """A consumer with prefetch credit says it is interested in its Consume record."""
    h = Harness()
    h.client(1, commands.Basic.Qos(prefetch_count=2))
    h.client(1, commands.Basic.Consume(queue="q", consumer_tag="c1"))
    [consume] = h.take()
    assert isinstance(consume, r.Consume)
    assert (consume.queue, consume.tag, consume.interested) == ("q", "c1", True)


def test_prefetch_exhausted_makes_consumer_uninterested_and_ack_restores() -> None:
    """seed: setNotifyWorkDesired follows credit: N unacked → Interest(False); an ack → (True)."""
    h = Harness()
    target = with_prefetch(h, 2)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 2, True, target.pull_seq)]
    deliver(h, target, [11], more=True)
    assert interests(h.take()) == []  # one unacked, one credit left
    h.notify(target)
    h.take()
    deliver(h, target, [12], more=True)
    assert h.take() == [r.Interest(target.id, False)]

    h.client(1, commands.Basic.Ack(delivery_tag=1))
    # The last pull said the queue has more: the credit is pulled with the Interest, not
    # after a notification's round trip (ConsumerTarget.more).
    assert h.take() == [r.Settle(CONN, 1, [11], r.ACK), r.Interest(target.id, True),
                        r.Pull(target.id, 1, True, target.pull_seq)]


def test_an_ack_after_a_standing_pull_was_used_up_pulls_again() -> None:
    """A standing pull that its deliveries used up (the queue had no more) is asked for again
    with the credit the ack gives back: the queue's next message finds it open instead of
    waiting for a notification and a pull."""
    h = Harness()
    target = with_prefetch(h, 1)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 1, True, target.pull_seq)]
    deliver(h, target, [11], more=False)
    assert h.take() == [r.Interest(target.id, False)]
    h.client(1, commands.Basic.Ack(delivery_tag=1))
    assert h.take() == [r.Settle(CONN, 1, [11], r.ACK), r.Interest(target.id, True),
                        r.Pull(target.id, 1, True, target.pull_seq)]


def test_a_used_up_standing_pull_is_renewed_at_once_with_the_credit_left() -> None:
    """Prefetch 4, a standing pull of 4 used up while two of them are acked already: the
    answer's 2 of credit are pulled again at once (standing), without a notification."""
    h = Harness()
    target = with_prefetch(h, 4)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 4, True, target.pull_seq)]
    deliver(h, target, [1, 2], more=False, still_open=2)
    h.client(1, commands.Basic.Ack(delivery_tag=2, multiple=True))
    assert pulls(h.take()) == []  # the rest of the pull stays open
    deliver(h, target, [3, 4], more=False)
    assert pulls(h.take()) == [r.Pull(target.id, 2, True, target.pull_seq)]


def test_an_ack_after_a_pull_that_emptied_the_queue_only_restores_interest() -> None:
    """Under basic.qos global=true pulls are not standing: without "more" from the queue the
    consumer waits to be notified (no spurious pull)."""
    h = Harness()
    target = with_prefetch(h, 1, global_=True)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 1, False, target.pull_seq)]
    deliver(h, target, [11], more=False)
    assert h.take() == [r.Interest(target.id, False)]
    h.client(1, commands.Basic.Ack(delivery_tag=1))
    assert h.take() == [r.Settle(CONN, 1, [11], r.ACK), r.Interest(target.id, True)]


def test_notify_leads_to_one_pull_of_the_credit() -> None:
    """seed: notifyWork → deliverSingleMessage: one Pull for the credit, none while in flight."""
    h = Harness()
    target = with_prefetch(h, 5)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 5, True, target.pull_seq)]
    h.notify(target)
    h.refresh()
    assert h.take() == []


def test_pulled_with_more_pulls_again_with_remaining_credit() -> None:
    """seed: a notified consumer keeps pulling while pulls succeed and credit remains."""
    h = Harness()
    target = with_prefetch(h, 5)
    h.notify(target)
    h.take()
    deliver(h, target, [1, 2], more=True)
    assert pulls(h.take()) == [r.Pull(target.id, 3, True, target.pull_seq)]


def test_pulled_without_more_stops_until_next_notify() -> None:
    """seed: the first empty pull sends the consumer back to Interested: no pull until notified."""
    h = Harness()
    target = with_prefetch(h, 5)
    h.notify(target)
    h.take()
    deliver(h, target, [1], more=False)
    assert h.take() == []
    h.refresh()
    assert h.take() == []
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 4, True, target.pull_seq)]


def test_notify_seen_before_the_answer_of_the_pull_in_flight_is_not_lost() -> None:
    """The supervisor answers a pull (more=False: back to Interested), then a new message
    notifies the consumer again; the worker can find the slot set before it reads that answer.
    The answer must not undo the newer notification, or the consumer stalls while the
    supervisor thinks it Notified."""
    h = Harness()
    target = with_prefetch(h, 5)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, 5, True, target.pull_seq)]
    h.notify(target)  # the slot, read before the Pulled event below
    assert h.take() == []
    deliver(h, target, [1], more=False)
    assert pulls(h.take()) == [r.Pull(target.id, 4, True, target.pull_seq)]
    deliver(h, target, [], more=False)  # that round is over: nothing more until notified
    assert h.take() == []


def test_unlimited_consumer_pulls_a_batch() -> None:
    """Without prefetch a Pull asks for PULL_BATCH, the most one turn may take."""
    h = Harness()
    target = consumer(h)
    h.notify(target)
    assert h.take() == [r.Pull(target.id, PULL_BATCH, True, target.pull_seq)]


# -- delivery tags and settling ---------------------------------------------------------


def test_delivery_tags_increase_per_channel_from_one() -> None:
    """Delivery tags are the channel's: 1, 2, 3… on each channel, get-ok included."""
    h = Harness(channels=(1, 2))
    first = consumer(h, 1, "c1")
    second = consumer(h, 2, "c2")
    h.notify(first)
    h.notify(second)
    deliver(h, first, [1, 2])
    deliver(h, second, [3])
    h.client(1, commands.Basic.Get(queue="q"))
    h.supervisor(r.GetOk(CONN, 1, h.delivery(4), 0))
    deliver(h, second, [5])
    assert delivery_tags(h.frames()) == [(1, 1), (1, 2), (2, 1), (1, 3), (2, 2)]


def _three_delivered(h: Harness) -> ConsumerTarget:
    target = consumer(h)
    h.notify(target)
    deliver(h, target, [11, 12, 13])
    h.take()
    h.frames()
    return target


def test_ack_multiple_settles_every_tag_up_to_it() -> None:
    """basic.ack multiple=true settles every unacked tag up to it, in one Settle, in order."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Basic.Ack(delivery_tag=2, multiple=True))
    assert h.take() == [r.Settle(CONN, 1, [11, 12], r.ACK)]
    h.client(1, commands.Basic.Ack(delivery_tag=3))
    assert h.take() == [r.Settle(CONN, 1, [13], r.ACK)]
    assert not h.channel().unacked


def test_ack_multiple_zero_settles_everything() -> None:
    """AMQP 0-9-1: multiple with delivery tag 0 acknowledges all outstanding messages."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Basic.Ack(delivery_tag=0, multiple=True))
    assert h.take() == [r.Settle(CONN, 1, [11, 12, 13], r.ACK)]


@pytest.mark.parametrize("tag", [5, 2])
def test_ack_of_unknown_tag_closes_the_channel(tag: int) -> None:
    """An unknown (or already acked) delivery tag is 406 PRECONDITION_FAILED, channel closed."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Basic.Ack(delivery_tag=2))
    h.take()
    h.client(1, commands.Basic.Ack(delivery_tag=tag))
    close = only_channel_close(h)
    assert close.reply_code == 406
    assert close.reply_text == f"PRECONDITION_FAILED - unknown delivery tag {tag}"
    assert (close.class_id, close.method_id) == (60, 80)
    assert h.take() == [r.ChanClose(CONN, 1)]


def test_nack_without_requeue_drops() -> None:
    """basic.nack requeue=false drops the message (Settle DROP)."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Basic.Nack(delivery_tag=2, requeue=False))
    assert h.take() == [r.Settle(CONN, 1, [12], r.DROP)]


def test_nack_multiple_with_requeue_requeues_up_to_it() -> None:
    """basic.nack multiple=true requeue=true requeues every tag up to it."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Basic.Nack(delivery_tag=2, multiple=True, requeue=True))
    assert h.take() == [r.Settle(CONN, 1, [11, 12], r.REQUEUE)]


@pytest.mark.parametrize(("requeue", "action"), [(True, r.REQUEUE), (False, r.DROP)])
def test_reject(requeue: bool, action: int) -> None:
    """basic.reject requeue=true requeues (Settle REQUEUE); requeue=false drops."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Basic.Reject(delivery_tag=3, requeue=requeue))
    assert h.take() == [r.Settle(CONN, 1, [13], action)]


def test_recover_requeues_every_unacked_message() -> None:
    """basic.recover requeues all unacked messages of the channel and answers recover-ok."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Basic.Ack(delivery_tag=2))
    h.take()
    h.client(1, commands.Basic.Recover(requeue=True))
    assert h.take() == [r.Settle(CONN, 1, [11, 13], r.REQUEUE)]
    assert [type(f) for _, f in methods(h.frames())] == [commands.Basic.RecoverOk]
    assert not h.channel().unacked


@pytest.mark.parametrize("recover", [commands.Basic.Recover(requeue=False),
                                     commands.Basic.RecoverAsync(requeue=False)],
                         ids=["recover", "recover-async"])
def test_recover_without_requeue_is_540_as_in_rabbitmq(recover: Any) -> None:
    """rabbit_channel: basic.recover / recover-async with requeue=false is 540 "requeue=false";
    nothing is settled."""
    h = Harness()
    _three_delivered(h)
    h.take()
    h.client(1, recover)
    [(channel, close)] = methods(h.frames())
    assert channel == 0 and isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - requeue=false")
    assert (close.class_id, close.method_id) == divmod(recover.index, 1 << 16)
    assert not [rec for rec in h.take() if isinstance(rec, r.Settle)]


def test_recover_async_requeues_without_a_reply() -> None:
    """basic.recover-async requeue=true: basic.recover without the recover-ok."""
    h = Harness()
    _three_delivered(h)
    h.take()
    h.client(1, commands.Basic.RecoverAsync(requeue=True))
    assert h.take() == [r.Settle(CONN, 1, [11, 12, 13], r.REQUEUE)]
    assert methods(h.frames()) == []


def test_get_no_ack_settles_and_get_ack_waits_for_ack() -> None:
    """basic.get no-ack settles at once; with acks the entry waits for basic.ack."""
    h = Harness()
    h.client(1, commands.Basic.Get(queue="q", no_ack=True))
    h.client(1, commands.Basic.Get(queue="q"))
    assert [rec.no_ack for rec in h.take()] == [True, False]
    h.supervisor(r.GetOk(CONN, 1, h.delivery(31), 1), r.GetOk(CONN, 1, h.delivery(32), 0))
    assert h.take() == [r.Settle(CONN, 1, [31], r.AUTO_ACK)]
    assert delivery_tags(h.frames()) == [(1, 1), (1, 2)]
    h.client(1, commands.Basic.Ack(delivery_tag=2))
    assert h.take() == [r.Settle(CONN, 1, [32], r.ACK)]


# -- reply order -------------------------------------------------------------------------


def test_local_reply_waits_behind_supervisor_reply() -> None:
    """AMQP 0-9-1 §2.2.2: queue.declare then basic.qos: qos-ok never precedes declare-ok."""
    h = Harness()
    h.client(1, commands.Queue.Declare(queue="q"))
    h.client(1, commands.Basic.Qos(prefetch_count=10))
    assert h.frames() == []
    h.supervisor(r.Reply(CONN, 1, "qdecl", queue="q", message_count=4))
    assert [type(f) for _, f in methods(h.frames())] == [
        commands.Queue.DeclareOk, commands.Basic.QosOk,
    ]


def test_local_replies_after_several_supervisor_replies_keep_their_order() -> None:
    """Local replies asked after several supervisor requests follow all of their replies."""
    h = Harness()
    h.client(1, commands.Queue.Declare(queue="q"))
    h.client(1, commands.Queue.Bind(queue="q", exchange="amq.fanout"))
    h.client(1, commands.Basic.Qos(prefetch_count=10))
    h.client(1, commands.Channel.Flow(active=True))
    h.supervisor(r.Reply(CONN, 1, "qdecl", queue="q"))
    assert [type(f) for _, f in methods(h.frames())] == [commands.Queue.DeclareOk]
    h.supervisor(r.Reply(CONN, 1, "qbind"))
    assert [type(f) for _, f in methods(h.frames())] == [
        commands.Queue.BindOk, commands.Basic.QosOk, commands.Channel.FlowOk,
    ]


def test_replies_come_in_request_order() -> None:
    """AMQP 0-9-1 §2.2.2: pipelined methods on one channel are answered in the order asked."""
    h = Harness()
    h.client(1, commands.Exchange.Declare(exchange="x", exchange_type="fanout"))
    h.client(1, commands.Queue.Declare(queue="q"))
    h.client(1, commands.Confirm.Select())
    h.client(1, commands.Queue.Bind(queue="q", exchange="x"))
    h.client(1, commands.Channel.Flow(active=True))
    h.supervisor(r.Reply(CONN, 1, "xdecl"), r.Reply(CONN, 1, "qdecl", queue="q"))
    h.supervisor(r.Reply(CONN, 1, "qbind"))
    assert [type(f) for _, f in methods(h.frames())] == [
        commands.Exchange.DeclareOk, commands.Queue.DeclareOk, commands.Confirm.SelectOk,
        commands.Queue.BindOk, commands.Channel.FlowOk,
    ]


def test_a_local_reply_after_a_mandatory_publish_waits_for_its_return() -> None:
    """confirm.select (answered by the worker itself) after an unroutable mandatory publish: a
    Sync goes through the supervisor first, so select-ok follows the publish's basic.return."""
    h = Harness()
    h.publish(1, exchange="", routing_key="nowhere", mandatory=True)
    h.client(1, commands.Confirm.Select())
    assert [type(rec) for rec in h.take()] == [r.Publish, r.Sync]
    assert h.frames() == []
    h.supervisor(_unroutable(h), r.Reply(CONN, 1, "sync"))
    assert [type(f) for _, f in methods(h.frames())] == [
        commands.Basic.Return, commands.Confirm.SelectOk]


@pytest.mark.parametrize("local", [commands.Basic.Qos(prefetch_count=1), commands.Channel.Flow(active=True),
                                   commands.Basic.Recover(requeue=True),
                                   commands.Basic.Cancel("unknown-tag")],
                         ids=["qos", "flow", "recover", "cancel"])
def test_every_local_reply_after_a_confirmed_publish_follows_its_ack(local: Any) -> None:
    """Whatever the worker answers itself, after a publish in confirm mode: the ack first."""
    h = Harness()
    h.client(1, commands.Confirm.Select())
    h.frames()
    h.publish(1, exchange="", routing_key="q")
    h.client(1, local)
    assert h.frames() == []
    h.supervisor(r.Confirm(CONN, 1, True), r.Reply(CONN, 1, "sync"))
    frames = methods(h.frames())
    assert [type(f) for _, f in frames][:1] == [commands.Basic.Ack] and len(frames) == 2


def test_no_sync_when_no_publish_can_still_be_answered() -> None:
    """Without a mandatory or confirmed publish since the last request, a local reply is at once."""
    h = Harness()
    h.publish(1, exchange="", routing_key="q")
    h.client(1, commands.Basic.Qos(prefetch_count=1))
    assert [type(rec) for rec in h.take()] == [r.Publish]
    assert [type(f) for _, f in methods(h.frames())] == [commands.Basic.QosOk]


def test_declare_ok_follows_the_acks_that_came_before_it() -> None:
    """A reply the worker encodes itself (declare-ok, get-ok) never overtakes an ack the same
    batch of supervisor events brought before it."""
    h = Harness()
    h.client(1, commands.Confirm.Select())
    h.frames()
    h.publish(1, exchange="", routing_key="q")
    h.client(1, commands.Queue.Declare(queue="q"))
    h.supervisor(r.Confirm(CONN, 1, True), r.Reply(CONN, 1, "qdecl", queue="q"))
    assert [type(f) for _, f in methods(h.frames())] == [commands.Basic.Ack, commands.Queue.DeclareOk]


def _unroutable(h: Harness) -> r.Returned:
    head = header.ContentHeader(0, 1, commands.Basic.Properties()).marshal()
    offset = h.worker.region.arena.store(head + b"m")
    return r.Returned(CONN, 1, 312, "NO_ROUTE", "", "nowhere", offset, len(head), 1)


# -- publisher confirms ------------------------------------------------------------------


def test_confirms_of_one_batch_become_one_ack_multiple() -> None:
    """Confirms arriving in one batch are one basic.ack multiple=true for the last sequence."""
    h = Harness()
    h.client(1, commands.Confirm.Select())
    h.frames()
    for _ in range(4):
        h.publish(1, b"m", exchange="", routing_key="q")
    assert [rec.confirm for rec in h.take()] == [True] * 4
    h.supervisor(*[r.Confirm(CONN, 1, True)] * 3)
    [(n, ack)] = h.frames()
    assert n == 1 and isinstance(ack, commands.Basic.Ack)
    assert (ack.delivery_tag, ack.multiple) == (3, True)
    h.supervisor(r.Confirm(CONN, 1, True))
    [(_, ack)] = h.frames()
    assert (ack.delivery_tag, ack.multiple) == (4, False)


def test_publish_without_confirm_mode_is_not_numbered() -> None:
    """Outside confirm mode a publish carries confirm=false and nothing is acked."""
    h = Harness()
    h.publish(1, b"m", exchange="", routing_key="q")
    [pub] = h.take()
    assert isinstance(pub, r.Publish) and not pub.confirm and pub.body_len == 1
    assert h.channel().published == 0


# -- queue name "" means the last declared queue ------------------------------------------

_EMPTY_QUEUE_METHODS = [
    (commands.Basic.Consume(queue="", consumer_tag="c1"), r.Consume),
    (commands.Queue.Bind(queue="", exchange="amq.fanout", routing_key="k"), r.QueueBind),
    (commands.Basic.Get(queue=""), r.Get),
]


@pytest.mark.parametrize(("method", "record"), _EMPTY_QUEUE_METHODS)
def test_empty_queue_name_means_last_declared(method: Any, record: type[Any]) -> None:
    """AMQP 0-9-1: queue name "" means the last queue declared on the channel."""
    h = Harness()
    h.client(1, commands.Queue.Declare(queue=""))
    h.supervisor(r.Reply(CONN, 1, "qdecl", queue="amq.gen-abc"))
    h.frames()
    h.take()
    h.client(1, method)
    [rec] = h.take()
    assert isinstance(rec, record) and rec.queue == "amq.gen-abc"


@pytest.mark.parametrize(("method", "record"), _EMPTY_QUEUE_METHODS)
def test_empty_queue_name_without_declared_queue_is_not_found(method: Any, record: type) -> None:
    """Queue name "" with no queue declared on the channel is 404 NOT_FOUND, channel closed."""
    h = Harness()
    h.client(1, method)
    close = only_channel_close(h)
    assert close.reply_code == 404
    assert h.take() == [r.ChanClose(CONN, 1)]


def test_bind_with_empty_queue_and_key_uses_the_queue_name_as_key() -> None:
    """queue.bind with queue "" and routing key "" binds the last queue by its own name."""
    h = Harness()
    h.client(1, commands.Queue.Declare(queue="q"))
    h.take()
    h.client(1, commands.Queue.Bind(queue="", exchange="amq.direct", routing_key=""))
    [bind] = h.take()
    assert (bind.queue, bind.routing_key) == ("q", "q")


def test_empty_queue_name_after_pipelined_server_named_declare() -> None:
    """A channel is serial: "" names the queue a still-unanswered queue.declare creates."""
    h = Harness()
    h.client(1, commands.Queue.Declare(queue="", exclusive=True))
    h.client(1, commands.Basic.Consume(queue="", consumer_tag="c1"))
    assert h.proto.is_channel_open(1)
    h.supervisor(r.Reply(CONN, 1, "qdecl", queue="amq.gen-abc"))
    consumes = [rec for rec in h.take() if isinstance(rec, r.Consume)]
    assert [c.queue for c in consumes] == ["amq.gen-abc"]


def test_an_ack_behind_an_unanswered_server_named_declare_waits_for_it() -> None:
    """The channel is serial for acks too (read on the hot path, AckReceived): an ack after a
    queue.declare whose name the supervisor has yet to give settles only after declare-ok."""
    h = Harness()
    _three_delivered(h)
    h.client(1, commands.Queue.Declare(queue="", exclusive=True))
    h.client(1, commands.Basic.Ack(delivery_tag=2))
    assert [type(rec) for rec in h.take()] == [r.QueueDeclare]
    h.supervisor(r.Reply(CONN, 1, "qdecl", queue="amq.gen-abc"))
    assert h.take() == [r.Settle(CONN, 1, [12], r.ACK)]
    assert [type(m) for _, m in h.frames()] == [commands.Queue.DeclareOk]
    h.client(1, commands.Basic.Ack(delivery_tag=2))  # acked already: 406, as any unknown tag
    assert only_channel_close(h).reply_code == 406


# -- basic.return -----------------------------------------------------------------


def _returned(h: Harness, **reheader: Any) -> tuple[Any, Any, bytes]:
    """Publish a message with headers, have the supervisor return it; what the client got."""
    data = b"unroutable"
    head = header.ContentHeader(0, len(data), commands.Basic.Properties(
        headers={"CC": ["a"], "BCC": ["b"]}, expiration="500", message_id="m1")).marshal()
    offset = h.worker.region.arena.store(head + data)
    h.supervisor(r.Returned(CONN, 1, 312, "NO_ROUTE", "", "nowhere", offset, len(head),
                            len(data), **reheader))
    (_, method), (_, content), (_, payload) = h.frames()
    assert isinstance(method, commands.Basic.Return)
    assert (method.reply_code, method.routing_key) == (312, "nowhere")
    return method, content, payload.value


def test_return_passes_the_published_header_through() -> None:
    _, content, body = _returned(Harness())
    assert content.properties.headers == {"CC": ["a"], "BCC": ["b"]}
    assert body == b"unroutable"


def test_return_with_reheader_sends_the_new_headers_and_keeps_other_properties() -> None:
    _, content, body = _returned(Harness(), reheader=True, headers={"CC": ["a"]}, expiration="500")
    assert content.properties.headers == {"CC": ["a"]}
    assert (content.properties.expiration, content.properties.message_id) == ("500", "m1")
    assert body == b"unroutable"
