"""Process lifecycle: a killed worker, SIGTERM shutdown, a killed supervisor. Each test has its own broker."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pika.exceptions
import psutil
import pytest

from tests.integration.harness import Broker, finish, shm_segments, start_broker, wait_gone, wait_until
from tests.integration.pika_helpers import Names, drain_with_get, passive_declare_code, pump_until, ready_count


@pytest.mark.deadline(180)
def test_sigkilled_worker_is_replaced_and_nothing_is_lost(broker: Broker, names: Names) -> None:
    """A SIGKILLed worker is replaced on the same shared memory; its clients' unacked messages are requeued,
    its exclusive queues deleted, and other workers' clients carry on."""
    total, prefetch = 300, 50
    by_worker = broker.connections_on_workers([0, 1])
    victim, survivor = by_worker[0], by_worker[1]
    queue, owned = names("durable"), names("exclusive")

    # The bodies are published through the victim, so they sit in the victim's arena.
    publisher = victim.channel()
    publisher.confirm_delivery()
    publisher.queue_declare(queue, durable=True)
    publisher.queue_declare(owned, exclusive=True)
    expected = [f"m{i:04d}".encode() for i in range(total)]
    for body in expected:
        publisher.basic_publish("", queue, body)
    consumer = victim.channel()
    consumer.basic_qos(prefetch_count=prefetch)
    held: list[bytes] = []
    consumer.basic_consume(queue, on_message_callback=lambda ch, m, p, body: held.append(body))
    pump_until([victim], lambda: len(held) >= prefetch, what=f"{prefetch} unacked deliveries")

    old_pid = broker.worker_pids[0]
    old_process = psutil.Process(old_pid)
    os.kill(old_pid, signal.SIGKILL)
    new_pid = broker.wait_for_worker_replaced(0, old_pid)
    assert psutil.pid_exists(new_pid)
    assert not wait_gone([old_process], 5), "the killed worker is still running"

    # The other worker's client noticed nothing.
    side = survivor.channel()
    side.confirm_delivery()
    side_queue = side.queue_declare("", exclusive=True).method.queue
    side.basic_publish("", side_queue, b"still here")
    assert drain_with_get(side, side_queue, 1) == [(b"still here", False)]

    wait_until(lambda: passive_declare_code(survivor, owned) == 404, 10, "the dead connection's exclusive queue to go")
    wait_until(lambda: ready_count(side, queue) == total, 10, f"all {total} messages to be ready again")
    got = drain_with_get(side, queue, total)
    assert [body for body, _ in got] == expected, "messages lost, duplicated or moved from their positions"
    assert [body for body, redelivered in got if redelivered] == held

    # The replacement accepts connections and serves them.
    fresh = broker.connections_on_workers([0])[0]
    channel = fresh.channel()
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"via the replacement")
    assert drain_with_get(channel, queue, 1) == [(b"via the replacement", False)]


@pytest.mark.deadline(60)
def test_sigterm_shuts_down_cleanly(broker: Broker) -> None:
    """On SIGTERM every client gets connection.close 320 CONNECTION_FORCED, all broker processes exit 0 and
    /dev/shm is left clean."""
    connections = broker.connections_on_distinct_workers(2)
    for connection in connections:
        connection.channel().queue_declare("", exclusive=True)
    processes = broker.processes()
    assert len(processes) >= 3

    broker.signal_supervisor(signal.SIGTERM)
    codes: dict[int, int] = {}
    limit = time.monotonic() + 10
    while len(codes) < len(connections) and time.monotonic() < limit:
        for i, connection in enumerate(connections):
            if i in codes:
                continue
            try:
                connection.process_data_events(time_limit=0.05)
            except pika.exceptions.ConnectionClosedByBroker as exc:
                codes[i] = exc.reply_code
    assert codes == {i: 320 for i in range(len(connections))}

    assert broker.popen.wait(10) == 0
    assert not wait_gone(processes, 5), "broker processes left after SIGTERM"
    assert shm_segments(broker.instance) == []


@pytest.mark.deadline(90)
def test_supervisor_sigkill_takes_workers_down(broker: Broker, shared_broker: Broker, tmp_path: Path) -> None:
    """When the supervisor is SIGKILLed every worker exits, and the next start sweeps the dead instance's
    shared memory (and only its)."""
    workers = broker.worker_processes()
    assert len(workers) >= 2
    bystander_segments = shm_segments(shared_broker.instance)
    assert bystander_segments, "the running shared broker has no /dev/shm segments to protect"

    broker.signal_supervisor(signal.SIGKILL)
    broker.popen.wait(5)
    # Required: within a second. Tests never assert on wall time, so: they do exit.
    assert not wait_gone(workers, 5), "workers outlived their SIGKILLed supervisor"

    second = start_broker(tmp_path / "second")
    try:
        assert shm_segments(broker.instance) == [], "the dead instance's shared memory was not swept"
        assert shm_segments(shared_broker.instance) == bystander_segments, (
            "a live broker's shared memory was swept"
        )
        channel = shared_broker.connect().channel()
        assert channel.queue_declare("", exclusive=True).method.queue
        channel = second.connect().channel()
        assert channel.queue_declare("", exclusive=True).method.queue
    finally:
        finish(second)
