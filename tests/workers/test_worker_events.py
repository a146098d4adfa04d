"""Worker.handle_events on a real region: an event the worker fails to apply costs its own
connection (541 INTERNAL_ERROR), never the worker or the other connections."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from broker import errors
from broker.errors import AMQPError
from ipc import records as r
from tests.workers.helpers import worker_region
from workers.worker import SETTLE_MAX, Worker

INTERNAL_ERROR = errors.InternalError.reply_code


class StubHandler:
    """Records what the worker asks of a handler."""

    def __init__(self, conn_id: int, *, broken: bool = False) -> None:
        self.conn_id = conn_id
        self.broken = broken
        self.finished = False
        self.events: list[Any] = []
        self.failures: list[AMQPError] = []
        self.confirms_pending: set[Any] = set()

    def on_event(self, event: Any) -> None:
        if self.broken:
            raise ValueError("no 19-byte body at 20384")  # what a bad arena handle raises
        self.events.append(event)

    def fail(self, exc: AMQPError, ch: Any = None) -> None:
        self.failures.append(exc)


@pytest.fixture
def worker() -> Iterator[Worker]:
    with worker_region() as (config, region):
        yield Worker(config, region)


def _send(worker: Worker, *events: Any) -> None:
    for event in events:
        worker.region.event_ring.put_nowait(worker.codec.encode(event))


def test_an_event_that_fails_closes_only_its_connection(worker: Worker) -> None:
    healthy, broken = StubHandler(1), StubHandler(2, broken=True)
    worker.handlers.update({1: healthy, 2: broken})
    _send(worker, r.Reply(2, 1, "qos"), r.Reply(1, 1, "qos"), r.Reply(1, 2, "qos"))

    assert worker.handle_events() == 3

    assert [e.ch for e in healthy.events] == [1, 2], "events after the failure were not applied"
    assert not healthy.failures
    assert [(f.reply_code, f.hard) for f in broken.failures] == [(INTERNAL_ERROR, True)]
    assert broken in worker.dirty  # its writer is woken to send connection.close


def test_a_failing_event_for_a_finished_connection_is_only_logged(worker: Worker) -> None:
    gone = StubHandler(3, broken=True)
    gone.finished = True
    worker.handlers[3] = gone
    _send(worker, r.Reply(3, 1, "qos"))
    assert worker.handle_events() == 1
    assert not gone.failures


def _requests(worker: Worker) -> list[Any]:
    worker.seal_requests()  # the record being joined, too
    return [worker.codec.decode_request(raw) for raw in worker.outbox]


def test_consecutive_settles_of_a_channel_join_into_one_record(worker: Worker) -> None:
    """Acks of one read become one Settle per channel and action, without reordering."""
    worker.send(r.Settle(1, 1, [10], r.ACK))
    worker.send(r.Settle(1, 1, [11], r.ACK))
    worker.send(r.Settle(1, 2, [12], r.ACK))  # another channel: a record of its own
    worker.send(r.Settle(1, 2, [13], r.REQUEUE))  # another action too
    worker.send(r.Pull(5, 1))
    worker.send(r.Settle(1, 2, [14], r.REQUEUE))  # after the Pull: must stay after it
    assert _requests(worker) == [
        r.Settle(1, 1, [10, 11], r.ACK), r.Settle(1, 2, [12], r.ACK),
        r.Settle(1, 2, [13], r.REQUEUE), r.Pull(5, 1), r.Settle(1, 2, [14], r.REQUEUE)]


def test_a_settle_being_joined_is_encoded_once_with_every_entry(worker: Worker) -> None:
    """The joined Settle waits, unencoded, until another record or the flush: a burst of n acks
    is one encoding, not n of a growing record."""
    encoded: list[Any] = []
    encode = worker._encode
    worker._encode = lambda rec: encoded.append(rec) or encode(rec)  # type: ignore[method-assign]
    for entry in range(10, 60):
        worker.send(r.Settle(1, 1, [entry], r.ACK))
    assert worker.has_requests and not worker.outbox and not encoded
    assert worker.flush_requests()
    assert [type(rec) for rec in encoded] == [r.Settle]
    assert [worker.codec.decode_request(raw) for raw in worker.region.request_ring.get_all_nowait()
            ] == [r.Settle(1, 1, list(range(10, 60)), r.ACK)]


def test_a_settle_already_on_the_ring_is_not_joined(worker: Worker) -> None:
    worker.send(r.Settle(1, 1, [10], r.ACK))
    assert worker.flush_requests()
    worker.send(r.Settle(1, 1, [11], r.ACK))
    assert _requests(worker) == [r.Settle(1, 1, [11], r.ACK)]
    assert [worker.codec.decode_request(raw) for raw in worker.region.request_ring.get_all_nowait()
            ] == [r.Settle(1, 1, [10], r.ACK)]


def test_a_settle_of_more_than_settle_max_entries_goes_as_several_records_in_order(
        worker: Worker) -> None:
    """One basic.ack with multiple=true over a channel without prefetch can settle a million
    deliveries: as one record it would outgrow the request ring (never written; the worker
    failed) and hold the supervisor for seconds. It goes as records of SETTLE_MAX entries,
    in order, before what follows it."""
    entries = list(range(1, 2 * SETTLE_MAX + 100))
    worker.send(r.Settle(1, 1, entries, r.ACK))
    worker.send(r.Pull(5, 1))
    requests = _requests(worker)
    assert [type(rec) for rec in requests] == [r.Settle, r.Settle, r.Settle, r.Pull]
    assert [len(rec.entries) for rec in requests[:3]] == [SETTLE_MAX, SETTLE_MAX, 99]
    assert [e for rec in requests[:3] for e in rec.entries] == entries


def test_settles_stop_joining_at_settle_max_entries(worker: Worker) -> None:
    """A burst of acks joins one record only up to SETTLE_MAX entries; the next starts another."""
    for entry in range(SETTLE_MAX + 5):
        worker.send(r.Settle(1, 1, [entry], r.ACK))
    requests = _requests(worker)
    assert [len(rec.entries) for rec in requests] == [SETTLE_MAX, 5]
    assert [e for rec in requests for e in rec.entries] == list(range(SETTLE_MAX + 5))


def test_the_largest_settle_record_fits_the_smallest_ring(worker: Worker) -> None:
    """SETTLE_MAX entry ids of the largest size msgpack gives them fit a ring of the smallest
    size `shoal serve --ring-kb` allows (64 KiB)."""
    biggest = worker.codec.encode(r.Settle(2**31, 2**31, [2**63 - 1] * SETTLE_MAX, r.REQUEUE))
    assert len(biggest) < 64 * 1024 - 16


def _supervisor_sleeps(worker: Worker) -> None:
    worker.region.supervisor_sleeping.set_sleeping()


def test_acks_alone_do_not_wake_a_sleeping_supervisor_but_ask_for_a_late_wake(worker: Worker) -> None:
    """LAZY_SETTLE_DELAY: acks ride with the next record that wakes the supervisor; until then
    the server's timer is asked for once, and it wakes the supervisor if nothing did."""
    late: list[bool] = []
    worker.want_lazy_wake = lambda: late.append(True)
    _supervisor_sleeps(worker)
    worker.send(r.Settle(1, 1, [10], r.ACK))
    assert worker.flush_requests()
    assert worker.request_efd.drain() == 0, "an ack alone woke the supervisor"
    assert worker.region.supervisor_sleeping.is_sleeping()
    assert worker.lazy_pending and late == [True]
    worker.send(r.Settle(1, 1, [11], r.ACK))
    assert worker.flush_requests()
    assert late == [True], "one timer covers every ack until the supervisor is woken"
    worker.wake_supervisor()  # the timer fires
    assert worker.request_efd.drain() == 1
    assert not worker.lazy_pending
    assert len(worker.region.request_ring.get_all_nowait()) == 2  # both acks were written


