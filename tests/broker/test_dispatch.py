"""The supervisor's record dispatch: requests in, events, notify slots and
body frees out — without processes or shared memory."""

from __future__ import annotations

import pytest

from broker.messages.body_ref import pack_body_ref, unpack_body_ref
from broker.messages.message import FullMessage, PlainMessage
from ipc import records as r
from tests.broker.dispatch_harness import W0, W1, Harness


@pytest.fixture
def h() -> Harness:
    return Harness()


def test_new_message_wakes_one_consumer_slot_on_its_worker(h: Harness) -> None:
    """notifyWork is the consumer's notify slot on its own worker, one consumer per message."""
    h.declare("q")
    h.consume("q", cid=1, slot=10)
    h.consume("q", cid=2, slot=11)
    h.publish("q")
    assert h.woken(W1) in ([10], [11])
    assert h.woken(W0) == []


def test_pull_answers_with_the_publishers_arena_handle(h: Harness) -> None:
    """deliverSingleMessage hands out the body's handle, never the bytes."""
    h.declare("q")
    offset = h.publish("q", worker=W0)
    h.consume("q", cid=1, slot=3)
    pulled = h.pull(1, 10)
    (d,) = pulled.deliveries
    assert (d.region, d.offset, d.header_len, d.body_len) == (W0, offset, 16, 100)
    assert (d.exchange, d.routing_key, d.redelivered) == ("", "q", False)
    assert pulled.more is False


def test_ack_frees_the_body_once_the_last_queue_settles(h: Harness) -> None:
    """A fanned-out body is freed only when every queue's entry is settled."""
    h.declare("a")
    h.declare("b")
    for q in ("a", "b"):
        h.send(W0, r.QueueBind(1, 1, q, "amq.fanout", "", {}, False))
    h.events(W0)
    offset = h.publish("", exchange="amq.fanout")
    h.consume("a", cid=1, slot=1)
    h.consume("b", cid=2, slot=2, ch=2)
    (da,) = h.pull(1, 1).deliveries
    (db,) = h.pull(2, 1).deliveries
    h.send(W1, r.Settle(1, 1, [da.entry], r.ACK))
    assert h.freed == []
    h.send(W1, r.Settle(1, 2, [db.entry], r.ACK))
    assert h.freed == [(W0, offset)]


def test_closed_channel_requeues_unacked_to_original_position_redelivered(h: Harness) -> None:
    """Unacked messages of a closed channel go back in front, marked redelivered."""
    h.declare("q")
    h.publish("q")
    h.publish("q")
    h.consume("q", cid=1, slot=1)
    first = h.pull(1, 1).deliveries[0]
    h.send(W1, r.ChanClose(1, 1))
    h.consume("q", cid=2, slot=2, ch=2)
    again = h.pull(2, 10).deliveries
    assert next(d.entry for d in again) == first.entry
    assert [d.redelivered for d in again] == [True, False]


def test_dead_worker_releases_consumers_unacked_and_exclusive_queues(h: Harness) -> None:
    """A worker dying requeues what its channels held and deletes its connections'
    exclusive queues; consumers on other workers are woken for the work."""
    h.declare("shared")
    h.declare("mine", worker=W1, conn=7, exclusive=True)
    h.publish("shared")
    h.consume("shared", cid=1, slot=1, worker=W1)
    held = h.pull(1, 1, worker=W1).deliveries[0]
    h.consume("shared", cid=5, slot=9, worker=W0, conn=2)
    h.woken(W0)
    h.d.worker_died(W1)
    assert "mine" not in h.d.vhost.queues
    assert h.woken(W0) == [9]
    (again,) = h.pull(5, 1, worker=W0).deliveries
    assert (again.entry, again.redelivered) == (held.entry, True)


def test_unroutable_mandatory_is_returned_and_left_for_the_publisher_to_free(h: Harness) -> None:
    """An unroutable mandatory publish comes back as Returned (312 NO_ROUTE); the
    publishing worker frees the block after sending basic.return."""
    offset = h.publish("nowhere", mandatory=True, confirm=True)
    ret, confirm = h.events(W0)
    assert isinstance(ret, r.Returned) and (ret.code, ret.offset) == (312, offset)
    assert isinstance(confirm, r.Confirm)
    assert h.freed == []


def test_unroutable_plain_publish_is_dropped_and_freed(h: Harness) -> None:
    """A non-mandatory unroutable message is dropped and its block freed at once."""
    offset = h.publish("nowhere")
    assert h.events(W0) == []
    assert h.freed == [(W0, offset)]


def test_confirm_comes_after_enqueue(h: Harness) -> None:
    """Publisher confirms: ack once the message is enqueued."""
    h.declare("q")
    h.publish("q", confirm=True)
    assert h.events(W0) == [r.Confirm(1, 1, True)]
    assert h.d.vhost.queues["q"].message_count == 1


