"""Resource alarms (broker.runtime.alarms): the disk alarm blocks every worker, the memory alarm its own
worker, the queued-messages alarm (the supervisor's memory) every worker, and each worker hears
only about changes of its blocked state."""

from __future__ import annotations

from broker.runtime.alarms import Alarms
from broker.runtime.dispatch import QUEUED_CHECK_INTERVAL, Dispatcher
from ipc import records as r


def told(outbox: list[list[r.Event]]) -> list[list[r.Event]]:
    out = [list(events) for events in outbox]
    for events in outbox:
        events.clear()
    return out


def test_the_disk_alarm_blocks_every_worker_low_on_disk_and_clears() -> None:
    alarms, outbox = Alarms(3), [[], [], []]
    alarms.set_disk(True, outbox)
    assert told(outbox) == [[r.Blocked(True, "low on disk")]] * 3
    alarms.set_disk(True, outbox)  # no change: nothing said again
    assert told(outbox) == [[], [], []]
    alarms.set_disk(False, outbox)
    assert told(outbox) == [[r.Blocked(False)]] * 3


def test_a_worker_under_both_alarms_stays_blocked_until_both_clear() -> None:
    alarms, outbox = Alarms(2), [[], []]
    alarms.high_watermark, alarms.low_watermark = 100, 50
    alarms.region_bytes[0] = 120
    alarms.check_memory(outbox)
    assert told(outbox) == [[r.Blocked(True, "low on memory")], []]
    alarms.set_disk(True, outbox)  # worker 0 is blocked already: only worker 1 hears of it
    assert told(outbox) == [[], [r.Blocked(True, "low on disk")]]
    alarms.region_bytes[0] = 10
    alarms.check_memory(outbox)  # memory clears, the disk alarm still holds worker 0
    assert told(outbox) == [[], []]
    alarms.set_disk(False, outbox)
    assert told(outbox) == [[r.Blocked(False)], [r.Blocked(False)]]


def test_the_queued_messages_alarm_blocks_every_worker_with_hysteresis() -> None:
    """The supervisor's own memory: messages queued in all queues past the high mark block every
    worker (low on memory), and only falling below the low mark unblocks them."""
    alarms, outbox = Alarms(2), [[], []]
    alarms.queued_high, alarms.queued_low = 1000, 900
    alarms.check_queued(999, outbox)
    assert told(outbox) == [[], []]
    alarms.check_queued(1000, outbox)
    assert told(outbox) == [[r.Blocked(True, "low on memory")]] * 2
    alarms.check_queued(950, outbox)  # between the marks: still blocked, nothing said
    assert told(outbox) == [[], []] and alarms.queued_full
    alarms.check_queued(899, outbox)
    assert told(outbox) == [[r.Blocked(False)]] * 2


def test_the_dispatcher_counts_every_queues_copies_for_the_queued_alarm() -> None:
    """A fanout's copies each count; the count is taken at most every QUEUED_CHECK_INTERVAL of
    the runtime's clock, after a batch or on the timer's tick."""
    d = Dispatcher(1, lambda region, offset: None)
    d.alarms.queued_high, d.alarms.queued_low = 30, 20
    d.begin_batch(1.0)
    d.handle(0, r.ExchangeDeclare(1, 1, "fx", "fanout", False, False, False, False, {}, False))
    for i in range(10):
        d.handle(0, r.QueueDeclare(1, 1, f"q{i}", False, False, False, False, {}, False))
        d.handle(0, r.QueueBind(1, 1, f"q{i}", "fx", "", {}, False))
    for n in range(3):
        d.handle(0, r.Publish(1, 1, "fx", "", False, False, 256 * (n + 1), 16, 100, None))
    d.outbox[0].clear()
    d.flow_tick()
    assert d.queued_messages() == 30
    assert [e for e in d.outbox[0] if isinstance(e, r.Blocked)] == [r.Blocked(True, "low on memory")]
    d.outbox[0].clear()
    for i in range(5):
        d.handle(0, r.QueuePurge(1, 1, f"q{i}", False))
    d.outbox[0].clear()
    d.flow_tick()  # the same instant: not counted again yet
    assert not [e for e in d.outbox[0] if isinstance(e, r.Blocked)]
    d.begin_batch(1.0 + QUEUED_CHECK_INTERVAL)
    d.flow_tick()
    assert [e for e in d.outbox[0] if isinstance(e, r.Blocked)] == [r.Blocked(False)]


def test_unsettled_deliveries_count_for_the_queued_alarm() -> None:
    """A consumer without prefetch that never acks takes every message out of its queue: what it
    holds still counts."""
    d = Dispatcher(2, lambda region, offset: None)
    d.begin_batch(1.0)
    d.handle(0, r.QueueDeclare(1, 1, "q", False, False, False, False, {}, False))
    for n in range(5):
        d.handle(0, r.Publish(1, 1, "", "q", False, False, 256 * (n + 1), 16, 100, None))
    d.handle(1, r.Consume(7, 1, 1, 3, "q", "c", False, False, 0, False, True, False))
    d.handle(1, r.Pull(1, 10))
    assert d.vhost.queues["q"].message_count == 0
    assert d.queued_messages() == 5



def test_the_queued_count_goes_a_slice_of_queues_and_channels_per_step() -> None:
    """10 queues of 3 messages each, 2 of them held by a channel: counting 4 queues or channels a
    step, the alarm (at 30) is raised by the third step's count (11 counted), not before; the
    timer is due at once while a count is under way, and the next one starts an interval later."""
    d = Dispatcher(2, lambda region, offset: None)
    d.alarms.queued_high, d.alarms.queued_low = 30, 20
    d.queued_count_slice = 4
    d.begin_batch(1.0)
    for i in range(10):
        d.handle(0, r.QueueDeclare(1, 1, f"q{i}", False, False, False, False, {}, False))
        for n in range(3):
            d.handle(0, r.Publish(1, 1, "", f"q{i}", False, False, 256 * (10 * i + n + 1), 16,
                                  100, None))
    d.handle(1, r.Consume(7, 1, 1, 3, "q0", "c", False, False, 0, False, True, False))
    d.handle(1, r.Pull(1, 2))
    d._queued_checked = float("-inf")  # the batch's flow_ticks counted already: afresh
    d._queued_count = None
    d.outbox[0].clear()
    blocked = []
    for step in range(3):
        d.begin_batch(2.0 + step * 1e-6)
        d.flow_tick()
        blocked.append(bool([e for e in d.outbox[0] if isinstance(e, r.Blocked)]))
        if step < 2:
            assert d.next_deadline() == d.vhost.now, "a count under way: the timer at once"
    assert blocked == [False, False, True]
    assert d.queued_messages() == 30
    assert (d.next_deadline() or float("inf")) > d.vhost.now
    d.begin_batch(2.0 + QUEUED_CHECK_INTERVAL / 2)
    d.flow_tick()
    assert d._queued_count is None, "a new count within the interval"
