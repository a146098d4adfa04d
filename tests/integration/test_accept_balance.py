"""Workers share one listening socket and balance accept() by open connections
(workers.balance): a client opening connections one after another gets them spread
over every worker, as it would get RabbitMQ's schedulers; connections opened while a worker
starts or is being replaced wait for it instead of piling onto the workers already up.
Each test has its own broker. They run serial (alone, after the parallel run of make test): a
worker starved of CPU for ACCEPT_GRACE lets its peer take the connection, by design."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from ipc.region import NOT_ACCEPTING, Region, region_name, starting_deadline
from tests.integration.harness import (
    HOST,
    READY_TIMEOUT,
    Broker,
    close_quietly,
    finish,
    show_log_if_failed,
    start_broker,
    wait_until,
    worker_of,
)

# The tests check who takes the connections, not how fast Python starts a worker: a start grace
# far above any start-up time (about 0.5-1.5 s, more on a loaded machine) makes the outcome
# independent of the machine's load. The default is 2 s (`shoal serve --start-grace`).
GENEROUS_START_GRACE = ["--start-grace", "30"]
# A connection may wait in the listen backlog for a whole worker start-up.
PATIENT = {"socket_timeout": 30, "stack_timeout": 60}

pytestmark = pytest.mark.serial


def _counts(broker: Broker, instance: str = "") -> list[int]:
    """What each worker's region says: its open-connection count, NOT_ACCEPTING, or a
    starting mark (negative)."""
    counts = []
    for index in range(broker.workers):
        with Region.attach(region_name(instance or broker.instance, index)) as region:
            counts.append(region.connections)
    return counts


def _spread(connections: list) -> dict[int, int]:
    return dict(collections.Counter(worker_of(c) for c in connections))


def _open_together(broker: Broker, count: int, **overrides: Any) -> list:
    """`count` connections opened at once, as a fleet of clients reconnecting does."""
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: broker.connect(**overrides), range(count)))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _port_accepts(port: int) -> bool:
    """The supervisor listens before it starts any worker: connections then wait in the
    backlog. (This probe is accepted, seen closed and dropped by whichever worker comes up.)"""
    try:
        socket.create_connection((HOST, port), timeout=1).close()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _starting_broker(
    directory: Path, request: pytest.FixtureRequest, extra_args: list[str]
) -> Iterator[Broker]:
    """A broker whose port accepts while its workers are still starting (no ready file yet).

    The port is chosen here, so the test can connect before the ready file names it; if another
    process takes it first the broker exits, and a new port is tried."""
    for attempt in range(3):
        broker = Broker(directory / f"broker-{attempt}", extra_args=extra_args,
                        port=_free_port(), wait_ready=False)
        limit = time.monotonic() + READY_TIMEOUT
        while broker.popen.poll() is None and not _port_accepts(broker.port):
            assert time.monotonic() < limit, f"port {broker.port} not accepting\n{broker.log_tail()}"
            time.sleep(0.005)
        if broker.popen.poll() is None:
            break
        broker.stop()  # it exited (the port was taken): nothing of it left to check
    else:
        pytest.fail(f"`shoal serve` could not listen on a free port\n{broker.log_tail()}")
    try:
        yield broker
    finally:
        show_log_if_failed(request, broker)
        finish(broker)


@pytest.fixture
def patient_broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A ready broker whose workers wait for a replacement worker as long as it takes."""
    instance = start_broker(tmp_path / "broker", extra_args=GENEROUS_START_GRACE)
    try:
        yield instance
    finally:
        show_log_if_failed(request, instance)
        finish(instance)


@pytest.fixture
def one_by_one(broker: Broker) -> Iterator[list]:
    opened: list = []
    yield opened
    for connection in opened:
        close_quietly(connection)


def test_connections_opened_one_by_one_spread_over_the_workers(broker: Broker, one_by_one: list) -> None:
    """On an idle broker, sequential connections alternate between the workers instead of all
    landing on whichever worker the kernel wakes first."""
    assert broker.workers == 2
    for _ in range(8):
        one_by_one.append(broker.connect())
    spread = _spread(one_by_one)
    assert sorted(spread) == [0, 1], f"one worker took every connection: {spread}"
    assert min(spread.values()) >= 3, f"8 sequential connections spread {spread}, not about 4 and 4"
    assert sorted(_counts(broker)) == sorted(spread.values())


def test_a_burst_of_concurrent_connections_spreads_over_the_workers(broker: Broker, one_by_one: list) -> None:
    """Connections arriving together are not all taken by the worker that woke first."""
    with ThreadPoolExecutor(8) as pool:
        one_by_one.extend(pool.map(lambda _: broker.connect(), range(8)))
    spread = _spread(one_by_one)
    assert sorted(spread) == [0, 1], f"one worker took every connection: {spread}"
    assert min(spread.values()) >= 3, f"8 concurrent connections spread {spread}, not about 4 and 4"