def test_error_names_the_failing_method(h: Harness) -> None:
    """A domain error becomes an Error record with the reply code and the
    (class, method) of the request, as channel.close carries them."""
    h.send(W0, r.QueueDeclare(1, 1, "missing", True, False, False, False, {}, False))
    (err,) = h.events(W0)
    assert isinstance(err, r.Error)
    assert (err.code, err.class_id, err.method_id) == (404, 50, 10)


def test_replies_come_in_request_order(h: Harness) -> None:
    """The supervisor answers a worker's requests in ring order."""
    h.send(W0, r.ExchangeDeclare(1, 1, "x", "direct", False, False, False, False, {}, False))
    h.send(W0, r.QueueDeclare(1, 1, "q", False, False, False, False, {}, False))
    h.send(W0, r.QueueBind(1, 1, "q", "x", "k", {}, False))
    assert [e.method for e in h.events(W0)] == ["xdecl", "qdecl", "qbind"]


def test_nowait_requests_get_no_reply(h: Harness) -> None:
    """nowait=true: the worker expects no -ok, so none is produced."""
    h.send(W0, r.QueueDeclare(1, 1, "q", False, False, False, False, {}, True))
    assert h.events(W0) == []
    assert "q" in h.d.vhost.queues


def test_browser_delivery_pins_the_body_until_the_worker_settles(h: Harness) -> None:
    """A browser does not acquire; its delivery still keeps the body alive
    until the worker has copied it, even if an acquiring consumer acks meanwhile."""
    h.declare("q")
    offset = h.publish("q")
    h.consume("q", cid=1, slot=1, browse=True)
    (seen,) = h.pull(1, 1).deliveries
    h.consume("q", cid=2, slot=2, ch=2)
    (taken,) = h.pull(2, 1).deliveries
    h.send(W1, r.Settle(1, 2, [taken.entry], r.ACK))
    assert h.freed == []
    h.send(W1, r.Settle(1, 1, [seen.entry], r.ACK))
    assert h.freed == [(W0, offset)]


def test_queue_deletion_cancels_its_consumers(h: Harness) -> None:
    """Deleting a queue tells each consumer's worker (consumer_cancel_notify)."""
    h.declare("q")
    h.consume("q", cid=4, slot=1)
    h.send(W0, r.QueueDelete(1, 1, "q", False, False, False))
    assert h.events(W1) == [r.Cancelled(4)]


def test_live_offsets_cover_queued_and_unacked_bodies(h: Harness) -> None:
    """The arena sweep after a worker death keeps every body still referenced."""
    h.declare("q")
    a = h.publish("q")
    b = h.publish("q")
    h.consume("q", cid=1, slot=1)
    h.pull(1, 1)
    assert h.d.live_offsets(W0) == {a, b}
    assert h.d.live_offsets(W1) == set()


def test_pull_for_a_cancelled_consumer_is_answered_empty(h: Harness) -> None:
    """A pull that crossed a cancel gets an empty answer, not a delivery."""
    h.declare("q")
    h.publish("q")
    h.consume("q", cid=1, slot=1)
    h.send(W1, r.Cancel(1, 1, 1, True))
    assert h.pull(1, 5) == r.Pulled(1, [], False)


@pytest.mark.parametrize("delivered_by", ["pull", "get"])
def test_deleting_a_queue_keeps_delivered_bodies_until_the_worker_settles(h: Harness, delivered_by: str) -> None:
    """queue.delete drops the ready messages at once, but a body already handed to a worker
    (basic.deliver or basic.get-ok still being written) stays until that worker acks or
    its channel goes: freeing it earlier let the arena reuse a block a worker was reading."""
    h.declare("q")
    delivered, ready = h.publish("q"), h.publish("q")
    if delivered_by == "pull":
        h.consume("q", cid=1, slot=1)
        (d,) = h.pull(1, 1).deliveries
        ack = r.Settle(1, 1, [d.entry], r.ACK)
    else:
        h.send(W1, r.Get(1, 1, "q", True))
        (got,) = h.events(W1)
        assert isinstance(got, r.GetOk)
        ack = r.Settle(1, 1, [got.delivery.entry], r.ACK)
    h.send(W0, r.QueueDelete(1, 2, "q", False, False, False))
    assert h.freed == [(W0, ready)]
    assert delivered in h.d.live_offsets(W0), "an arena sweep would free a body in use"
    h.send(W1, ack)
    assert h.freed == [(W0, ready), (W0, delivered)]
    assert h.d.live_offsets(W0) == set()


def test_requeue_into_a_deleted_queue_frees_the_body(h: Harness) -> None:
    """A delivered message of a deleted queue that its channel gives back (close, nack with
    requeue) has nowhere to go: its body is freed then, once."""
    h.declare("q")
    offset = h.publish("q")
    h.consume("q", cid=1, slot=1)
    assert len(h.pull(1, 1).deliveries) == 1
    h.send(W0, r.QueueDelete(1, 2, "q", False, False, False))
    assert h.freed == []
    h.send(W1, r.ChanClose(1, 1))
    assert h.freed == [(W0, offset)]