@pytest.mark.parametrize("urgent", [r.Settle(1, 1, [10], r.REQUEUE), r.Settle(1, 1, [10], r.DROP),
                                    r.Pull(5, 1)], ids=["requeue", "reject", "pull"])
def test_a_requeue_or_any_other_request_wakes_the_supervisor_and_carries_the_acks(
        worker: Worker, urgent: Any) -> None:
    worker.want_lazy_wake = lambda: None
    _supervisor_sleeps(worker)
    worker.send(r.Settle(1, 2, [9], r.ACK))
    assert worker.flush_requests()
    assert worker.lazy_pending
    _supervisor_sleeps(worker)
    worker.send(urgent)
    assert worker.flush_requests()
    assert worker.request_efd.drain() == 1
    assert not worker.lazy_pending
    assert [worker.codec.decode_request(raw) for raw in worker.region.request_ring.get_all_nowait()
            ] == [r.Settle(1, 2, [9], r.ACK), urgent]


class ViewingHandler:
    """A connection whose unwritten output views the blocks of ``held`` deliveries; records
    each seal_held."""

    def __init__(self, worker: Worker, conn: int, held: set[int], sticky: bool = False) -> None:
        self.worker = worker
        self.held = set(held)
        self.sticky = sticky
        self.sealed = 0
        worker.handlers[conn] = self  # type: ignore[assignment]

    @property
    def holds_views(self) -> bool:
        return bool(self.held)

    def views(self, entries: list[int]) -> bool:
        return any(e in self.held for e in entries)

    def seal_held(self) -> None:
        self.sealed += 1
        self.held.clear()

    def wake_writer(self) -> None:
        if self.sticky:  # more output each time: still dirty after after_batch's rounds
            self.worker.dirty.add(self)  # type: ignore[arg-type]


