"""Damage to the data directory between two runs of `shoal serve --data-dir DIR`: the newest
and an older index file and a body segment, truncated or with bytes flipped in their head,
middle or tail. The broker starts, keeps every intact record, reports at ERROR what was lost,
sets aside (never deletes) what it cannot account for, and never delivers an acked message
without `redelivered`."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pika
import pytest

from tests.integration.harness import Broker, finish, start_broker
from tests.integration.pika_helpers import drain_with_get

PERSISTENT = pika.BasicProperties(delivery_mode=2)
FIRST, SECOND = 300, 100  # messages published in the first run, and in the second
ACKED_FIRST, ACKED_SECOND = 100, 50  # acked in the first run (0..99), in the second (100..149)


def data_args(tmp_path: Path) -> list[str]:
    return ["--data-dir", str(tmp_path / "data")]


def publish(channel: pika.adapters.blocking_connection.BlockingChannel, numbers: range) -> None:
    for i in numbers:
        channel.basic_publish("", "jobs", b"%05d" % i, PERSISTENT)


def ack(channel: pika.adapters.blocking_connection.BlockingChannel, count: int) -> None:
    for _ in range(count):
        method, _props, _body = channel.basic_get("jobs")
        channel.basic_ack(method.delivery_tag)


def two_runs(tmp_path: Path) -> Path:
    """Run 1 publishes 0..299 and acks 0..99; run 2 acks 100..149 and publishes 300..399; both
    stop cleanly. Index file 0 (older) holds run 1's records, file 1 (newest) run 2's; the
    body segment of run 1 is returned."""
    first = start_broker(tmp_path / "first", extra_args=data_args(tmp_path))
    try:
        channel = first.connect().channel()
        channel.confirm_delivery()
        channel.queue_declare("jobs", durable=True)
        publish(channel, range(FIRST))
        ack(channel, ACKED_FIRST)
    finally:
        finish(first)
    (segment,) = [p for p in (tmp_path / "data" / "bodies").rglob("*.seg") if p.stat().st_size > 8]
    second = start_broker(tmp_path / "second", extra_args=data_args(tmp_path))
    try:
        channel = second.connect().channel()
        channel.confirm_delivery()
        ack(channel, ACKED_SECOND)
        publish(channel, range(FIRST, FIRST + SECOND))
    finally:
        finish(second)
    return segment


def damage(path: Path, how: str, rng: random.Random | None = None) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[:len(data) * 2 // 3]))
        return
    at = {"head": 10, "middle": len(data) // 2, "tail": len(data) - 6}.get(how)
    if at is None:
        assert rng is not None
        at = rng.randrange(0, len(data) - 4)
    for i in range(at, at + 4):
        data[i] ^= 0xA5
    path.write_bytes(bytes(data))


def files_under(root: Path) -> set[str]:
    return {p.name for p in root.rglob("*") if p.is_file() and p.suffix in (".idx", ".seg")}


def drain(channel: pika.adapters.blocking_connection.BlockingChannel) -> list[tuple[bytes, bool]]:
    """Every message the queue holds: a basic.get whose body cannot be read back answers
    get-empty (the message is lost), so get until the queue says it is empty."""
    got: list[tuple[bytes, bool]] = []
    for _ in range(FIRST + SECOND):
        got += drain_with_get(channel, "jobs", 100_000)
        if channel.queue_declare("jobs", durable=True, passive=True).method.message_count == 0:
            return got
    raise AssertionError("the queue never emptied")


def ints(pattern: str, log: str) -> list[int]:
    return [int(n) for n in re.findall(pattern, log)]


def check_restart(tmp_path: Path, target: str, how: str, rng: random.Random | None = None) -> None:
    segment = two_runs(tmp_path)
    data = tmp_path / "data"
    index = sorted((data / "index").glob("*.idx"))
    assert len(index) == 2, index
    path = {"older": index[0], "newest": index[1], "body": segment}[target]
    damage(path, how, rng)
    before = files_under(data)
    third: Broker = start_broker(tmp_path / "third", extra_args=data_args(tmp_path))
    try:
        kept = files_under(data)  # the data directory, quarantine included, before any drain
        assert before <= kept, f"deleted at start: {sorted(before - kept)}"
        got = drain(third.connect().channel())
        log = third.log_path.read_text(errors="replace")
    finally:
        finish(third)
    numbers = [int(body) for body, _ in got]
    assert len(numbers) == len(set(numbers)), "a message came back twice"
    assert numbers == sorted(numbers), "not in publish order"
    assert set(numbers) <= set(range(FIRST + SECOND))
    acked = set(range(ACKED_FIRST + ACKED_SECOND))
    back_unflagged = [n for n, (_, redelivered) in zip(numbers, got, strict=True)
                      if n in acked and not redelivered]
    assert not back_unflagged, f"acked messages delivered without redelivered: {back_unflagged}"
    missing = set(range(ACKED_FIRST + ACKED_SECOND, FIRST + SECOND)) - set(numbers)
    if target == "body":
        reported = (sum(ints(r"ERROR index: (\d+) confirmed message\(s\) on queue 'jobs' lost", log))
                    + len(re.findall(r"ERROR a paged-out message body cannot be read back", log)))
        assert len(missing) == reported, (sorted(missing), log[-3000:])
        if how == "truncate":
            assert missing, "a third of the segment cut off cost nothing"
        return
    lines = re.findall(r"ERROR index: damaged: .*? skipped \((.*?)\)", log)
    assert lines, f"no ERROR line for the damage:\n{log[-3000:]}"
    assert "torn tail" not in log
    if "records lost: unknown" not in lines:  # cut short: how many records were there is unknown
        lost = sum(int(line.split()[0]) for line in lines)
        assert len(missing) <= lost, (sorted(missing), log[-3000:])
    assert list((data / "quarantine").glob(f"*/index/{path.name}")), "the damaged file was not kept"


CASES = [(target, how) for target in ("older", "newest", "body")
         for how in ("truncate", "head", "middle", "tail")]


@pytest.mark.deadline(180)
@pytest.mark.parametrize(("target", "how"), CASES)
def test_damage_costs_only_the_damaged_records_and_is_reported(tmp_path: Path, target: str,
                                                                how: str) -> None:
    """Damage is skipped, not taken for a torn tail: what follows it is kept, what was lost is
    logged at ERROR, and an acked message that comes back is marked redelivered."""
    check_restart(tmp_path, target, how)


SOAK = [pytest.param(target, seed, marks=pytest.mark.soak)
        for target in ("older", "newest", "body") for seed in range(20)]


@pytest.mark.deadline(180)
@pytest.mark.parametrize(("target", "seed"), SOAK)
def test_damage_anywhere_in_a_file_is_reported_and_costs_only_what_it_hit(
        tmp_path: Path, target: str, seed: int) -> None:
    """As above, four bytes flipped at a random offset (`pytest -m soak`)."""
    check_restart(tmp_path, target, "random", random.Random(seed))