def test_the_worker_with_fewest_connections_takes_the_next(broker: Broker, one_by_one: list) -> None:
    """Least connections, not round robin: after closing the connections on worker 0, the next
    ones go to worker 0 until it holds as many as worker 1."""
    for _ in range(8):
        one_by_one.append(broker.connect())
    on_zero = [c for c in one_by_one if worker_of(c) == 0]
    assert on_zero, f"no connection on worker 0: {_spread(one_by_one)}"
    for connection in on_zero:
        connection.close()
        one_by_one.remove(connection)
    left_on_one = len(one_by_one)
    wait_until(lambda: _counts(broker) == [0, left_on_one], 10, "worker 0 to count its connections closed")
    fresh = [broker.connect() for _ in range(left_on_one)]
    one_by_one.extend(fresh)
    assert [worker_of(c) for c in fresh] == [0] * left_on_one




# ---------------------------------------------------------------- workers starting or replaced


def test_connections_opened_while_the_workers_start_spread_over_them(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Connections opened as soon as the port accepts, before the workers are up, wait in the
    backlog; the first worker up takes one, then leaves the rest to its starting peer until it
    comes up, instead of taking all of them (a restarted broker's clients reconnecting)."""
    with _starting_broker(tmp_path, request, GENEROUS_START_GRACE) as broker:
        assert not broker.ready_file.exists(), "the workers were up before the clients connected"
        opened = _open_together(broker, 5, **PATIENT)
        spread = _spread(opened)
        assert sorted(spread) == [0, 1], f"one worker took every connection: {spread}"
        broker.await_ready()
        wait_until(lambda: sorted(_counts(broker)) == sorted(spread.values()), 10,
                   f"the workers to count {spread} (the probe connection closed)")


def test_connections_opened_while_a_killed_worker_is_replaced_spread_over_both(
    patient_broker: Broker,
) -> None:
    """A worker killed with SIGKILL: its region reads "starting" until the replacement accepts,
    and connections opened meanwhile wait for the replacement rather than all going to the
    survivor."""
    broker = patient_broker
    old_pid = broker.worker_pids[1]
    os.kill(old_pid, signal.SIGKILL)

    def noticed() -> bool:
        # The supervisor saw it die and marked its region starting (or, on a very slow
        # machine, the replacement is up already and the normal rule applies).
        return starting_deadline(_counts(broker)[1]) is not None or broker.worker_pids[1] != old_pid

    wait_until(noticed, 10, "the supervisor to mark worker 1 starting", interval=0.005)
    opened = _open_together(broker, 6, **PATIENT)
    spread = _spread(opened)
    assert sorted(spread) == [0, 1], f"the survivor took every connection: {spread}"
    assert broker.wait_for_worker_replaced(1, old_pid) != old_pid
    assert sorted(_counts(broker)) == sorted(spread.values())


def test_with_no_start_grace_a_dead_worker_is_not_waited_for(tmp_path: Path) -> None:
    """`--start-grace 0`: a killed worker's region reads NOT_ACCEPTING until its replacement
    accepts, the survivor keeps taking connections meanwhile, and the replacement then gets
    its share."""
    broker = start_broker(tmp_path / "broker", extra_args=["--start-grace", "0"])
    try:
        old_pid = broker.worker_pids[0]
        os.kill(old_pid, signal.SIGKILL)
        wait_until(lambda: _counts(broker)[0] == NOT_ACCEPTING or broker.worker_pids[0] != old_pid,
                   10, "the supervisor to mark worker 0 as not accepting")
        during = [broker.connect() for _ in range(3)]
        broker.wait_for_worker_replaced(0, old_pid)
        wait_until(lambda: 0 <= _counts(broker)[0] < NOT_ACCEPTING, 10, "the replacement to accept")
        after = [broker.connect() for _ in range(4)]
        assert 0 in _spread(after), "the replacement took none of the new connections"
        assert len(during) == 3
    finally:
        finish(broker)


def _worker_being_started(supervisor_pid: int, index: int) -> tuple[psutil.Process, str] | None:
    """Worker `index`'s process and the broker instance, from its command line (the ready file
    is not written while a worker starts)."""
    for child in psutil.Process(supervisor_pid).children():
        with contextlib.suppress(psutil.Error, ValueError):
            argv = child.cmdline()  # between fork and exec it is still the supervisor's
            if "workers.main" not in argv[:-1]:
                continue
            config = json.loads(argv[-1])
            if config["index"] == index:
                return child, config["instance"]
    return None


def test_a_worker_that_never_comes_up_holds_connections_back_for_the_start_grace_only(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Worker 1 is frozen (SIGSTOP) before it accepts: once its start grace (1 s here) has
    passed, worker 0 takes every connection (pika's 10 s handshake limit would fail them if it
    waited for worker 1 for ever). Thawed, worker 1 comes up and takes the next ones."""
    with _starting_broker(tmp_path, request, ["--start-grace", "1"]) as broker:
        found = wait_until(lambda: _worker_being_started(broker.pid, 1), 10, "worker 1 to be spawned",
                           interval=0.002)
        frozen, instance = found
        frozen.suspend()
        try:
            if starting_deadline(_counts(broker, instance)[1]) is None:
                pytest.skip("worker 1 was up before it could be frozen")  # never seen so far
            while_frozen = _open_together(broker, 3)
            assert _spread(while_frozen) == {0: 3}
        finally:
            frozen.resume()
        broker.await_ready()
        wait_until(lambda: _counts(broker)[1] == 0, 10, "worker 1 to accept")
        after = [broker.connect() for _ in range(2)]
        assert 1 in _spread(after), "worker 1 took none of the connections after it came up"