def test_body_handle_round_trips_at_the_limits_the_cli_allows() -> None:
    """256 workers, a content header up to frame_max (2**24), a body up to 512 MiB, any
    arena offset: one packed int holds them all."""
    for fields in [(0, 0, 0, 0), (255, (1 << 16) << 20, (1 << 24) - 1, 512 << 20), (1, 4096, 21, 128)]:
        assert unpack_body_ref(pack_body_ref(*fields)) == fields


def test_a_publish_without_properties_is_stored_as_a_plain_message(h: Harness) -> None:
    """S8: no headers, expiration or priority: a PlainMessage (five slots); any of them, or
    tracing: a Message. Both deliver from the same handle."""
    h.declare("q")
    plain_at = h.publish("q")
    h.send(W0, r.Publish(1, 1, "", "q", False, False, 9000, 30, 7, {"k": 1}))
    h.send(W0, r.Publish(1, 1, "", "q", False, False, 9500, 30, 7, None, "100"))
    plain, with_headers, with_expiration = h.d.vhost.queues["q"].available_entries()
    assert type(plain.message) is PlainMessage
    assert (plain.message.headers, plain.message.expiration, plain.message.priority) == (None, None, None)
    assert type(with_headers.message) is FullMessage and with_headers.message.headers == {"k": 1}
    assert type(with_expiration.message) is FullMessage and with_expiration.message.expiration == "100"
    h.consume("q", cid=1, slot=1)
    deliveries = h.pull(1, 3).deliveries
    assert [(d.region, d.offset, d.header_len, d.body_len) for d in deliveries] == [
        (W0, plain_at, 16, 100), (W0, 9000, 30, 7), (W0, 9500, 30, 7)]


def _run(offsets: list[int], rk: str = "q", *, exchange: str = "", mandatory: bool = False,
         confirm: bool = False) -> r.PublishRun:
    bodies = [field for offset in offsets for field in (offset, 16, 100)]
    return r.PublishRun(1, 1, exchange, rk, mandatory, confirm, bodies)


def test_a_run_of_publishes_is_applied_as_its_publishes_in_order(h: Harness) -> None:
    """PublishRun: each body queued in order, each confirmed, its consumer notified."""
    h.declare("q")
    h.consume("q", cid=1, slot=4)
    h.send(W0, _run([256, 512, 768], confirm=True))
    assert h.events(W0) == [r.Confirm(1, 1, True, 3)]
    assert h.woken(W1) == [4]
    pulled = h.pull(1, 10)
    assert [d.offset for d in pulled.deliveries] == [256, 512, 768]
    assert h.freed == []


def test_an_unroutable_run_is_returned_message_by_message_or_freed(h: Harness) -> None:
    h.send(W0, _run([256, 512], "nowhere", mandatory=True))
    returned = h.events(W0)
    assert [(e.code, e.offset) for e in returned] == [(312, 256), (312, 512)]
    assert h.freed == []
    h.send(W0, _run([768, 1024], "nowhere"))
    assert h.freed == [(W0, 768), (W0, 1024)]


def test_a_run_that_fails_frees_every_body_and_closes_the_channel_once(h: Harness) -> None:
    """The exchange is gone: 404 on basic.publish, once; no body of the run is left behind."""
    h.send(W0, _run([256, 512, 768], exchange="gone"))
    (err,) = h.events(W0)
    assert isinstance(err, r.Error) and (err.code, err.class_id, err.method_id) == (404, 60, 40)
    assert sorted(h.freed) == [(W0, 256), (W0, 512), (W0, 768)]


class _AnyTrace:
    """A trace whose every hook does nothing (the dispatcher only calls them)."""

    def __getattr__(self, name: str) -> object:
        return lambda *args, **kwargs: None


def test_a_traced_run_numbers_each_message_as_its_own_publish(h: Harness) -> None:
    """While tracing, each message of a run carries the trace key a Publish record of its own
    would have (the rows join on it); bodies, order and credit are the same."""
    h.d.trace = _AnyTrace()  # type: ignore[assignment]
    h.declare("q")
    h.send(W0, _run([256, 512, 768]))
    messages = [entry.message for entry in h.d.vhost.queues["q"].available_entries()]
    assert [m.trace[2] for m in messages] == [1, 2, 3]
    assert [unpack_body_ref(m.body_ref)[1] for m in messages] == [256, 512, 768]
    assert h.d._credit.due == {(W0, 1): 3}


def test_a_run_counts_publish_credit_for_each_message_even_when_it_fails(h: Harness) -> None:
    h.declare("q")
    h.send(W0, _run([256, 512]))
    h.send(W0, _run([768, 1024, 1280], exchange="gone"))
    assert h.d._credit.due == {(W0, 1): 5}


def test_a_traced_run_that_fails_frees_every_body_and_counts_each_credit(h: Harness) -> None:
    h.d.trace = _AnyTrace()  # type: ignore[assignment]
    h.send(W0, _run([256, 512, 768], exchange="gone"))
    (err,) = h.events(W0)
    assert isinstance(err, r.Error) and err.code == 404
    assert sorted(h.freed) == [(W0, 256), (W0, 512), (W0, 768)]
    assert h.d._credit.due == {(W0, 1): 3}
