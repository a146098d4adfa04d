"""Heartbeats over a real socket.

Note: this is the one integration test that idles on purpose (about 5 s). The heartbeat state
machine's timing is unit-tested in tests/workers with trio's autojump clock; this only checks
that a real client's negotiated heartbeat keeps an idle connection alive end to end.
"""

from __future__ import annotations

from tests.integration.harness import Broker

IDLE_SECONDS = 5.0


def test_heartbeat_negotiated(shared_broker: Broker) -> None:
    """A client asking for heartbeat=2 gets it, receives the broker's heartbeats and stays connected while idle."""
    connection = shared_broker.connect(heartbeat=2)
    assert connection._impl.params.heartbeat == 2  # pika stores the tune-ok value here
    received_before = connection._impl.bytes_received
    connection.sleep(IDLE_SECONDS)  # keeps pika's I/O loop (and its own heartbeats) running
    assert connection.is_open
    assert connection._impl.bytes_received > received_before, "no heartbeat frames from the broker while idle"
    channel = connection.channel()
    assert channel.queue_declare("", exclusive=True).method.queue
