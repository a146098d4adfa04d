"""workers.login_log: refused logins per address, the first few a minute in full, then one
summary line per address per minute, the addresses an LRU of bounded size."""

from __future__ import annotations

from workers.login_log import LoginFailureLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def new_log(**kwargs: int) -> tuple[LoginFailureLog, Clock]:
    clock = Clock()
    return LoginFailureLog(clock=clock, **kwargs), clock


def test_the_first_five_a_minute_are_told_in_full_then_one_summary() -> None:
    log, clock = new_log()
    told = [log.failure("10.0.0.2") for _ in range(12)]
    assert told == [True] * 5 + [False] * 7
    assert log.summaries() == []  # the minute is not over
    clock.now += 59.9
    assert log.summaries() == []
    clock.now += 0.1
    assert log.summaries() == ["7 more login failures from 10.0.0.2 in the last minute"]
    assert log.summaries() == []  # once
    assert len(log) == 0  # the address is forgotten with its window


def test_a_window_without_suppressed_refusals_owes_no_line() -> None:
    log, clock = new_log()
    assert all(log.failure("10.0.0.2") for _ in range(5))
    clock.now += 61
    assert log.summaries() == []
    assert len(log) == 0


def test_one_refusal_over_is_singular() -> None:
    log, clock = new_log()
    for _ in range(6):
        log.failure("::1")
    clock.now += 60
    assert log.summaries() == ["1 more login failure from ::1 in the last minute"]


def test_addresses_are_counted_apart() -> None:
    log, clock = new_log(burst=2)
    assert [log.failure("a") for _ in range(3)] == [True, True, False]
    assert [log.failure("b") for _ in range(2)] == [True, True]
    clock.now += 60
    assert log.summaries() == ["1 more login failure from a in the last minute"]


def test_a_new_minute_starts_in_full_again_and_owes_the_last_ones_summary() -> None:
    """A refusal after the window ended opens a new one; the old one's line is owed at once."""
    log, clock = new_log(burst=1)
    assert [log.failure("a") for _ in range(3)] == [True, False, False]
    clock.now += 60
    assert log.failure("a")
    assert log.summaries() == ["2 more login failures from a in the last minute"]
    assert not log.failure("a")
    clock.now += 30
    assert log.summaries() == []  # the new window has half a minute to go
    clock.now += 30
    assert log.summaries() == ["1 more login failure from a in the last minute"]


def test_memory_is_bounded_and_an_evicted_address_has_its_count_told() -> None:
    log, clock = new_log(burst=1, max_addresses=3)
    log.failure("a")
    log.failure("a")  # one suppressed
    for address in ("b", "c", "a", "d"):  # "a" refused again: most recent; "b" goes first
        log.failure(address)
    assert len(log) == 3
    assert log.summaries() == []  # "b" had nothing suppressed
    for address in ("e", "f"):
        log.failure(address)
    assert len(log) == 3
    assert log.summaries() == ["2 more login failures from a in the last minute"]
    for n in range(10_000):
        log.failure(f"10.{n // 256}.{n % 256}.1")
    assert len(log) == 3
    clock.now += 60
    assert log.summaries() == []
    assert len(log) == 0
