"""Queues longer than memory (broker.paging): with --data-dir, persistent messages past a
worker's paging mark leave its arena and are read back from the body log when delivered, so a
durable queue three times the size of --arena-mb fills without the memory alarm and drains with
nothing lost, across a restart too (the restored bodies past the mark stay on disk)."""

from __future__ import annotations

from pathlib import Path

import pika
import pytest

from tests.integration.harness import finish, ready_count, start_broker, wait_until

PERSISTENT = pika.BasicProperties(delivery_mode=2)
COUNT = 12_000
BODY = 2000  # 12,000 x 2 kB: about three 8 MiB arenas' worth


def body(i: int) -> bytes:
    return b"%06d" % i + bytes([i % 251]) * (BODY - 6)


def args(tmp_path: Path) -> list[str]:
    return ["--data-dir", str(tmp_path / "data"), "--arena-mb", "8"]


def fill(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> None:
    channel.queue_declare(queue, durable=True)
    for i in range(COUNT):
        channel.basic_publish("", queue, body(i), PERSISTENT)
    wait_until(lambda: ready_count(channel, queue) == COUNT, 60, f"{COUNT} messages queued")


def drain(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> list[bytes]:
    """Every message, a consumer with prefetch 500 acking each hundredth (multiple)."""
    got: list[bytes] = []
    channel.basic_qos(prefetch_count=500)
    for method, _props, data in channel.consume(queue, inactivity_timeout=10):
        if method is None:
            break
        got.append(data)
        if len(got) % 100 == 0 or len(got) == COUNT:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if len(got) == COUNT:
            break
    channel.cancel()
    return got


@pytest.mark.deadline(180)
def test_a_durable_queue_three_arenas_long_fills_without_the_alarm_and_drains_whole(
        tmp_path: Path) -> None:
    broker = start_broker(tmp_path / "broker", workers=1, extra_args=args(tmp_path))
    try:
        channel = broker.connect().channel()
        fill(channel, "long")
        log = broker.log_tail()
        assert "persistent message bodies are paged out" in log
        assert "memory alarm set" not in log and "arena full" not in log
        got = drain(channel, "long")
        assert len(got) == COUNT and got == [body(i) for i in range(COUNT)]
        assert ready_count(channel, "long") == 0
        wait_until(lambda: "paging stopped" in broker.log_tail(), 10, "paging to stop")
    finally:
        finish(broker)


@pytest.mark.deadline(180)
def test_a_queue_longer_than_the_arenas_comes_back_after_a_restart(tmp_path: Path) -> None:
    first = start_broker(tmp_path / "first", workers=1, extra_args=args(tmp_path))
    try:
        fill(first.connect().channel(), "long")
    finally:
        finish(first)
    second = start_broker(tmp_path / "second", workers=1, extra_args=args(tmp_path))
    try:
        log = second.log_tail()
        assert f"restored {COUNT} persistent message(s)" in log
        paged = int(log.split(" paged out) from")[0].rsplit("; ", 1)[1])
        assert paged > COUNT // 2  # 8 MiB arena, paging mark 3.2 MiB: most stay on disk
        got = drain(second.connect().channel(), "long")
        assert len(got) == COUNT and got == [body(i) for i in range(COUNT)]
    finally:
        finish(second)
