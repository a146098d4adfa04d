"""Fixtures for the domain tests of queue arguments, dead-lettering and routing, and a real
supervisor over real regions (without worker processes) for the supervisor's own tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.messages.message import Message
from broker.queues.queue import Queue
from broker.runtime.supervisor import ServeConfig, Supervisor
from broker.topology.vhost import VirtualHost
from tests.broker.bounded_steps import K
from tests.broker.support import EPOCH, ME


@pytest.fixture
def dropped() -> list[Message]:
    """Messages whose bodies the domain handed back (on_drop), in order."""
    return []


@pytest.fixture
def vhost(dropped: list[Message]) -> VirtualHost:
    return VirtualHost("/", on_drop=dropped.append, epoch_offset=EPOCH)


@pytest.fixture
def dlq(vhost: VirtualHost) -> Queue:
    """A fanout dead-letter exchange 'dlx' feeding the queue 'dlq'."""
    vhost.declare_exchange("dlx", "fanout")
    q = vhost.declare_queue("dlq", owner=ME)
    vhost.bind_queue("dlq", "dlx", "", owner=ME)
    return q


@pytest.fixture
def sliced(vhost: VirtualHost) -> VirtualHost:
    """The virtual host letting go of K entries a step (the bounded-step tests)."""
    vhost.reap_slice = K
    vhost.advance(1.0)  # a new step: its budget is the smaller slice
    return vhost


@pytest.fixture
def supervisor() -> Iterator[Supervisor]:
    """A set-up supervisor with two workers' regions (4 MiB arenas, 64 KiB rings) and no
    worker processes; cleaned up after the test."""
    sup = Supervisor(ServeConfig(port=0, workers=2, arena_mb=4, ring_kb=64))
    sup.setup()
    yield sup
    sup.cleanup()
