"""Resource alarms (broker.alarms): the disk alarm blocks every worker, the memory alarm its own
worker, and each worker hears only about changes of its blocked state."""

from __future__ import annotations

from broker.alarms import Alarms
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
