"""Workers share one listening socket and balance accept() by open connections
(workers.balance): a client opening connections one after another gets them spread
over every worker, as it would get RabbitMQ's schedulers. Each test has its own broker."""

from __future__ import annotations

import collections
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from ipc.region import NOT_ACCEPTING, Region, region_name
from tests.integration.conftest import Broker, close_quietly, wait_until, worker_of


def _counts(broker: Broker) -> list[int]:
    """The open-connection count each worker publishes in its region's control block."""
    counts = []
    for index in range(broker.workers):
        with Region.attach(region_name(broker.instance, index)) as region:
            counts.append(region.connections)
    return counts


def _spread(connections: list) -> dict[int, int]:
    return dict(collections.Counter(worker_of(c) for c in connections))


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


def test_a_dead_worker_is_not_waited_for(broker: Broker, one_by_one: list) -> None:
    """A killed worker's count reads NOT_ACCEPTING until its replacement accepts again, and the
    survivor keeps taking connections meanwhile."""
    old_pid = broker.worker_pids[0]
    os.kill(old_pid, signal.SIGKILL)
    wait_until(lambda: _counts(broker)[0] == NOT_ACCEPTING or broker.worker_pids[0] != old_pid, 10,
               "the supervisor to mark worker 0 as not accepting")
    for _ in range(3):
        one_by_one.append(broker.connect())
    broker.wait_for_worker_replaced(0, old_pid)
    wait_until(lambda: _counts(broker)[0] != NOT_ACCEPTING, 10, "the replacement to accept")
    assert _counts(broker)[0] < NOT_ACCEPTING
    for _ in range(4):
        one_by_one.append(broker.connect())
    assert 0 in _spread(one_by_one[3:]), "the replacement took none of the new connections"