def test_a_settle_naming_a_delivery_still_viewed_seals_the_output_first(worker: Worker) -> None:
    """An ack of a delivery whose body our output still views (the client acked what it has
    not read all of) lets the supervisor free the block: the views are copied before the
    Settle is sent; an ack of what was written copies nothing."""
    handler = ViewingHandler(worker, 1, {7, 8})
    other = ViewingHandler(worker, 2, {5})
    worker.send(r.Settle(1, 1, [3, 4], r.ACK))
    assert handler.sealed == 0
    worker.send(r.Settle(2, 1, [7], r.ACK))  # another connection's entry 7: not ours
    assert handler.sealed == 0 and other.sealed == 0
    worker.send(r.Settle(1, 1, [6, 8], r.REQUEUE))
    assert handler.sealed == 1 and not handler.held and other.sealed == 0
    worker.flush_requests()
    assert [rec.entries for rec in _ring(worker)] == [[3, 4], [7], [6, 8]]


@pytest.mark.parametrize("closing", [r.ChanClose(1, 1), r.ConnClose(1)])
def test_a_closing_channel_or_connection_seals_its_views(worker: Worker, closing: Any) -> None:
    """The supervisor requeues what a closing channel or connection held, and another consumer
    may settle it: nothing of the connection's output may view those blocks by then."""
    handler = ViewingHandler(worker, 1, {7})
    bystander = ViewingHandler(worker, 2, {9})
    worker.send(closing)
    assert handler.sealed == 1 and bystander.sealed == 0


def test_output_left_dirty_after_a_batch_keeps_its_views(worker: Worker) -> None:
    """A handler still dirty after after_batch's rounds is not copied: its views are held
    (and sealed only when a record that may free a block goes)."""
    sticky = ViewingHandler(worker, 1, {7}, sticky=True)
    worker.dirty.add(sticky)  # type: ignore[arg-type]
    worker.after_batch()
    worker.send(r.Settle(1, 1, [5], r.ACK))
    worker.flush_requests()
    assert sticky.sealed == 0 and sticky.held == {7}


