"""The disk alarm's free-space checks come as RabbitMQ's rabbit_disk_monitor spaces them:
twice the time the room above the limit takes to fill at 250 MB/s, within 0.1 s and 10 s;
every second under the alarm (publishers resume soon after space comes back)."""

from __future__ import annotations

import pytest

from broker.runtime.durability import disk_check_interval

MB = 1_000_000


@pytest.mark.parametrize(("free", "limit", "seconds"), [
    (80_000 * MB, 50 * MB, 10.0),  # gigabytes to spare: the longest interval
    (50 * MB + 1_250 * MB, 50 * MB, 10.0),  # 2 x 1,250 MB / 250 MB/s = 10 s
    (50 * MB + 250 * MB, 50 * MB, 2.0),  # 2 x 250 MB / 250 MB/s
    (50 * MB + 5 * MB, 50 * MB, 0.1),  # 0.04 s: no shorter than 0.1 s
    (50 * MB, 50 * MB, 0.1),  # at the limit
])
def test_the_check_comes_sooner_as_free_space_nears_the_limit(free: int, limit: int, seconds: float) -> None:
    assert disk_check_interval(free, limit, alarmed=False) == pytest.approx(seconds)


def test_under_the_alarm_the_check_comes_every_second() -> None:
    assert disk_check_interval(10 * MB, 50 * MB, alarmed=True) == 1.0
