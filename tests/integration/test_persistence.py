"""Persistent messages (delivery_mode 2) on durable queues survive a restart of
`shoal serve --data-dir DIR` -- clean or SIGKILL of the whole broker -- in their order,
redelivered if they had been delivered; acked ones do not come back; transient ones do not."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pika
import pytest

from tests.integration.harness import Broker, finish, kill_whole_broker, start_broker
from tests.integration.pika_helpers import drain_with_get

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)


def data_args(tmp_path: Path) -> list[str]:
    return ["--data-dir", str(tmp_path / "data")]


@pytest.mark.deadline(120)
def test_a_clean_restart_keeps_persistent_messages_in_order_and_marks_the_delivered(tmp_path: Path) -> None:
    first = start_broker(tmp_path / "first", extra_args=data_args(tmp_path))
    try:
        channel = first.connect().channel()
        channel.confirm_delivery()
        channel.queue_declare("jobs", durable=True)
        channel.queue_declare("scratch")  # transient queue
        for i in range(100):
            channel.basic_publish("", "jobs", b"p%d" % i, PERSISTENT)
            if i % 10 == 0:
                channel.basic_publish("", "jobs", b"t%d" % i, TRANSIENT)  # transient message
        channel.basic_publish("", "scratch", b"s", PERSISTENT)
        # The queue reads p0 t0 p1 .. p9 p10 t10 p11 ...: the first 30 are p0-p26 and t0, t10,
        # t20, acked (gone for good); the next 5, p27-p30 and t30, delivered and not acked.
        for _ in range(30):
            method, _props, _body = channel.basic_get("jobs")
            channel.basic_ack(method.delivery_tag)
        unacked = [channel.basic_get("jobs") for _ in range(5)]
        assert [body for _, _, body in unacked] == [b"p27", b"p28", b"p29", b"p30", b"t30"]
    finally:
        finish(first)
    second = start_broker(tmp_path / "second", extra_args=data_args(tmp_path))
    try:
        channel = second.connect().channel()
        got = drain_with_get(channel, "jobs", 100_000)
        # What was not acked, persistent only, in publish order; p27-p30 had been delivered.
        assert [body for body, _ in got] == [b"p%d" % i for i in range(27, 100)]
        assert [redelivered for _, redelivered in got] == [True] * 4 + [False] * 69
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            channel.queue_declare("scratch", passive=True)
        assert err.value.reply_code == 404
        assert "restored 73 persistent message(s)" in second.log_tail()
    finally:
        finish(second)


def publish_until_killed(broker: Broker, confirmed: list[int], stop: threading.Event) -> None:
    """A windowed-by-one confirm publisher (pika's BlockingChannel waits for each confirm):
    appends each number once its confirm arrived; stops when the broker goes away."""
    try:
        channel = broker.connect().channel()
        channel.confirm_delivery()
        i = 0
        while not stop.is_set() and i < 20_000:
            channel.basic_publish("", "jobs", b"%d" % i, PERSISTENT)
            confirmed.append(i)
            i += 1
    except (pika.exceptions.AMQPError, OSError):
        return


SOAK_SEEDS = [pytest.param(seed, marks=pytest.mark.soak) for seed in range(4, 54)]


@pytest.mark.deadline(180)
@pytest.mark.parametrize("seed", [1, 2, 3, *SOAK_SEEDS])  # 50 more: `pytest -m soak`
def test_every_confirmed_message_survives_a_sigkill_of_the_whole_broker(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    first = start_broker(tmp_path / "first", extra_args=data_args(tmp_path))
    try:
        first.connect().channel().queue_declare("jobs", durable=True)
        confirmed: list[int] = []
        stop = threading.Event()
        publisher = threading.Thread(target=publish_until_killed, args=(first, confirmed, stop))
        publisher.start()
        # Kill at a random moment: mostly while syncs are under way (bounded: 2.3 s).
        threading.Event().wait(0.3 + 2 * rng.random())
        kill_whole_broker(first)
        stop.set()
        publisher.join(30)
        assert not publisher.is_alive()
        second = start_broker(tmp_path / "second", extra_args=data_args(tmp_path))
        try:
            got = [int(body) for body, _ in drain_with_get(second.connect().channel(), "jobs", 100_000)]
            assert confirmed, "no confirm came back before the kill"
            missing = set(confirmed) - set(got)
            assert not missing, f"{len(missing)} confirmed message(s) lost, e.g. {sorted(missing)[:5]}"
            assert len(got) == len(set(got)), "a message came back twice"
            assert got == sorted(got), "not in publish order"
        finally:
            finish(second)
    finally:
        finish(first)


@pytest.mark.deadline(120)
def test_acked_messages_free_their_disk_and_a_deleted_queue_keeps_nothing(tmp_path: Path) -> None:
    first = start_broker(tmp_path / "first", extra_args=[*data_args(tmp_path)])
    try:
        channel = first.connect().channel()
        channel.confirm_delivery()
        channel.queue_declare("jobs", durable=True)
        channel.queue_declare("doomed", durable=True)
        body = b"x" * 4096
        for _ in range(200):
            channel.basic_publish("", "jobs", body, PERSISTENT)
            channel.basic_publish("", "doomed", body, PERSISTENT)
        assert len(drain_with_get(channel, "jobs", 100_000)) == 200
        channel.queue_delete("doomed")
        channel.queue_declare("doomed", durable=True)  # the same name again: empty
    finally:
        finish(first)
    second = start_broker(tmp_path / "second", extra_args=data_args(tmp_path))
    try:
        channel = second.connect().channel()
        assert drain_with_get(channel, "jobs", 100_000) == [] and drain_with_get(channel, "doomed", 100_000) == []
        assert "restored 0 persistent message(s)" in second.log_tail()
        # Nothing queued: no body segment on disk but the workers' current ones (empty).
        segments = list((tmp_path / "data" / "bodies").rglob("*.seg"))
        assert all(p.stat().st_size <= 8 for p in segments), [(p, p.stat().st_size) for p in segments]
    finally:
        finish(second)


@pytest.mark.deadline(120)
def test_a_committed_transaction_survives_a_sigkill(tmp_path: Path) -> None:
    """tx.commit-ok of persistent publishes means they are on disk (RabbitMQ's promise)."""
    first = start_broker(tmp_path / "first", extra_args=data_args(tmp_path))
    try:
        channel = first.connect().channel()
        channel.queue_declare("jobs", durable=True)
        channel.tx_select()
        for i in range(50):
            channel.basic_publish("", "jobs", b"c%d" % i, PERSISTENT)
        channel.tx_commit()
        channel.basic_publish("", "jobs", b"uncommitted", PERSISTENT)  # never committed
        kill_whole_broker(first)
        second = start_broker(tmp_path / "second", extra_args=data_args(tmp_path))
        try:
            got = drain_with_get(second.connect().channel(), "jobs", 100_000)
            assert [body for body, _ in got] == [b"c%d" % i for i in range(50)]
        finally:
            finish(second)
    finally:
        finish(first)


@pytest.mark.deadline(180)
def test_acks_and_deliveries_after_a_restart_hold_across_the_next_crash(tmp_path: Path) -> None:
    """A restart keeps the index files it read (broker.storage.message_store): what happens after it is
    recorded in a new file, and a start after a SIGKILL reads both -- acked messages stay gone,
    the rest come back in order, every one redelivered: after an unclean stop a delivery not
    yet recorded may have been lost, so each may have been delivered."""
    brokers: list[Broker] = []
    try:
        first = start_broker(tmp_path / "first", extra_args=data_args(tmp_path))
        brokers.append(first)
        channel = first.connect().channel()
        channel.confirm_delivery()
        channel.queue_declare("jobs", durable=True)
        for i in range(300):
            channel.basic_publish("", "jobs", b"%d" % i, PERSISTENT)
        kill_whole_broker(first)
        second = start_broker(tmp_path / "second", extra_args=data_args(tmp_path))
        brokers.append(second)
        channel = second.connect().channel()
        channel.confirm_delivery()
        for _ in range(100):
            method, _props, _body = channel.basic_get("jobs")
            channel.basic_ack(method.delivery_tag)
        delivered = [channel.basic_get("jobs") for _ in range(10)]
        assert [body for _, _, body in delivered] == [b"%d" % i for i in range(100, 110)]
        # A confirmed publish after them: its confirm waits for the index sync, which covers
        # the acks and deliveries recorded before it.
        channel.basic_publish("", "jobs", b"last", PERSISTENT)
        kill_whole_broker(second)
        third = start_broker(tmp_path / "third", extra_args=data_args(tmp_path))
        brokers.append(third)
        got = drain_with_get(third.connect().channel(), "jobs", 100_000)
        assert [body for body, _ in got] == [b"%d" % i for i in range(100, 300)] + [b"last"]
        assert [redelivered for _, redelivered in got] == [True] * 201
    finally:
        for broker in reversed(brokers):
            finish(broker)
