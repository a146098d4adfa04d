"""Queues longer than memory (broker.storage.paging): with --data-dir, message bodies past a worker's
paging mark leave its arena for the body log (persistent ones are there already, transient ones
are written out first) and are read back when delivered, so a queue three times the size of
--arena-mb fills without the memory alarm and drains with nothing lost; a durable one across a
restart too (the restored bodies past the mark stay on disk)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pika
import pytest

from tests.integration.harness import finish, start_broker, wait_until
from tests.integration.pika_helpers import ready_count

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)
COUNT = 12_000
BODY = 2000  # 12,000 x 2 kB: about three 8 MiB arenas' worth


def body(i: int) -> bytes:
    return b"%06d" % i + bytes([i % 251]) * (BODY - 6)


def args(tmp_path: Path) -> list[str]:
    return ["--data-dir", str(tmp_path / "data"), "--arena-mb", "8"]


def fill(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str,
         properties: pika.BasicProperties = PERSISTENT, durable: bool = True) -> None:
    channel.queue_declare(queue, durable=durable)
    for i in range(COUNT):
        channel.basic_publish("", queue, body(i), properties)
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
@pytest.mark.parametrize(("properties", "durable"), [(PERSISTENT, True), (TRANSIENT, True),
                                                     (TRANSIENT, False)],
                         ids=["persistent", "transient-durable-queue", "transient"])
def test_a_queue_three_arenas_long_fills_without_the_alarm_and_drains_whole(
        tmp_path: Path, properties: pika.BasicProperties, durable: bool) -> None:
    broker = start_broker(tmp_path / "broker", workers=1, extra_args=args(tmp_path))
    try:
        channel = broker.connect().channel()
        fill(channel, "long", properties, durable)
        log = broker.log_tail()
        assert "message bodies are paged out" in log
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


@pytest.mark.deadline(180)
def test_transient_messages_paged_out_are_gone_after_a_restart_and_so_are_their_segments(
        tmp_path: Path) -> None:
    first = start_broker(tmp_path / "first", workers=1, extra_args=args(tmp_path))
    try:
        fill(first.connect().channel(), "long", TRANSIENT)
        assert "message bodies are paged out" in first.log_tail()
    finally:
        finish(first)
    segments = tmp_path / "data" / "bodies" / "w0"
    assert sum(p.stat().st_size for p in segments.iterdir()) > 8 << 20  # paged out: on disk
    second = start_broker(tmp_path / "second", workers=1, extra_args=args(tmp_path))
    try:
        assert ready_count(second.connect().channel(), "long") == 0
        assert sum(p.stat().st_size for p in segments.iterdir()) < 1 << 20
    finally:
        finish(second)


@pytest.mark.deadline(180)
@pytest.mark.parametrize("properties", [PERSISTENT, TRANSIENT], ids=["persistent", "transient"])
def test_a_publishing_worker_killed_after_paging_loses_nothing(
        tmp_path: Path, properties: pika.BasicProperties) -> None:
    """The worker whose arena was paged out is SIGKILLed and replaced: its arena (shared
    memory) and its body log segments outlive it, the page-outs it was asked for and never
    answered are let go of, and a consumer on the other worker gets every confirmed message
    whole and in order -- from the arena or read back from the dead worker's segments."""
    broker = start_broker(tmp_path / "broker", workers=2, extra_args=args(tmp_path))
    try:
        connections = broker.connections_on_workers([0, 1])
        publisher, consumer = connections[0], connections[1]
        channel = publisher.channel()
        channel.confirm_delivery()
        channel.queue_declare("long", durable=True)
        for i in range(COUNT):
            channel.basic_publish("", "long", body(i), properties)  # confirmed, one by one
        assert "message bodies are paged out" in broker.log_tail()
        old_pid = broker.worker_pids[0]
        os.kill(old_pid, signal.SIGKILL)
        assert broker.wait_for_worker_replaced(0, old_pid) != old_pid
        got = drain(consumer.channel(), "long")
        assert len(got) == COUNT and got == [body(i) for i in range(COUNT)]
    finally:
        finish(broker)