def _publish(routing_key: str = "q", offset: int = 0, *, ch: int = 1, **fields: Any) -> r.Publish:
    record = r.Publish(1, ch, "", routing_key, False, False, offset, 16, 128, None)
    return msgspec.structs.replace(record, **fields) if fields else record


def _ring(worker: Worker) -> list[Any]:
    return [worker.codec.decode_request(raw) for raw in worker.region.request_ring.get_all_nowait()]


def test_publishes_alike_but_for_their_bodies_join_into_one_run(worker: Worker) -> None:
    """One channel publishing to one queue: one PublishRun for the run, bodies in order."""
    for offset in (256, 512, 768):
        worker.send(_publish(offset=offset))
    assert worker.has_requests and not worker.outbox  # joined until something else is sent
    assert worker.flush_requests()
    assert _ring(worker) == [r.PublishRun(1, 1, "", "q", False, False,
                                          [256, 16, 128, 512, 16, 128, 768, 16, 128])]


def test_a_run_ends_where_a_publish_differs_or_another_record_comes(worker: Worker) -> None:
    """What the supervisor must see separately stays separate, and nothing changes order; a
    run of one is the Publish it was."""
    worker.send(_publish(offset=1))
    worker.send(_publish(offset=2))
    worker.send(_publish("other", offset=3))  # another routing key
    worker.send(_publish("other", offset=4, ch=2))  # another channel
    worker.send(_publish("other", offset=5, ch=2, mandatory=True))
    worker.send(_publish("other", offset=6, ch=2, mandatory=True, confirm=True))
    worker.send(_publish("other", offset=7, ch=2, mandatory=True, confirm=True,
                         headers={"h": 1}))  # headers: the supervisor reads them
    worker.send(_publish("other", offset=8, ch=2, mandatory=True, confirm=True))
    worker.send(r.Settle(1, 2, [9], r.ACK))
    worker.send(_publish("other", offset=10, ch=2, mandatory=True, confirm=True))
    worker.send(_publish("other", offset=11, ch=2, mandatory=True, confirm=True,
                         body_at=(0, 0, 144)))  # persistent
    worker.send(_publish("other", offset=12, ch=2, mandatory=True, confirm=True,
                         expiration="5"))
    worker.send(_publish("other", offset=13, ch=2, mandatory=True, confirm=True, priority=1))
    worker.send(_publish("other", offset=14, ch=2, mandatory=True, confirm=True))
    worker.send(_publish("other", offset=15, ch=2, mandatory=True, confirm=True))
    assert worker.flush_requests()
    got = _ring(worker)
    assert [type(rec).__name__ for rec in got] == [
        "PublishRun", "Publish", "Publish", "Publish", "Publish", "Publish", "Publish", "Settle",
        "Publish", "Publish", "Publish", "Publish", "PublishRun"]
    assert got[0].bodies == [1, 16, 128, 2, 16, 128]
    assert [rec.offset for rec in got[1:7]] == [3, 4, 5, 6, 7, 8]
    assert got[-1].bodies == [14, 16, 128, 15, 16, 128]


def test_no_run_while_tracing(worker: Worker) -> None:
    """Trace rows join the supervisor's to the worker's by counting Publish records."""
    worker.trace = object()  # type: ignore[assignment]
    worker.send(_publish(offset=1))
    worker.send(_publish(offset=2))
    worker.trace = None
    assert worker.flush_requests()
    assert [type(rec) for rec in _ring(worker)] == [r.Publish, r.Publish]


def test_a_run_being_joined_asks_for_a_flush(worker: Worker) -> None:
    flushes: list[bool] = []
    worker.want_flush = lambda: flushes.append(True)
    worker.send(_publish(offset=1))
    worker.after_batch()
    assert flushes == [True]
