"""Message statistics (broker.queues.message_counts): what the dispatcher counts per queue, per
exchange and for the broker, and what the ``snapshot`` control command hands over."""

from __future__ import annotations

import trio

from broker.queues.message_counts import MESSAGE_FIELDS, QUEUE_FIELDS
from broker.runtime.snapshot import build_snapshot
from ipc import records as r
from tests.broker.dispatch_harness import W0, W1, Harness


def counts(h: Harness) -> dict[str, int]:
    return h.d.answers.counts.as_dict()


def queue_counts(h: Harness, name: str) -> dict[str, int]:
    return dict(zip(QUEUE_FIELDS, h.d.vhost.queues[name].counts.row(), strict=True))


def test_deliveries_gets_redeliveries_and_acks_are_counted_per_queue_and_for_the_broker() -> None:
    h = Harness()
    h.declare("q")
    for _ in range(5):
        h.publish("q")
    h.consume("q", cid=1, slot=1)
    first = h.pull(1, 2).deliveries
    assert len(first) == 2
    h.send(W1, r.Settle(1, 1, [first[0].entry], r.ACK))
    h.send(W1, r.Settle(1, 1, [first[1].entry], r.REQUEUE))  # back, redelivered
    again = h.pull(1, 1).deliveries
    assert again[0].redelivered
    h.send(W1, r.Settle(1, 1, [again[0].entry], r.ACK))
    h.events(W1)
    h.send(W0, r.Get(1, 1, "q", True))  # no-ack get: its own settle is AUTO_ACK
    (ok,) = h.events(W0)
    assert isinstance(ok, r.GetOk)
    h.send(W0, r.Settle(1, 1, [ok.delivery.entry], r.AUTO_ACK))
    h.send(W0, r.Get(1, 1, "q", False))
    (ok,) = h.events(W0)
    assert isinstance(ok, r.GetOk)
    q = queue_counts(h, "q")
    assert q == {"deliver": 3, "deliver_no_ack": 0, "get": 1, "get_no_ack": 1, "redeliver": 1,
                 "ack": 2, "get_empty": 0}
    g = counts(h)
    assert {k: g[k] for k in QUEUE_FIELDS} == q
    assert g["publish"] == 5 and g["routed"] == 5


def test_no_ack_consumers_deliveries_are_not_acks_and_a_deleted_queue_leaves_the_totals() -> None:
    h = Harness()
    h.declare("q")
    for _ in range(3):
        h.publish("q")
    h.send(W1, r.Consume(1, 1, 1, 1, "q", "c1", True, False, 0, False, True, False))
    h.events(W1)
    delivered = h.pull(1, 10).deliveries
    h.send(W1, r.Settle(1, 1, [d.entry for d in delivered], r.AUTO_ACK))
    h.send(W0, r.Get(1, 1, "q", False))  # nothing left
    assert queue_counts(h, "q")["deliver_no_ack"] == 3
    assert queue_counts(h, "q")["ack"] == 0 and queue_counts(h, "q")["get_empty"] == 1
    h.send(W0, r.QueueDelete(1, 1, "q", False, False, False))
    g = counts(h)
    assert g["deliver_no_ack"] == 3 and g["ack"] == 0 and g["get_empty"] == 1


def test_unroutable_returned_dropped_routed_and_confirms() -> None:
    h = Harness()
    h.declare("a")
    h.declare("b")
    for q in ("a", "b"):
        h.send(W0, r.QueueBind(1, 1, q, "amq.fanout", "", {}, False))
    h.events(W0)
    h.publish("", exchange="amq.fanout", confirm=True)  # two copies, one confirm
    h.publish("nowhere", mandatory=True)  # returned
    h.publish("nowhere")  # dropped
    g = counts(h)
    assert (g["publish"], g["publish_confirm"], g["routed"], g["confirm"]) == (3, 1, 2, 1)
    assert (g["return_unroutable"], g["drop_unroutable"]) == (1, 1)
    fanout = h.d.vhost.exchanges["amq.fanout"]
    default = h.d.vhost.exchanges[""]
    assert (fanout.publish_in, fanout.publish_out) == (1, 2)
    assert (default.publish_in, default.publish_out) == (2, 0)


def test_the_snapshot_hands_the_counters_over() -> None:
    h = Harness()
    h.declare("q")
    h.publish("q")
    h.consume("q", cid=1, slot=1)
    h.pull(1, 1)

    async def checkpoint() -> None:
        await trio.lowlevel.checkpoint()

    snap = trio.run(build_snapshot, h.d, checkpoint)
    (row,) = snap["queues"]
    assert row[0] == "q" and row[8] == 1  # entered
    assert dict(zip(QUEUE_FIELDS, row[9:-1], strict=True))["deliver"] == 1  # row[-1]: its vhost
    assert set(snap["messages"]) == set(MESSAGE_FIELDS)
    assert snap["messages"]["deliver"] == 1 and snap["messages"]["publish"] == 1
    default = next(x for x in snap["exchanges"] if x[0] == "")
    assert default[6:8] == [1, 1]  # default[8]: its vhost
